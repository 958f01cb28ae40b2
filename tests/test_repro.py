"""Every row carries `repro`, the one command that re-runs its pair alone; `--case` selects exactly one case; the report shows them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.registry import ENV_VAR
from harness.cli.main import main
from harness.report import build_report
from harness.results.store import read_records
from harness.run.order import select_keys
from harness.run.repro import repro_command
from harness.suite.cases import grid
from harness.suite.catalog import Suite
from tests.cli_runs import PLUGIN, attnbench, refused, write_suite

ROOT = Path(__file__).resolve().parent.parent


def test_case_is_exact_where_only_is_a_substring():
    cases = grid(B=[1], S=[16], H=[2], d_k=[8], causal=[False, True], device="cpu")
    suite = Suite("s", "", tuple(cases))
    plain = next(c.id for c in cases if not c.causal)
    assert any(c.id.startswith(plain) and c.causal for c in cases)  # the plain id is a prefix of the causal one
    assert len(select_keys(suite.pairs(["naive"]), [plain], [], "s")) == 2  # --only catches both
    assert select_keys(suite.pairs(["naive", "sdpa"]), [], [plain], "s") == [f"{plain}-naive", f"{plain}-sdpa"]


def test_an_unknown_case_is_one_line(tmp_path, capsys):
    refused(capsys, ["run", "--suite", "quick", "--out", str(tmp_path), "--case", "B1-nosuch"], ["'B1-nosuch' is not a case of suite 'quick'"])


def test_repro_names_everything_that_changes_what_a_pair_records():
    manifest = {"device": "cuda", "timer": "kernels", "check": False, "profile": True, "traces": True, "energy": True,
                "python": "/opt/my venv/bin/python"}
    words = shlex.split(repro_command(manifest, "/runs/my run", "B1-Sq8", "sdpa-cudnn"))
    assert words[:4] == ["/opt/my venv/bin/python", "-m", "harness", "run"]  # the run's own interpreter, not whatever `python` is
    options = dict(zip(words[4::2], words[5::2]))
    assert options["--suite"] == "/runs/my run" and options["--case"] == "B1-Sq8" and options["--backends"] == "sdpa-cudnn"
    assert options["--device"] == "cuda" and options["--timer"] == "kernels"
    assert {"--no-check", "--profile", "--traces", "--energy"} <= set(words)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rows_repro_command_rerecords_that_pair_alone_from_a_fresh_shell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("ATTNBENCH_TEST_FAIL_S", "16")
    # Two cases, two backends that run, one with no CPU kernel (a worker's row) and one that kills its worker (the supervisor's row).
    suite = write_suite(tmp_path / "tiny.toml", ["naive", "sdpa-math", "sdpa-cudnn", "t-segv"], [8, 16])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path / "first"), "--run-id", "r", "--quiet"]) == 0
    rows = read_records(tmp_path / "first" / "r" / "records.jsonl").records
    assert len(rows) == 8 and all(r.get("repro") for r in rows)
    assert {r["status"] for r in rows if r["backend"] == "sdpa-cudnn"} == {"unsupported"}
    assert {(r["S_q"], r["status"]) for r in rows if r["backend"] == "t-segv"} == {(8, "ok"), (16, "crashed")}
    folder = str((tmp_path / "first" / "r").resolve())  # the row's own run folder: its manifest holds the pair's case
    assert all(shlex.split(r["repro"])[shlex.split(r["repro"]).index("--suite") + 1] == folder for r in rows)
    chosen = next(r for r in rows if r["backend"] == "sdpa-math")
    # A fresh shell: nothing of this process's environment but a system PATH (no venv on it: the command names its
    # interpreter) and PYTHONPATH (the checkout, which `-m harness` finds from the checkout's root).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    assert shlex.split(chosen["repro"])[0] == sys.executable
    again = tmp_path / "again"
    again.mkdir()
    done = subprocess.run(["sh", "-c", chosen["repro"]], cwd=again, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    # The repro names the row's own --out: the new run lies beside the row's, nothing under the shell's working folder.
    assert not any(again.iterdir())
    (new_dir,) = [d for d in (tmp_path / "first").iterdir() if d.name != "r"]
    (row,) = read_records(new_dir / "records.jsonl").records
    assert (row["case_id"], row["backend"], row["timer"], row["status"]) == (chosen["case_id"], chosen["backend"], chosen["timer"], "ok")
    assert json.loads((new_dir / "manifest.json").read_text())["pairs"] == [f"{chosen['case_id']}-{chosen['backend']}"]
    # The report prints the commands beside the winners.
    html = Path(build_report([tmp_path / "first" / "r"], out_root=tmp_path / "reports")).read_text()
    import html as html_text

    command_start = f"<pre><code>{html_text.escape(shlex.quote(sys.executable))} -m harness run --suite"
    # One per winner, then the three failures. A case whose rows were all contended (a busy machine) has no winner.
    from harness import analysis

    wins = analysis.winners(analysis.load([tmp_path / "first" / "r"]).frame)
    assert len(wins) <= 2 and html.count(command_start) == len(wins) + 3
    assert "--backends t-segv" in html and "t-segv (crashed)" in html


_BUILTIN = """from harness.measure.timing import Budget
from harness.suite.cases import grid
from harness.suite.catalog import Suite

SUITE = Suite("edited", "a built-in suite a test edits", tuple(grid(B=[1], S=[{seq}], H=[2], d_k=[16])), ("naive",),
              Budget(warmup_s=0.0, measure_s=0.01, min_rounds=1, max_rounds=2))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_repro_rerecords_its_pair_after_the_builtin_suite_it_came_from_changed(tmp_path):
    """The pair is rebuilt from the row's own case (its run folder's manifest), not from the suite's code of today."""
    package = tmp_path / "packages" / "suites"  # a `suites` package of built-in suites, ahead of the checkout's on the path
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "edited.py").write_text(_BUILTIN.format(seq=8))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": f"{package.parent}{os.pathsep}{ROOT}"}
    first = attnbench(["run", "--suite", "edited", "--device", "cpu", "--out", tmp_path / "runs", "--run-id", "r", "--quiet"], env,
                      timeout_s=200, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (row,) = read_records(tmp_path / "runs" / "r").records
    assert row["S_q"] == 8 and row["status"] == "ok"
    (package / "edited.py").write_text(_BUILTIN.format(seq=32))  # a release changed the suite: its case is S=32 now
    again = tmp_path / "again"
    again.mkdir()
    done = subprocess.run(["sh", "-c", row["repro"]], cwd=again, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    (new_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.name != "r"]
    (new,) = read_records(new_dir).records
    assert (new["case_id"], new["backend"], new["S_q"], new["status"]) == (row["case_id"], "naive", 8, "ok")
    assert json.loads((new_dir / "manifest.json").read_text())["budget"] == json.loads((tmp_path / "runs" / "r" / "manifest.json").read_text())["budget"]
