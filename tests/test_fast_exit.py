"""A process attnbench starts ends as a fresh interpreter's exit looks from outside (harness.process.fast_exit): the threads
still running are waited for, atexit's functions run, files left open are flushed, `sys.exit(n)` gives n, an exception 1
with its traceback, a KeyboardInterrupt SIGINT; in a fork, files its parent had open are not flushed a second time. A
process that initialised CUDA exits as the interpreter does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.cli_runs import ROOT

#: A parent that leaves a line in a buffer of its own, freezes its heap as a template does, and forks one child per job.
FORKS = r"""
import atexit, gc, json, os, sys, threading, time
from harness.process.fast_exit import end_process

folder = sys.argv[1]
parents_file = open(os.path.join(folder, "parent.txt"), "w")
parents_file.write("written once, by the parent\n")
gc.collect()
gc.freeze()

held = []

def leaves_a_file_open():
    held.append(open(os.path.join(folder, "child.txt"), "w"))  # alive at exit, never closed nor flushed by the job
    held[0].write("the child's line\n")
    atexit.register(lambda: open(os.path.join(folder, "atexit.txt"), "w").write("ran\n"))
    return 5

def exits_with_a_message():
    sys.exit("stopped: no folder")

def raises():
    raise ValueError("a bug in the job")

def interrupted():
    raise KeyboardInterrupt

def leaves_a_thread_running():
    def late():
        time.sleep(0.5)
        open(os.path.join(folder, "thread.txt"), "w").write("finished\n")
    threading.Thread(target=late).start()
    return 0

statuses = {}
for job in (leaves_a_file_open, exits_with_a_message, raises, interrupted, leaves_a_thread_running):
    err = os.path.join(folder, job.__name__ + ".err")
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT), 2)
        end_process(job)
    statuses[job.__name__] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
parents_file.close()
print(json.dumps(statuses))
"""


def test_a_process_waits_for_its_threads_runs_atexit_flushes_what_it_left_open_and_exits_as_a_fresh_interpreter_would(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORKS, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"leaves_a_file_open": 5, "exits_with_a_message": 1, "raises": 1, "interrupted": -signal.SIGINT,
                                       "leaves_a_thread_running": 0}
    assert (tmp_path / "thread.txt").read_text() == "finished\n"  # a thread still running is waited for, as at a normal exit
    assert (tmp_path / "child.txt").read_text() == "the child's line\n"
    assert (tmp_path / "atexit.txt").read_text() == "ran\n"
    assert (tmp_path / "parent.txt").read_text() == "written once, by the parent\n"  # not again by each child
    assert (tmp_path / "exits_with_a_message.err").read_text() == "stopped: no folder\n"
    assert (tmp_path / "raises.err").read_text().rstrip().endswith("ValueError: a bug in the job")


#: A process whose CUDA is in use (pretended: this machine has none) takes the interpreter's own exit, teardown and all.
CUDA_IN_USE = r"""
import sys
from harness.process import fast_exit

class TornDown:
    def __init__(self, path):
        self.path, self.open = path, open  # held here: the teardown clears builtins before this __del__ runs

    def __del__(self):
        with self.open(self.path, "w") as marker:
            marker.write("torn down\n")

kept = TornDown(sys.argv[1])
fast_exit.cuda_in_use = lambda: True
fast_exit.end_process(lambda: 7)
print("not reached")
"""


def test_a_process_that_initialised_cuda_exits_as_the_interpreter_does(tmp_path):
    marker = tmp_path / "teardown.txt"
    done = subprocess.run([sys.executable, "-c", CUDA_IN_USE, str(marker)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7 and "not reached" not in done.stdout, (done.stdout, done.stderr)
    assert marker.read_text() == "torn down\n"  # the module teardown a fast exit skips ran
