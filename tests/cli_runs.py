"""Running the attnbench CLI as a user would, on tiny TOML suites, with the failing test backends loaded.

The tests' one home for each of these jobs (tests/test_helpers_once.py keeps test modules from growing their own copies):
`write_suite` writes a TOML suite file; `attnbench` runs the CLI in a subprocess; `attnbench_in_process` runs
`harness.cli.main.main` in this process, capturing what it printed; `assert_one_line_error` checks a refusal (exit 2,
one `attnbench: error:` line, no traceback), and `refused` is the last two together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from harness.backends.registry import ENV_VAR
from harness.results.store import read_records

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "tests.failing_backends:add_all"
TINY_BUDGET = "[budget]\nwarmup_s = 0.001\nmeasure_s = 0.01\nmin_rounds = 2\n"
ERROR = "attnbench: error: "


def write_suite(path: Path, backends: list[str] | None = None, sizes: list[int] | None = None, *, name: str | None = None,
                grid: list[str] | None = None, budget: str = TINY_BUDGET) -> Path:
    """A TOML suite file at `path` (its folder made), named `name` (default: the file's stem).

    By default a tiny suite: `backends`, the tiny budget and one grid of B=1, H=2, d_k=16 with one case per S in `sizes`.
    `grid` (TOML lines) is the grid instead; `budget=""` and `backends=None` leave budget and backends to the suite defaults.
    """
    if grid is None:
        grid = ["B = 1", f"S = {json.dumps(sizes)}", "H = 2", "d_k = 16"]
    chosen = "" if backends is None else f"backends = {json.dumps(backends)}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'name = "{path.stem if name is None else name}"\n{chosen}{budget}[[grid]]\n' + "\n".join(grid) + "\n")
    return path


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI run that loads the failing backends and logs their executions."""
    env = {**os.environ, ENV_VAR: PLUGIN, "ATTNBENCH_TEST_LOG": str(tmp_path / "executions.log"), "PYTHONPATH": str(ROOT)}
    env.pop("ATTNBENCH_TEST_RENDEZVOUS", None)
    return {**env, **extra}


def attnbench(args: list, env: dict[str, str] | None = None, timeout_s: float = 240, *, cwd: Path = ROOT,
              **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m harness ARGS` in a fresh process, as a user would, to its end (at most `timeout_s`), capturing its text.

    `env` is the process's whole environment (None: this one's); `kwargs` go to subprocess.run.
    """
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, **kwargs)


class Ran(NamedTuple):
    """What one in-process command did: its exit status and what it printed."""

    code: int
    out: str
    err: str


def attnbench_in_process(args: list, capsys, *, env: dict[str, str] | None = None, monkeypatch=None) -> Ran:
    """Run the CLI's `main(ARGS)` in this process (its workers are still subprocesses): exit status, stdout and stderr.

    With `env` (and `monkeypatch`, or a `pytest.MonkeyPatch.context()` where no fixture serves), under exactly that
    environment; `capsys` None returns no text. For runs that only make a run folder for the test, and for refusals: a
    subprocess would import torch once more (seconds) for nothing under test.
    """
    from harness.cli.main import main

    if env is not None:
        assert monkeypatch is not None, "an in-process run under its own environment needs monkeypatch to undo it"
        for name in set(os.environ) - set(env):
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
    code = main([str(a) for a in args])
    if capsys is None:  # a module-scoped fixture has no capsys: its output is left where pytest captures it
        return Ran(code, "", "")
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


def assert_one_line_error(ran: Ran | subprocess.CompletedProcess, *words: str, prefix: str = ERROR) -> str:
    """Assert a refusal: exit status 2, and stderr exactly one line `PREFIX...` naming each of `words`, no traceback; that line.

    `ran` is an in-process command's `Ran` or a subprocess's CompletedProcess.
    """
    if isinstance(ran, subprocess.CompletedProcess):
        ran = Ran(ran.returncode, ran.stdout, ran.stderr)
    code, out, err = ran
    assert code == 2, (code, (out or "")[-500:], err[-2000:])
    assert err.count("\n") == 1 and err.startswith(prefix) and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def refused(capsys, argv: list, words: list[str] | tuple[str, ...] = ()) -> str:
    """Run the CLI in process and assert it refused in one line naming each of `words` (see `assert_one_line_error`)."""
    return assert_one_line_error(attnbench_in_process(argv, capsys), *words)


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
