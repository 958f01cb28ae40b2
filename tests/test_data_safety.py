"""Nothing a user types destroys data: --force replaces only a run's own folder, reports and comparisons never
write into a run folder or over a file attnbench did not write, and no write follows a symbolic link.

Each row builds a tree under tmp_path, runs the CLI in process and expects exit 2 with one line naming
the problem, and every file that was there before exactly as it was (hashed before and after).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from harness.cli.main import main
from tests.cli_runs import refused
from tests.run_folders import make_run, snapshot, tiny_suite


def _run_args(tmp: Path, run_id: str, suite: Path | None = None) -> list[str]:
    suite = suite or tiny_suite(tmp / "suites" / "tiny.toml")
    return ["run", "--suite", str(suite), "--out", str(tmp / "out"), "--run-id", run_id, "--force", "--quiet"]


def force_web_app(tmp: Path) -> list[str]:
    """Someone's web app whose manifest.json is a web-app manifest."""
    app = tmp / "out" / "app"
    app.mkdir(parents=True)
    (app / "manifest.json").write_text(json.dumps({"name": "My App", "start_url": "/", "icons": [{"src": "i.png"}]}))
    (app / "index.html").write_text("<html>the app</html>")
    return _run_args(tmp, "app")


def force_manifest_a_list(tmp: Path) -> list[str]:
    (tmp / "out" / "r1").mkdir(parents=True)
    (tmp / "out" / "r1" / "manifest.json").write_text('["a", "b"]')
    return _run_args(tmp, "r1")


def force_manifest_of_another_tool(tmp: Path) -> list[str]:
    """A manifest shaped like a run's, but another tool's marker."""
    run = make_run(tmp / "out" / "r1")
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "harness": "otherbench"}))
    return _run_args(tmp, "r1")


def force_run_with_a_foreign_file(tmp: Path) -> list[str]:
    run = make_run(tmp / "out" / "r1")
    (run / "notes.md").write_text("my notes about this run")
    return _run_args(tmp, "r1")


def force_manifest_of_another_run(tmp: Path) -> list[str]:
    """A run folder copied under another name: its manifest is another run's."""
    make_run(tmp / "out" / "r0")
    os.rename(tmp / "out" / "r0", tmp / "out" / "r1")
    return _run_args(tmp, "r1")


def force_suite_inside_the_run(tmp: Path) -> list[str]:
    make_run(tmp / "out" / "r1")
    return _run_args(tmp, "r1", suite=tmp / "out" / "r1" / "suite.toml")


def force_run_folder_is_a_link(tmp: Path) -> list[str]:
    make_run(tmp / "elsewhere" / "r1")
    (tmp / "out").mkdir()
    (tmp / "out" / "r1").symlink_to(tmp / "elsewhere" / "r1")
    return _run_args(tmp, "r1")


def force_with_a_lock_file_a_link(tmp: Path) -> list[str]:
    run = make_run(tmp / "out" / "r1")
    (tmp / "elsewhere.txt").write_text("someone's file")
    (run / "supervisor.lock").symlink_to(tmp / "elsewhere.txt")
    return _run_args(tmp, "r1")


def report_into_the_runs_parent(tmp: Path) -> list[str]:
    make_run(tmp / "rp" / "r1")
    return ["report", str(tmp / "rp" / "r1"), "--out", str(tmp / "rp")]


def report_into_the_run_itself(tmp: Path) -> list[str]:
    make_run(tmp / "rp" / "r1")
    return ["report", str(tmp / "rp" / "r1"), "--out", str(tmp / "rp" / "r1")]


def report_into_another_run(tmp: Path) -> list[str]:
    make_run(tmp / "a")
    make_run(tmp / "b")
    return ["report", str(tmp / "a"), "--out", str(tmp / "b" / "sub")]


def report_over_a_foreign_folder(tmp: Path) -> list[str]:
    """--out docs where docs/r1 is the user's own folder of CSVs (a report would delete them as stale)."""
    make_run(tmp / "results" / "r1")
    (tmp / "docs" / "r1").mkdir(parents=True)
    (tmp / "docs" / "r1" / "budget.csv").write_text("item,cost\nrent,900\n")
    return ["report", str(tmp / "results" / "r1"), "--out", str(tmp / "docs")]


def compare_over_the_new_records(tmp: Path) -> list[str]:
    make_run(tmp / "base")
    make_run(tmp / "new")
    return ["compare", str(tmp / "base"), str(tmp / "new"), "--out", str(tmp / "new" / "records.jsonl")]


def compare_into_the_base_run(tmp: Path) -> list[str]:
    make_run(tmp / "base")
    make_run(tmp / "new")
    return ["compare", str(tmp / "base"), str(tmp / "new"), "--out", str(tmp / "base" / "cmp.csv")]


def compare_over_a_users_file(tmp: Path) -> list[str]:
    make_run(tmp / "base")
    make_run(tmp / "new")
    (tmp / "notes.csv").write_text("name,phone\nann,555\n")
    return ["compare", str(tmp / "base"), str(tmp / "new"), "--out", str(tmp / "notes.csv")]


def compare_through_a_link(tmp: Path) -> list[str]:
    make_run(tmp / "base")
    make_run(tmp / "new")
    (tmp / "precious.txt").write_text("do not overwrite")
    (tmp / "cmp.csv").symlink_to(tmp / "precious.txt")
    return ["compare", str(tmp / "base"), str(tmp / "new"), "--out", str(tmp / "cmp.csv")]


def _resume_with_link(name: str):
    def setup(tmp: Path) -> list[str]:
        run = make_run(tmp / "r1")
        outside = tmp / "outside" / f"unrelated-{name}"
        outside.parent.mkdir()
        outside.write_bytes((run / name).read_bytes() if (run / name).exists() else b"someone else's file\n")
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(outside)
        return ["run", "--resume", str(run), "--quiet"]
    setup.__name__ = f"resume_with_{name}_a_link"
    return setup


CASES = [
    (force_web_app, ["--force refuses to delete", "manifest.json", "'run_id' is missing"]),
    (force_manifest_a_list, ["--force refuses to delete", "expected a JSON object, got a list"]),
    (force_manifest_of_another_tool, ["--force refuses to delete", "'otherbench'"]),
    (force_run_with_a_foreign_file, ["--force refuses to delete", "'notes.md'", "not a file a run writes"]),
    (force_manifest_of_another_run, ["--force refuses to delete", "run 'r0'"]),
    (force_suite_inside_the_run, ["--force refuses to delete", "suite file", "inside it"]),
    (force_run_folder_is_a_link, ["is a symbolic link"]),
    (force_with_a_lock_file_a_link, ["supervisor.lock", "is a symbolic link"]),
    (report_into_the_runs_parent, ["inside the run folder"]),
    (report_into_the_run_itself, ["inside the run folder"]),
    (report_into_another_run, ["inside the run folder", "/b"]),
    (report_over_a_foreign_folder, ["not an attnbench report"]),
    (compare_over_the_new_records, ["inside the run folder"]),
    (compare_into_the_base_run, ["inside the run folder"]),
    (compare_over_a_users_file, ["notes.csv", "not a comparison attnbench wrote"]),
    (compare_through_a_link, ["cmp.csv", "not a plain file"]),
    *[(_resume_with_link(name), [name, "is a symbolic link"])
      for name in ("records.csv", "env.json", "records.jsonl", "peaks.json", "manifest.json", "pending.txt")],
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setup, words", CASES, ids=[c[0].__name__ for c in CASES])
def test_nothing_is_destroyed_or_written_outside(tmp_path, capsys, setup, words):
    argv = setup(tmp_path)
    before = snapshot(tmp_path)
    refused(capsys, argv, words)
    after = snapshot(tmp_path)
    assert {k: after.get(k) for k in before} == before


@pytest.mark.slow
def test_force_replaces_a_runs_own_folder_and_keeps_only_its_locks(tmp_path, capsys):
    """The other side of the table: a genuine run folder (even one of an older version, without the marker) is replaced."""
    run = make_run(tmp_path / "out" / "r1")
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["harness"], manifest["run_uuid"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "worker-0.log").write_text("old log")
    (run / "claims").mkdir()
    argv = _run_args(tmp_path, "r1")
    code = main(argv + ["--only", "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32-naive", "--no-check"])
    assert code == 0, capsys.readouterr().err
    fresh = json.loads((run / "manifest.json").read_text())
    assert fresh["harness"] == "attnbench" and len(fresh["run_uuid"]) == 32 and fresh["pairs"] == ["B1-Sq16-Skv16-H2-Hkv2-dk16-fp32-naive"]
    assert not (run / "worker-0.log").read_text() == "old log"
    assert [r["backend"] for r in read_records(run).records] == ["naive"]


def test_an_empty_run_id_is_refused_not_replaced_by_the_default(tmp_path, capsys):
    suite = tiny_suite(tmp_path / "tiny.toml")
    refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--run-id", "", "--quiet"], ["invalid run id ''"])
    assert not (tmp_path / "out").exists()
