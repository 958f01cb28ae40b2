"""The template process of harness.process.forkserver: it imports the worker's modules once, warms them on one thread, then
forks one child per request on its control socket and reports each child's exit status through the pipe it was given.

`python -m harness.child template` runs it (`template_job`); the `attnbench` command's own fork runs `serve_as_template`
(harness.process.command_image). The supervisor's side, which starts templates and sends requests, is forkserver.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import socket
import sys
from typing import Any, Sequence

#: The modules a template imports before it forks: the worker job's (torch with them). Not torch._dynamo (1.5 CPU-s, with
#: torch.nn.attention.bias): only compiled backends and lower-right causal masks import it, so a worker pays it on its
#: first such pair, and a template whose workers run none (most of the runs a test starts) never does.
PRELOAD = ("harness.run.worker",)
#: Largest request (argv and environment) a template reads in one message.
MESSAGE_BYTES = 1 << 20


def template_job(argv: list[str]) -> int:
    """harness.child's `template` job: import the workers' modules, then fork one child per request until the socket closes.

    In a forked child this returns the exit status of the job it was asked to run, as `python -m harness.child` would.
    """
    from harness.process.jobs import job_parser

    parser = job_parser("template", "Import the worker's modules, then fork workers on request (started by attnbench run).")
    parser.add_argument("--control-fd", type=int, required=True, help="the socket the supervisor sends requests on")
    parser.add_argument("preload", nargs="*", help="modules to import before forking")
    args = parser.parse_args(argv)
    return serve_as_template(args.control_fd, args.preload)


def serve_as_template(control_fd: int, preload: Sequence[str] = PRELOAD) -> int:
    """A template's life once started: import `preload`, warm, say ready on `control_fd`, fork on request; 0 when the
    supervisor has gone. A forked child runs its job and ends with the job's status (harness.process.fast_exit)."""
    for module in preload:
        importlib.import_module(module)
    _warm_on_one_thread()
    gc.collect()
    gc.freeze()  # the imports live in every child: none of their collections need walk them (and touch their pages)
    control = socket.socket(fileno=control_fd)
    control.send(json.dumps({"ready": os.getpid()}).encode())
    request = _serve(control)
    if request is None:
        return 0
    from harness.process.fast_exit import end_process
    from harness.process.jobs import run_job

    end_process(lambda: run_job(request))


def _warm_on_one_thread() -> None:
    """Warm this process as each worker would warm itself (harness.process.warmup), on one thread, so every fork
    starts warm: a worker's own warm-up then returns at once (about 0.5 CPU-s a worker). One thread, because an OpenMP pool
    does not survive a fork (GNU libgomp hangs in the child); on one thread none is made, and the count torch had is put
    back, so a worker that sets its own makes its pool after the fork, as a fresh process would."""
    import torch

    from harness.process.warmup import warm_process

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        warm_process()
    finally:
        torch.set_num_threads(threads)


def _serve(control: socket.socket) -> list[str] | None:
    """The template's loop; returns None when the supervisor has gone and every child is reaped, a child's argv in a child."""
    statuses: dict[int, int] = {}  # child pid → the write end of its status pipe
    open_control = True
    while open_control or statuses:
        readable = select.select([control] if open_control else [], [], [], 0.05)[0]
        _reap(statuses)
        if not readable:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2)
        except OSError:
            message, fds = b"", []
        if not message:
            open_control = False
            control.close()
            continue
        request = json.loads(message)
        stdout, status_write = fds
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"fork failed: {exc}"}).encode())
            continue
        if pid == 0:
            control.close()
            _become_child(request, stdout, [status_write, *statuses.values()])
            return request["argv"]
        os.close(stdout)
        statuses[pid] = status_write
        control.send(json.dumps({"pid": pid}).encode())
    return None


def _reap(statuses: dict[int, int]) -> None:
    """Write each ended child's exit status (negative: the signal that killed it) to its pipe and close it."""
    for pid in list(statuses):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done == 0:
            continue
        code = os.waitstatus_to_exitcode(status)
        fd = statuses.pop(pid)
        try:
            os.write(fd, str(code).encode())
        except OSError:
            pass  # the supervisor stopped watching (it ended): nothing to tell
        os.close(fd)


def _become_child(request: dict[str, Any], stdout: int, inherited: list[int]) -> None:
    """In a fresh fork: drop the template's descriptors, take the request's output, environment and a session of its own."""
    from harness.process.children import die_with_parent

    template = os.getppid()
    os.setsid()
    die_with_parent(template)  # the template dies with the supervisor, so the worker does too
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    os.dup2(stdout, 1)
    os.dup2(stdout, 2)
    os.close(stdout)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [sys.argv[0], *request["argv"]]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # a fresh process seeds numpy's global generator from the OS; a fork would share the template's

