"""The `attnbench` command's own process as its CPU workers' template: a fork of it, not a second import of torch.

A CPU run's supervisor has imported torch (its registry needs it) before it asks for a worker template
(harness.process.forkserver), and a template is `python -m harness.child template`, which imports torch again:
about 2 CPU-seconds, and as long on a busy machine, for every `attnbench run`. Where the supervisor is the command
the user started (`attnbench run`, `python -m harness run`, `make bench`: a fresh interpreter whose state the code
below knows), it forks itself into that template instead. The fork is made to start as a spawned template does:

- its own session, dying with its parent, in the checkout's root, its output on the template's log;
- every other file descriptor the command held (a run folder's lock, a pipe to whoever started the command, the
  other end of the control socket) made to read /dev/null, so the template and its workers hold none of them, and
  no Python object's later close lands on a descriptor a worker has since opened;
- signal handlers as a fresh interpreter has them; the environment the template was asked for.

It is used only while the fork can be that: the process marked itself as the command right after importing torch
(`mark`), still runs on the threads it had then (a thread's lock, or an OpenMP pool, would reach the fork half-made),
and still has the environment it had then, which is the one the template is for (compared as two templates' are).
A supervisor inside another program (a notebook, pytest, a script calling main()) never marks itself, and spawns.

What differs from a spawned template: the modules the command had imported (its CLI, its plugins) are already there,
and the import path is the command's own (a spawned template gets it through PYTHONPATH, harness.process.children).
A process forked from the command runs inside the command's call stack: it must never return into it, so it ends
through harness.process.fast_exit (atexit's functions, open files flushed, then os._exit), never by unwinding.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Mapping

from harness.process.fast_exit import end_process

#: The command's environment and thread count when it marked itself (None: this process is not a marked command).
_marked: tuple[dict[str, str], int] | None = None


def _task_count() -> int:
    """This process's threads, native ones included (0 where /proc does not say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def mark() -> None:
    """Called by the `attnbench` command right after it imported torch, before it has run anything: this process may fork
    itself into a worker template while its threads and environment stay as they are now."""
    global _marked
    tasks = _task_count()
    _marked = (dict(os.environ), tasks) if tasks else None


def forget() -> None:
    """This process is no longer one a template may be forked from (a test that marked its own process ends)."""
    global _marked
    _marked = None


def can_serve(env: Mapping[str, str], key: Callable[[Mapping[str, str]], object]) -> bool:
    """Whether this process may fork itself into the template for `env`: a marked command, on the threads it had when it
    marked itself, whose environment then and now is the one asked for, compared by `key` (forkserver's exact_key,
    handed in: this module is forkserver's, and imports nothing of it back)."""
    if _marked is None or not hasattr(os, "fork"):
        return False
    from harness.process.children import child_env

    environment, tasks = _marked
    return (threading.active_count() == 1 and 0 < _task_count() <= tasks
            and key(child_env(environment)) == key(child_env(dict(os.environ))) == key(env))


def fork(control_fd: int, log_fd: int, env: Mapping[str, str], serve: Callable[[int], int]) -> int:
    """Fork this process; in the fork, become a template for `env` on `control_fd` with its output on `log_fd`, run
    `serve(control_fd)` and end with its status (harness.process.fast_exit). The fork's pid."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # what the command printed must not be printed again by the fork
        except (AttributeError, OSError, ValueError):
            pass
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid

    def serve_as_template() -> int:
        _start_as_template(parent, control_fd, log_fd, env)
        return serve(control_fd)

    end_process(serve_as_template)


def _start_as_template(parent: int, control_fd: int, log_fd: int, env: Mapping[str, str]) -> None:
    """In the fork: what a template spawned by harness.process.children gets from its start."""
    from harness.process.children import ROOT, die_with_parent

    forget()  # the template and its workers never fork a template of their own from themselves
    os.setsid()
    die_with_parent(parent)
    os.chdir(ROOT)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    _release_descriptors(keep={0, 1, 2, control_fd})
    # Streams on the descriptors, not whatever object the command had put in their place.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    _reset_signal_handlers()
    os.environ.clear()
    os.environ.update(env)


def _release_descriptors(keep: set[int]) -> None:
    """Point every open descriptor not in `keep` at /dev/null: the command's files, pipes, sockets and locks are let go,
    and the numbers stay taken, so an object the command left open closes /dev/null, never a worker's file."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in open_fds:
            if fd in keep or fd == null:
                continue
            try:
                os.fstat(fd)
            except OSError:
                continue  # the listing's own descriptor, closed since
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _reset_signal_handlers() -> None:
    """Python-level signal handlers as a fresh interpreter has them: the command's (a SIGTERM that stops its run) are its own."""
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
