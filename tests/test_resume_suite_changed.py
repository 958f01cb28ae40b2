"""A run folder describes itself: `--resume` finishes a run from its manifest alone, after its built-in suite changed.

Workers are subprocesses that import the `suites` package from the checkout, so the suite is changed for
real: in a copy of this checkout, a built-in suite is run and interrupted part-way, its module is edited
(another grid, another budget), and `--resume` must finish exactly the original pairs under the original budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from tests.checkout import copy_checkout

SUITE_MODULE = '''
from harness.measure.timing import Budget
from harness.suite.cases import grid
from harness.suite.catalog import Suite

SUITE = Suite(
    name="tiny_resume",
    description="three small cases, a budget long enough to interrupt between pairs",
    cases=tuple(grid(B=[1], S={seqs}, H=[2], d_k=[8], dtype=["fp32"])),
    backends=("naive", "sdpa"),
    budget=Budget(warmup_s=0.01, measure_s={measure_s}, min_rounds=6, max_rounds={max_rounds}, precision=0.0),
)
'''

#: The edited suite's sample cap: a resumed row with more samples was measured under the run's own budget.
EDITED_MAX_ROUNDS = 7


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_resume_after_the_builtin_suite_changed_finishes_the_original_pairs(tmp_path):
    repo = tmp_path / "repo"
    copy_checkout(repo)
    module = repo / "suites" / "tiny_resume.py"
    module.write_text(SUITE_MODULE.format(seqs=[16, 32, 48], measure_s=0.3, max_rounds=500))
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    run_dir = repo / "results" / "r"
    command = [sys.executable, "-m", "harness", "run", "--suite", "tiny-resume", "--device", "cpu", "--out", "results", "--run-id", "r"]

    # A terminal's Ctrl-C reaches a process whose SIGINT is not ignored; a shell's background job (`make test &`)
    # starts with it ignored, and Python then keeps ignoring it, so the child is given the default back.
    first = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 150
    while _lines(run_dir / "records.jsonl") < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)  # Ctrl-C between pairs: the finished rows stay, the rest is pending
    output, _ = first.communicate(timeout=60)
    assert first.returncode != 0, output[-2000:]
    done_before = _lines(run_dir / "records.jsonl")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["pairs"]) == 6 and 1 <= done_before < 6, (done_before, output[-2000:])

    # A release changes the suite: other sequence lengths, a budget a thirtieth as long that stops at 7 samples.
    module.write_text(SUITE_MODULE.format(seqs=[64, 128], measure_s=0.01, max_rounds=EDITED_MAX_ROUNDS))
    for cache in (repo / "suites" / "__pycache__").glob("tiny_resume*"):
        cache.unlink()

    resumed = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", str(run_dir)], cwd=repo, env=env,
                             capture_output=True, text=True, timeout=150)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    rows = read_records(run_dir).records
    assert sorted(f"{r['case_id']}-{r['backend']}" for r in rows) == sorted(manifest["pairs"])
    assert {r["status"] for r in rows} == {"ok"}, [(r["case_id"], r["backend"], r["reason"]) for r in rows]
    assert {(r["S_q"], r["S_kv"], r["H"], r["d_k"]) for r in rows} == {(16, 16, 2, 8), (32, 32, 2, 8), (48, 48, 2, 8)}
    # The resumed pairs were measured under the run's own budget, not the edited suite's: a count, not a time, says so
    # (on a busy machine the run's 500-sample cap can end a 0.3 s budget well before 0.3 s).
    resumed_rows = rows[done_before:]
    assert resumed_rows and all(r["samples"] > EDITED_MAX_ROUNDS for r in resumed_rows), [(r["samples"], r["stopped_by"]) for r in resumed_rows]
