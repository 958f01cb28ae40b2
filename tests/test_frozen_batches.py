"""A run freezes the lengths files its cases were drawn from: a row's repro rebuilds its case after the file changed or
went, and a run folder whose frozen copy is gone says why in one line."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from tests.cli_runs import attnbench_in_process, refused, rows, write_suite

LENGTHS = "5 3\n12 1\n"
GRID = ['batch = ["4xfile:lengths.txt", "2x3@file:data/kv.txt"]', 'layout = ["packed"]', "H = [2]", "d_k = [8]"]

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(120)]


def first_run(tmp_path: Path, capsys) -> tuple[Path, list[dict]]:
    """A run of a suite whose batches come from two lengths files beside it (one in a subfolder); its folder and rows."""
    user = tmp_path / "user"
    suite = write_suite(user / "mine.toml", ["naive"], grid=GRID)
    (user / "lengths.txt").write_text(LENGTHS)
    (user / "data").mkdir()
    (user / "data" / "kv.txt").write_text("# a cache\n40 2\n64\n")
    ran = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path / "runs", "--run-id", "r0", "--device", "cpu", "--quiet"], capsys)
    assert ran.code == 0, ran.err
    return tmp_path / "runs" / "r0", rows(tmp_path / "runs" / "r0")


def repro_argv(row: dict, out: Path, run_id: str) -> list[str]:
    """A row's repro command as the CLI's argv, its new run folder named."""
    words = shlex.split(row["repro"])
    return [*words[words.index("harness") + 1:], "--out", str(out), "--run-id", run_id, "--quiet"]


def frozen(run_dir: Path) -> dict[str, str]:
    """The run's frozen lengths files: the name its cases give → the SHA-256 of the copy in its folder (checked against the manifest)."""
    entries = json.loads((run_dir / "manifest.json").read_text())["batches"]
    for entry in entries:
        assert hashlib.sha256((run_dir / "batches" / entry["copy"]).read_bytes()).hexdigest() == entry["sha256"]
    return {entry["file"]: entry["sha256"] for entry in entries}


@pytest.mark.slow
@pytest.mark.parametrize("change", ["edited", "deleted"])
def test_a_repro_rebuilds_its_case_after_the_lengths_file_changed(tmp_path, capsys, change):
    run_dir, first = first_run(tmp_path, capsys)
    sums = frozen(run_dir)
    assert sums == {"lengths.txt": hashlib.sha256(LENGTHS.encode()).hexdigest(), "data/kv.txt": sums["data/kv.txt"]}
    lengths = tmp_path / "user" / "lengths.txt"
    lengths.write_text("7 1\n900 1\n") if change == "edited" else lengths.unlink()
    row = next(r for r in first if "lengths.txt" in r["case_id"])
    ran = attnbench_in_process(repro_argv(row, tmp_path / "again", "r1"), capsys)
    assert ran.code == 0, ran.err
    (again,) = rows(tmp_path / "again" / "r1")
    assert (again["case_id"], again["seq_lens_q"], again["status"]) == (row["case_id"], row["seq_lens_q"], "ok")
    assert frozen(tmp_path / "again" / "r1") == {"lengths.txt": sums["lengths.txt"]}  # the repro's own folder holds the copy it ran
    # A repro of the repro, the lengths file still changed or gone: its frozen copy stands in.
    ran = attnbench_in_process(repro_argv(again, tmp_path / "again", "r2"), capsys)
    assert ran.code == 0, ran.err
    assert rows(tmp_path / "again" / "r2")[0]["case_id"] == row["case_id"]


@pytest.mark.slow
@pytest.mark.parametrize("change, words", [
    ("edited", ["has changed since the run", "sha256", "then", "now", "frozen copy batches/", "is missing"]),
    ("deleted", ["frozen copy batches/", "is missing", "is gone too"]),
])
def test_a_run_folder_whose_frozen_copy_is_gone_says_why_in_one_line(tmp_path, capsys, change, words):
    run_dir, first = first_run(tmp_path, capsys)
    sha = frozen(run_dir)["lengths.txt"]
    (copy,) = (run_dir / "batches").glob(f"{sha[:12]}-lengths.txt")
    copy.unlink()
    lengths = tmp_path / "user" / "lengths.txt"
    row = next(r for r in first if "lengths.txt" in r["case_id"])
    # The file still as it was: the run reads it instead of the copy.
    assert attnbench_in_process(repro_argv(row, tmp_path / "again", "r1"), capsys).code == 0
    lengths.write_text("7 1\n") if change == "edited" else lengths.unlink()
    err = refused(capsys, repro_argv(row, tmp_path / "again", "r2"), [*words, str(lengths), row["case_id"]])
    assert "is not a case of suite" not in err
    if change == "edited":
        assert f"{sha[:12]}… then, {hashlib.sha256(b'7 1' + bytes([10])).hexdigest()[:12]}… now" in err
    assert not (tmp_path / "again" / "r2").exists()


@pytest.mark.e2e
def test_force_replaces_a_run_folder_holding_frozen_lengths_files(tmp_path, capsys):
    run_dir, _ = first_run(tmp_path, capsys)
    assert (run_dir / "batches").is_dir()
    suite = tmp_path / "user" / "mine.toml"
    ran = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path / "runs", "--run-id", "r0", "--device", "cpu", "--quiet",
                                "--force", "--case", rows(run_dir)[0]["case_id"]], capsys)
    assert ran.code == 0, ran.err
    assert len(rows(run_dir)) == 1 and len(frozen(run_dir)) == 1  # only the files of the cases it ran
