"""Running the attnbench CLI as a user would, in a subprocess, on tiny TOML suites, with the failing test backends loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from harness.backends.registry import ENV_VAR
from harness.results.store import read_records

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "tests.failing_backends:add_all"
TINY_BUDGET = "[budget]\nwarmup_s = 0.001\nmeasure_s = 0.01\nmin_rounds = 2\n"


def write_suite(path: Path, backends: list[str], sizes: list[int]) -> Path:
    """A tiny TOML suite: B=1, H=2, d_k=16, one case per S in `sizes`."""
    path.write_text(f'name = "{path.stem}"\nbackends = {json.dumps(backends)}\n{TINY_BUDGET}'
                    f"[[grid]]\nB = 1\nS = {json.dumps(sizes)}\nH = 2\nd_k = 16\n")
    return path


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI run that loads the failing backends and logs their executions."""
    env = {**os.environ, ENV_VAR: PLUGIN, "ATTNBENCH_TEST_LOG": str(tmp_path / "executions.log"), "PYTHONPATH": str(ROOT)}
    env.pop("ATTNBENCH_TEST_RENDEZVOUS", None)
    return {**env, **extra}


def attnbench(args: list[str], env: dict[str, str], timeout_s: float = 240, **kwargs) -> subprocess.CompletedProcess:
    """Run the CLI to its end (at most `timeout_s`)."""
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          **kwargs)


def attnbench_in_process(args: list[str], env: dict[str, str], monkeypatch) -> int:
    """Run the CLI's supervisor in this process under exactly `env` (its workers are still subprocesses): its exit status.

    For runs that only make a run folder for the test: a subprocess would import torch once more (seconds) for nothing under test.
    """
    from harness.cli.main import main

    for name in set(os.environ) - set(env):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return main(args)


def rows(run_dir: Path) -> list[dict]:
    """The records of a run."""
    return read_records(run_dir).records


def keys(records: list[dict]) -> list[str]:
    """Pair keys of records, in file order."""
    return [f"{r['case_id']}-{r['backend']}" for r in records]


def executions(tmp_path: Path) -> Counter:
    """How often each pair's prepare() really ran, from the failing backends' log."""
    path = tmp_path / "executions.log"
    return Counter(line.split()[0] for line in path.read_text().splitlines()) if path.exists() else Counter()


def is_dead(pid: int) -> bool:
    """True when the process is gone or a zombie (killed, not yet reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in status
