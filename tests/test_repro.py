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
from tests.cli_runs import PLUGIN, TINY_BUDGET

ROOT = Path(__file__).resolve().parent.parent


def test_case_is_exact_where_only_is_a_substring():
    cases = grid(B=[1], S=[16], H=[2], d_k=[8], causal=[False, True], device="cpu")
    suite = Suite("s", "", tuple(cases))
    plain = next(c.id for c in cases if not c.causal)
    assert any(c.id.startswith(plain) and c.causal for c in cases)  # the plain id is a prefix of the causal one
    assert len(select_keys(suite.pairs(["naive"]), [plain], [], "s")) == 2  # --only catches both
    assert select_keys(suite.pairs(["naive", "sdpa"]), [], [plain], "s") == [f"{plain}-naive", f"{plain}-sdpa"]


def test_an_unknown_case_is_one_line(tmp_path, capsys):
    assert main(["run", "--suite", "quick", "--out", str(tmp_path), "--case", "B1-nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'B1-nosuch' is not a case of suite 'quick'" in err


def test_repro_names_everything_that_changes_what_a_pair_records():
    manifest = {"device": "cuda", "timer": "kernels", "check": False, "profile": True, "traces": True, "energy": True,
                "python": "/opt/my venv/bin/python"}
    words = shlex.split(repro_command(manifest, "/runs/my run/suite.toml", "B1-Sq8", "sdpa-cudnn"))
    assert words[:4] == ["/opt/my venv/bin/python", "-m", "harness", "run"]  # the run's own interpreter, not whatever `python` is
    options = dict(zip(words[4::2], words[5::2]))
    assert options["--suite"] == "/runs/my run/suite.toml" and options["--case"] == "B1-Sq8" and options["--backends"] == "sdpa-cudnn"
    assert options["--device"] == "cuda" and options["--timer"] == "kernels"
    assert {"--no-check", "--profile", "--traces", "--energy"} <= set(words)


def _suite_file(path: Path) -> Path:
    # Two cases, two backends that run, one with no CPU kernel (a worker's row) and one that kills its worker (the supervisor's row).
    path.write_text(f'name = "{path.stem}"\nbackends = ["naive", "sdpa-math", "sdpa-cudnn", "t-segv"]\n{TINY_BUDGET}[[grid]]\nB = 1\nS = [8, 16]\nH = 2\nd_k = 16\n')
    return path


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rows_repro_command_rerecords_that_pair_alone_from_a_fresh_shell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("ATTNBENCH_TEST_FAIL_S", "16")
    suite = _suite_file(tmp_path / "tiny.toml")
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path / "first"), "--run-id", "r", "--quiet"]) == 0
    rows = read_records(tmp_path / "first" / "r" / "records.jsonl").records
    assert len(rows) == 8 and all(r.get("repro") for r in rows)
    assert {r["status"] for r in rows if r["backend"] == "sdpa-cudnn"} == {"unsupported"}
    assert {(r["S_q"], r["status"]) for r in rows if r["backend"] == "t-segv"} == {(8, "ok"), (16, "crashed")}
    frozen = str((tmp_path / "first" / "r" / "suite.toml").resolve())
    assert all(shlex.split(r["repro"])[shlex.split(r["repro"]).index("--suite") + 1] == frozen for r in rows)
    chosen = next(r for r in rows if r["backend"] == "sdpa-math")
    # A fresh shell: nothing of this process's environment but a system PATH (no venv on it: the command names its
    # interpreter) and PYTHONPATH (the checkout, which `-m harness` finds from the checkout's root).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    assert shlex.split(chosen["repro"])[0] == sys.executable
    again = tmp_path / "again"
    again.mkdir()
    done = subprocess.run(["sh", "-c", chosen["repro"]], cwd=again, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    (new_dir,) = list((again / "results").iterdir())
    (row,) = read_records(new_dir / "records.jsonl").records
    assert (row["case_id"], row["backend"], row["timer"], row["status"]) == (chosen["case_id"], chosen["backend"], chosen["timer"], "ok")
    assert json.loads((new_dir / "manifest.json").read_text())["pairs"] == [f"{chosen['case_id']}-{chosen['backend']}"]
    # The report prints the commands beside the winners.
    html = Path(build_report([tmp_path / "first" / "r"], out_root=tmp_path / "reports")).read_text()
    import html as html_text

    command_start = f"<pre><code>{html_text.escape(shlex.quote(sys.executable))} -m harness run --suite"
    assert html.count(command_start) == 2 + 3  # the two winners, then the three failures
    assert "--backends t-segv" in html and "t-segv (crashed)" in html
