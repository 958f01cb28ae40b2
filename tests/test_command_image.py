"""The `attnbench` command forks itself into its CPU workers' template (harness.process.command_image), and that fork
starts as a spawned template does: none of the command's descriptors, none of its signal handlers, its own session, the
checkout as its folder, and a job's exit status as a fresh interpreter gives it. It is refused where a fork could not be
that: another thread running, or an environment other than the one the command marked itself with."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli_runs import ROOT

#: A process that does what the `attnbench` command does before its first worker (torch imported, then `mark`), holding
#: a lock and a SIGTERM handler of its own when its template forks, then reports what the template holds and does.
COMMAND = r"""
import fcntl, json, os, signal, sys, threading, time
import torch  # noqa: F401
from harness.process import command_image, forkserver
from harness.process.children import child_env

command_image.mark()
tasks = len(os.listdir("/proc/self/task"))
env = child_env(dict(os.environ))
seen = {"other_env": command_image.can_serve({**env, "OMP_NUM_THREADS": "7"}, forkserver.exact_key)}
waiting = threading.Event()
thread = threading.Thread(target=waiting.wait)
thread.start()
seen["with_a_thread"] = command_image.can_serve(env, forkserver.exact_key)
waiting.set()
thread.join()
while len(os.listdir("/proc/self/task")) > tasks:  # its task outlives join() by a moment
    time.sleep(0.01)
seen["alone"] = command_image.can_serve(env, forkserver.exact_key)

lock = open(sys.argv[1], "w")
fcntl.flock(lock, fcntl.LOCK_EX)
signal.signal(signal.SIGTERM, lambda *_: None)
template = forkserver.template_for(env)
lock.close()  # the command lets its lock go; a template that kept the descriptor would keep the lock
again = open(sys.argv[1], "w")
try:
    fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
    seen["lock_free"] = True
except BlockingIOError:
    seen["lock_free"] = False
status = open(f"/proc/{template.pid}/status").read()
caught = int(next(l for l in status.splitlines() if l.startswith("SigCgt:")).split()[1], 16)
seen.update(origin=template.origin, template_parent=int(
    next(l for l in status.splitlines() if l.startswith("PPid:")).split()[1]) == os.getpid(),
    sigterm_caught=bool(caught >> (signal.SIGTERM - 1) & 1), sigint_caught=bool(caught >> (signal.SIGINT - 1) & 1),
    own_session=os.getsid(template.pid) == template.pid, folder=os.readlink(f"/proc/{template.pid}/cwd"),
    descriptors=sorted(os.readlink(f"/proc/{template.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{template.pid}/fd")))
job = forkserver.run_forked_job(["worker", "--no-such-option"], env, 60)
seen.update(job_status=job.returncode, job_said=job.tail)
# Without the checkout's root on PYTHONPATH a spawned template imports the same, but the fork has the command's path.
from harness.process.children import ROOT
without_root = os.pathsep.join(e for e in env["PYTHONPATH"].split(os.pathsep) if e != str(ROOT))
seen["without_root"] = forkserver.template_for({**env, "PYTHONPATH": without_root}).origin
command_image.forget()
seen["forgotten"] = command_image.can_serve(env, forkserver.exact_key)
print(json.dumps(seen))
"""


@pytest.mark.e2e
def test_the_commands_fork_starts_as_a_spawned_template_and_is_refused_where_it_could_not(tmp_path):
    lock = tmp_path / "folder.lock"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", COMMAND, str(lock)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["alone"] and not seen["with_a_thread"] and not seen["other_env"] and not seen["forgotten"], seen
    assert seen["origin"] == "a fork of the attnbench command" and seen["template_parent"] and seen["own_session"], seen
    assert seen["lock_free"], seen  # the lock file's descriptor did not reach the template
    assert str(lock) not in seen["descriptors"] and seen["folder"] == str(ROOT), seen
    assert not seen["sigterm_caught"] and seen["sigint_caught"], seen  # a fresh interpreter's handlers, not the command's
    # A job's usage error from a worker forked by the fork: the exit status and line a fresh interpreter gives.
    assert seen["job_status"] == 2 and seen["job_said"].startswith("attnbench worker: "), seen
    assert seen["without_root"] == "python -m harness.child template", seen


def test_a_job_that_calls_sys_exit_ends_the_fork_with_the_status_a_fresh_interpreter_gives(capsys):
    from harness.process.fast_exit import exit_code

    assert [exit_code(SystemExit(code)) for code in (None, 0, 3)] == [0, 0, 3]
    assert exit_code(SystemExit("stopped: no folder")) == 1 and capsys.readouterr().err == "stopped: no folder\n"
