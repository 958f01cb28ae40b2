"""The one way attnbench starts a child process: workers, gpu-check's per-backend children, stability's fresh processes, the CUDA peaks.

Every child but the pytest workers is a job of `python -m harness.child` (harness/child.py; the
jobs' table is harness/process/jobs.py), its command built by `child_command`. Every child runs `python -m ...` from the checkout's root (so `harness` resolves without an
install), in a session of its own (a kill reaches its children too), and with a parent-death
signal, so that none outlives a parent killed with SIGKILL.

A child imports what this process imports (`child_env`): `-m` puts the checkout's root first on its path, so
`harness` is this one, and its PYTHONPATH is this process's view of the user's folder, so that a plugin found
through `PYTHONPATH=.` or the folder `python -m harness` ran in is found there too.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from harness.process.jobs import JOBS

#: A child exits with this code when the parent that started it has gone (a worker: its supervisor).
EXIT_ORPHANED = 71
#: The checkout's root: children start there.
ROOT = Path(__file__).resolve().parents[2]


def python_command(module: str, *args: str) -> list[str]:
    """`python -m module args…` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_command(job: str, *args: str) -> list[str]:
    """`python -m harness.child job args…`: the command of one of harness.child's jobs (a name not in its table is a bug)."""
    if job not in JOBS:
        raise ValueError(f"harness.child has no job {job!r}; its jobs are {', '.join(JOBS)}")
    return python_command("harness.child", job, *args)


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with a PYTHONPATH that gives a child started in ROOT this process's import view.

    Relative entries (`PYTHONPATH=.`) are made absolute against this process's working directory, as Python made them
    for this process, and that directory itself goes first when it is on this process's path (`python -m harness`
    puts it there; the `attnbench` script does not, and then neither does a child).
    """
    env = dict(os.environ if env is None else env)
    try:
        cwd = os.getcwd()
    except OSError:  # the folder was removed under us: nothing relative can be resolved against it
        return env
    declared = env.get("PYTHONPATH", "")
    # An empty entry is the working directory, as Python reads it (abspath('') is the working directory).
    entries = [os.path.abspath(entry) for entry in declared.split(os.pathsep)] if declared else []
    if cwd not in entries and any(os.path.abspath(entry) == cwd for entry in sys.path):
        entries.insert(0, cwd)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    return env


def spawn(command: Sequence[str], *, stdout: TextIO | int | None = None, env: dict[str, str] | None = None,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start a child in its own session that dies with this process; stderr goes with stdout; `pass_fds` stay open in it."""
    parent = os.getpid()
    return subprocess.Popen(list(command), stdout=stdout, stderr=subprocess.STDOUT if stdout is not None else None,
                            env=child_env(env), cwd=ROOT, start_new_session=True, preexec_fn=lambda: die_with_parent(parent),
                            pass_fds=tuple(pass_fds))


def kill_group(process: subprocess.Popen) -> None:
    """Kill a spawned child's whole process group and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@dataclass(frozen=True)
class ChildResult:
    """How a short-lived child ended: exit code (None after a timeout), its JSON lines and the tail of its output."""

    returncode: int | None
    objects: tuple[dict[str, Any], ...]
    tail: str
    timed_out: bool = False
    #: Everything the child printed on stdout (for a child whose output is not JSON lines, such as ncu's CSV).
    stdout: str = ""

    @property
    def ok(self) -> bool:
        """Exited 0 and said something."""
        return self.returncode == 0 and bool(self.objects)

    def describe(self) -> str:
        """One line: how it ended and the last of what it printed."""
        if self.timed_out:
            return f"timed out; last output: {self.tail}"
        return f"exit {self.returncode}: {self.tail}"


def run_child(command: Sequence[str], timeout_s: float | None = None, env: dict[str, str] | None = None) -> ChildResult:
    """Run a child to its end (or kill it at `timeout_s`); collect the JSON objects it printed one per line on stdout."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(env), cwd=ROOT,
                               start_new_session=True, preexec_fn=lambda parent=os.getpid(): die_with_parent(parent))
    try:
        out, err = process.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        timed_out = True
    return child_result(None if timed_out else process.returncode, out, err, timed_out)


def child_result(returncode: int | None, out: str, err: str, timed_out: bool = False) -> ChildResult:
    """A ChildResult from what a child printed: the JSON objects on lines of their own in `out`, the tail of `err` (else `out`)."""
    objects = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                objects.append(json.loads(line))
            except ValueError:
                pass  # a stray line that only looked like JSON; the tail shows it
    tail = " ".join((err or out or "").split())[-300:]
    return ChildResult(returncode, tuple(objects), tail, timed_out, out)


def emit(obj: dict[str, Any]) -> None:
    """In a child: print one JSON object on its own line for `run_child` to collect."""
    print(json.dumps(obj, default=str), flush=True)


def die_with_parent(parent_pid: int) -> None:
    """In a freshly forked child: ask Linux to SIGKILL it when the parent dies (no-op where prctl is missing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_ORPHANED)


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> threading.Thread:
    """Exit this process when `parent_pid` is no longer its parent (portable back-up to die_with_parent)."""

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                sys.stderr.write(f"attnbench worker: supervisor {parent_pid} is gone; exiting\n")
                sys.stderr.flush()
                os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="attnbench-parent-watch", daemon=True)
    thread.start()
    return thread
