"""CPU workers forked from a template process that has already imported torch: a worker starts in milliseconds, not seconds.

Importing torch costs about 2 CPU-seconds per process (more on a loaded machine), and a run starts a worker per
slot, another after each crash, and fresh ones for its re-measure phase; a process that runs many sweeps (a
notebook, a script of runs, the test suite) starts hundreds. So a supervisor keeps one template per environment:
`python -m harness.child template`, started as every child is (harness.process.children: from the checkout's
root, the user's import path, its own session, dying with its parent), which imports the worker's modules and then
only forks. Each fork becomes `python -m harness.child worker …` as if started fresh: its own session, a
parent-death signal, stdout and stderr on its log, stdin on /dev/null, exactly the environment asked for, numpy's
global generator reseeded, and a normal exit's atexit functions, flushed files and status, without the teardown of
torch's modules that would copy the template's pages (harness.process.fast_exit). Its exit status comes back through a pipe the
template writes when it reaps the child, so the supervisor watches it as it watches a `Popen`.

What a fork could not give as a fresh process does, the template never does:
- It runs torch only on one thread, once: the worker's warm-up (a tiny forward and backward), so that each fork starts
  warm. OpenMP's thread pool does not survive a fork (GNU libgomp hangs in the child), and on one thread none is made.
- It serves CPU runs only: CUDA cannot be used in a child forked from a process that initialised it, and this
  path has not been run on a GPU box; CUDA workers are started fresh, as before.
- An environment variable read while importing (PYTHONPATH, OMP_NUM_THREADS, CUDA_*, LD_*, …) is the template's:
  a template serves one environment, compared without only the variables attnbench itself reads when they are
  used (`ATTNBENCH_*`, never at import: tests/test_forkserver.py walks every module for that), pytest's
  per-test markers, and what a library writes for itself before it reads it.
`ATTNBENCH_FORK_WORKERS=0` starts every worker fresh. The `attnbench` command, which has imported torch by then, forks
itself into its template instead of spawning one (harness.process.command_image). The template's own side (what it
imports, how it forks and reports) is harness.process.template_process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Mapping, Sequence

from harness.process.template_process import MESSAGE_BYTES, PRELOAD, serve_as_template

#: Set to 0 to start every worker as a fresh interpreter.
ENV_SWITCH = "ATTNBENCH_FORK_WORKERS"
#: Variables that may differ between the workers one template serves: read when used, never while importing.
RUNTIME_ONLY_PREFIXES = ("ATTNBENCH_", "PYTEST_CURRENT_TEST")
#: Variables a library writes into os.environ when it is imported, with the value it reads when they are absent: set to
#: that value they are the same environment as without them. Ray's import writes RAY_CLIENT_MODE=0 (ray/_private/
#: client_mode_hook.py), so a process that once imported Ray (a `--executor ray` run, a notebook) would otherwise start a
#: second template for its next local run.
ABSENT_WHEN = {"RAY_CLIENT_MODE": "0"}
#: Variables a library writes into os.environ for its own process, each time before the code that reads them runs: an
#: inherited value is never read. Inductor writes an address of the writing process before it loads each compiled kernel
#: (torch/_inductor/codecache.py), so a process that compiled anything would otherwise start a second template.
WRITTEN_BEFORE_READ = ("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",)
#: How long a template may take to import torch on a loaded machine before its first worker is started fresh instead.
READY_TIMEOUT_S = 300.0
#: Templates one process keeps (each holds torch's import, ~300 MB resident); the least recently used is closed.
MAX_TEMPLATES = 2


def enabled(env: Mapping[str, str]) -> bool:
    """Whether workers started with `env` may be forked (Linux, SCM_RIGHTS, not switched off)."""
    return (sys.platform.startswith("linux") and hasattr(socket, "send_fds") and hasattr(os, "fork")
            and env.get(ENV_SWITCH, "1") != "0")


def exact_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What makes two environments need two templates forked from the command: every variable but those read only when
    used or set to their default."""
    return tuple(sorted((name, value) for name, value in env.items()
                        if not name.startswith(RUNTIME_ONLY_PREFIXES) and ABSENT_WHEN.get(name) != value
                        and name not in WRITTEN_BEFORE_READ))


def template_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What makes two environments need two spawned templates: `exact_key`, with PYTHONPATH's entries naming the checkout's
    root left out. A spawned template runs `python -m` from that root, which puts it first on the template's path: the
    entry changes no import (`child_env` adds it wherever `python -m harness` ran from the root), and a process that
    starts runs from the root and from elsewhere (the test suite, a notebook that changes folder) needs one template."""
    key = exact_key(env)
    if env.get("PYTHONSAFEPATH"):
        return key  # `-m` puts nothing on the path: the entry is what finds the root
    from harness.process.children import ROOT

    def without_root(value: str) -> str:
        return os.pathsep.join(entry for entry in value.split(os.pathsep) if entry != str(ROOT))

    return tuple((name, without_root(value)) for name, value in key if name != "PYTHONPATH" or without_root(value))


class ForkedProcess:
    """A worker forked by a template, watched like a `subprocess.Popen`: pid, poll, wait, returncode."""

    def __init__(self, pid: int, status_fd: int, args: Sequence[str]) -> None:
        self.pid, self.args, self.returncode = pid, list(args), None
        self._status = os.fdopen(status_fd, "rb", buffering=0)

    def poll(self) -> int | None:
        """The exit status once the template has reaped the child; None while it runs."""
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until the child has ended (subprocess.TimeoutExpired after `timeout` seconds); its exit status."""
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._settle()
        assert self.returncode is not None
        return self.returncode

    def _settle(self) -> None:
        data = self._status.read()
        self._status.close()
        # Nothing written: the template itself died, and its children with it (their parent-death signal).
        self.returncode = int(data) if data.strip() else -signal.SIGKILL


class Template:
    """One template process and its control socket."""

    def __init__(self, env: Mapping[str, str]) -> None:
        from harness.process import command_image
        from harness.process.children import child_command, spawn

        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = tempfile.TemporaryFile(mode="w+")
        self.process: subprocess.Popen | _OwnFork
        #: The environment's exact key: a fork of the command serves no other (its path is the command's, not `-m`'s).
        self.exact = exact_key(env)
        if command_image.can_serve(env, exact_key):
            # The `attnbench` command has imported torch already: a fork of it is the template (harness.process.command_image).
            self.process = _OwnFork(command_image.fork(child_end.fileno(), self._log.fileno(), env, serve_as_template))
            #: How the template started, for the workers' logs.
            self.origin = "a fork of the attnbench command"
        else:
            command = child_command("template", "--control-fd", str(child_end.fileno()), *PRELOAD)
            self.process = spawn(command, stdout=self._log, env=dict(env), pass_fds=(child_end.fileno(),))
            self.origin = "python -m harness.child template"
        child_end.close()
        self._socket = parent_end
        self._lock = threading.Lock()
        self._socket.settimeout(READY_TIMEOUT_S)
        try:
            ready = self._socket.recv(MESSAGE_BYTES)
        except OSError:
            ready = b""
        finally:
            self._socket.settimeout(None)
        if not ready:
            self.close()
            raise OSError(f"the worker template did not start: {self.describe()}")

    @property
    def pid(self) -> int:
        """The template's process id: the parent of every worker it forks."""
        return self.process.pid

    @property
    def forked_from_command(self) -> bool:
        """Whether the template is a fork of the `attnbench` command (harness.process.command_image), not a spawned one."""
        return isinstance(self.process, _OwnFork)

    def alive(self) -> bool:
        """Whether the template still runs."""
        return self.process.poll() is None

    def launch(self, command: Sequence[str], stdout: int, env: Mapping[str, str]) -> ForkedProcess:
        """Fork `command` (a harness.child job) with `env`, its output on file descriptor `stdout`."""
        status_read, status_write = os.pipe()
        request = json.dumps({"argv": list(command), "env": dict(env)}).encode()
        try:
            with self._lock:
                socket.send_fds(self._socket, [request], [stdout, status_write])
                reply = json.loads(self._socket.recv(MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError) as exc:
            os.close(status_read)
            raise OSError(f"the worker template stopped answering ({exc}): {self.describe()}") from None
        finally:
            os.close(status_write)
        if "pid" not in reply:
            os.close(status_read)
            raise OSError(f"the worker template could not fork: {reply.get('error', self.describe())}")
        return ForkedProcess(reply["pid"], status_read, command)

    def describe(self) -> str:
        """How the template ended, and the last of what it printed."""
        self._log.seek(0)
        tail = " ".join(self._log.read().split())[-300:]
        return f"exit {self.process.poll()}: {tail}" if tail else f"exit {self.process.poll()}"

    def close(self) -> None:
        """Close the control socket: the template exits once the workers it forked have."""
        self._socket.close()
        self._log.close()
        if self.forked_from_command and self.process.poll() is None:
            _closing.append(self.process)  # reaped by a later template_for, as subprocess reaps a Popen it dropped


class _OwnFork:
    """A template forked from this process, watched as a `subprocess.Popen` is: pid, poll."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        """Its exit status once it has ended (reaping it); None while it runs."""
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is gone
                done, status = self.pid, 0
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


#: Closed templates forked from this process that had not yet exited.
_closing: list[_OwnFork] = []


_templates: dict[tuple[tuple[str, str], ...], Template] = {}
_templates_lock = threading.Lock()


def template_for(env: Mapping[str, str]) -> Template:
    """This process's live template for `env`, started if there is none (OSError when it cannot start)."""
    key = template_key(env)
    with _templates_lock:
        _closing[:] = [fork for fork in _closing if fork.poll() is None]
        template = _templates.pop(key, None)
        if template is not None and (not template.alive() or (template.forked_from_command and template.exact != exact_key(env))):
            template.close()
            template = None
        if template is None:
            template = Template(env)
        _templates[key] = template  # most recently used last
        while len(_templates) > MAX_TEMPLATES:
            _templates.pop(next(iter(_templates))).close()
        return template


def run_forked_job(argv: Sequence[str], env: Mapping[str, str], timeout_s: float | None = None):
    """Run a harness.child job (`argv`: its name, then its arguments) forked from this process's template for `env`, to its end
    or until `timeout_s` (then its session is killed), as `children.run_child` runs a fresh one: a ChildResult, its output
    and errors together. OSError when no template can start."""
    from harness.process.children import child_result, kill_group

    template = template_for(env)
    with tempfile.TemporaryFile(mode="w+") as output:
        process = template.launch(list(argv), output.fileno(), env)
        try:
            process.wait(timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(process)  # type: ignore[arg-type]  # a ForkedProcess leads its own session and waits like a Popen
            timed_out = True
        output.seek(0)
        return child_result(None if timed_out else process.returncode, output.read(), "", timed_out)


def run_job(argv: Sequence[str], env: Mapping[str, str], timeout_s: float | None, fork: bool):
    """Run a harness.child job (`argv`: its name, then its arguments) to its end: forked from this process's template for
    `env` where `fork` and the environment allow it and a template starts, else in a fresh interpreter. A ChildResult."""
    from harness.process.children import child_command, child_env, run_child

    env = child_env(env)
    if fork and enabled(env):
        try:
            return run_forked_job(argv, env, timeout_s)
        except OSError:
            pass  # no template starts here: neither would a worker's, and a fresh interpreter is what they get
    return run_child(child_command(*argv), timeout_s=timeout_s, env=env)
