"""CPU workers forked from a template process (harness.process.forkserver) behave as freshly started ones do.

The reliability, resume and busy-machine tests already run every CPU sweep through forked workers (crash, hang, OOM,
a killed supervisor); these tests pin what the fork itself must keep: one template serving many runs, each worker
under exactly its own environment, its own session and exit status, and a fresh interpreter when asked or when the
template is gone.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from harness.process import forkserver
from harness.process.children import child_command, run_child
from harness.run import protocol
from harness.run.protocol import FolderLock
from tests.cli_runs import PLUGIN, attnbench_in_process, executions, rows, write_suite
from harness.backends.registry import ENV_VAR

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_LINE = re.compile(r"forked from worker template (\d+)")


def _run(tmp_path: Path, capsys, monkeypatch, name: str, backends=("naive", "sdpa")) -> Path:
    """One tiny CPU run in this process, its failing-backend log in tmp_path/name; the run folder."""
    suite = write_suite(tmp_path / f"{name}.toml", list(backends), [16])
    log_dir = tmp_path / name
    log_dir.mkdir()
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("ATTNBENCH_TEST_LOG", str(log_dir / "executions.log"))
    ran = attnbench_in_process(["run", "--suite", suite, "--device", "cpu", "--out", tmp_path / "results", "--run-id", name,
                                "--no-remeasure"], capsys)
    assert ran.code == 0, ran.err[-2000:]
    return tmp_path / "results" / name


def _templates(run_dir: Path) -> list[int]:
    return [int(pid) for pid in TEMPLATE_LINE.findall((run_dir / "worker-0.log").read_text())]


@pytest.mark.e2e
def test_one_template_serves_runs_whose_runtime_variables_differ_and_each_worker_sees_its_own(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    first = _run(tmp_path, capsys, monkeypatch, "a", backends=("naive", "t-slow"))
    # Without the checkout's root on PYTHONPATH (from another folder): `-m` puts it on the template's path anyway.
    monkeypatch.delenv("PYTHONPATH")
    monkeypatch.chdir(tmp_path)
    second = _run(tmp_path, capsys, monkeypatch, "b", backends=("naive", "t-slow"))
    assert _templates(first) and _templates(first) == _templates(second), (first / "worker-0.log").read_text()
    # main([...]) called inside another program is not the attnbench command: its template is a fresh interpreter.
    assert "(python -m harness.child template)" in (first / "worker-0.log").read_text()
    # Each run's worker read ATTNBENCH_TEST_LOG from its own request, not from the template's start.
    assert sum(executions(tmp_path / "a").values()) >= 1 and sum(executions(tmp_path / "b").values()) >= 1
    for run in (first, second):
        assert {r["status"] for r in rows(run)} == {"ok"}, [(r["backend"], r["status"], r["reason"]) for r in rows(run)]


@pytest.mark.e2e
def test_a_variable_read_at_import_gets_its_own_template_and_the_switch_starts_workers_fresh(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = _run(tmp_path, capsys, monkeypatch, "one")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    two = _run(tmp_path, capsys, monkeypatch, "two")
    assert _templates(one) and _templates(two) and _templates(one) != _templates(two)
    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    fresh = _run(tmp_path, capsys, monkeypatch, "fresh")
    log = (fresh / "worker-0.log").read_text()
    assert not _templates(fresh) and "-m harness.child worker --run-dir" in log, log
    assert [r["worker"] for r in rows(fresh)] == ["0", "0"]


@pytest.mark.e2e
def test_a_dead_template_is_replaced_and_a_forked_child_reports_its_status_and_session(tmp_path, capsys, monkeypatch):
    before = _run(tmp_path, capsys, monkeypatch, "before")
    (template_pid,) = set(_templates(before))
    os.kill(template_pid, signal.SIGKILL)
    after = _run(tmp_path, capsys, monkeypatch, "after")
    assert _templates(after) and template_pid not in _templates(after)
    assert {r["status"] for r in rows(after)} == {"ok"}

    # A job's usage error: the exit status and the one line a fresh interpreter gives, on the file it was given.
    env = dict(os.environ)
    template = forkserver.template_for(env)
    out = tmp_path / "child.log"
    with open(out, "w") as log:
        child = template.launch(["worker", "--no-such-option"], log.fileno(), env)
    fresh = run_child(child_command("worker", "--no-such-option"), timeout_s=120)
    assert child.pid != template.pid and child.wait(timeout=60) == fresh.returncode == 2
    assert out.read_text().strip() == fresh.tail and fresh.tail.startswith("attnbench worker: "), (out.read_text(), fresh.tail)

    # A worker waiting on its folder's lock (held here) until its process group is killed: the status is the
    # signal's negative number, as Popen gives it, from a process that leads a session of its own.
    lock = FolderLock(before / protocol.WORKERS_LOCK)
    assert lock.try_exclusive()
    try:
        with open(tmp_path / "waiting.log", "w") as log:
            waiting = template.launch(["worker", "--run-dir", str(before), "--worker", "w", "--parent-pid", str(template.pid)],
                                      log.fileno(), env)
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=1)
        assert os.getsid(waiting.pid) == waiting.pid and waiting.poll() is None
        os.killpg(waiting.pid, signal.SIGKILL)
        assert waiting.wait(timeout=60) == -signal.SIGKILL
    finally:
        lock.release()


@pytest.mark.e2e
def test_a_forked_worker_starts_warm_and_runs_on_the_threads_its_run_asks_for(tmp_path, capsys, monkeypatch):
    # The template warmed itself on one thread; a worker asked for two makes its own OpenMP pool after the fork (a pool made
    # before it would hang the worker's first parallel operator: a `timeout` row). 256 tokens: bmm and softmax go parallel.
    suite = write_suite(tmp_path / "two.toml", ["naive", "sdpa"], [256])
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a template whose torch has two threads (make test gives one)
    ran = attnbench_in_process(["run", "--suite", suite, "--device", "cpu", "--threads", "2", "--timeout", "60", "--out",
                                tmp_path / "results", "--run-id", "r", "--no-remeasure", "--quiet"], capsys)
    assert ran.code == 0, ran.err[-2000:]
    run = tmp_path / "results" / "r"
    assert _templates(run), (run / "worker-0.log").read_text()
    assert [(r["status"], r["threads"]) for r in rows(run)] == [("ok", 2), ("ok", 2)], [(r["status"], r["reason"]) for r in rows(run)]


#: A plugin that writes the pid of the process that started the one importing it, each import a line.
PARENT_RECORDING_PLUGIN = """
import os
import torch.nn.functional as F
from harness.backends import Backend

with open(os.environ["ATTNBENCH_TEST_PARENTS"], "a") as parents:
    parents.write(f"{os.getppid()}\\n")


class Recorded(Backend):
    name = "recorded"
    family = "example"

    def prepare(self, case, inputs):
        return lambda: F.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v)
"""


@pytest.mark.e2e
def test_a_cpu_runs_plugin_probe_is_forked_from_the_template_its_workers_then_use(tmp_path, capsys, monkeypatch):
    (tmp_path / "parent_recording_plugin.py").write_text(PARENT_RECORDING_PLUGIN)
    parents = tmp_path / "parents.txt"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
    monkeypatch.setenv(ENV_VAR, "parent_recording_plugin:Recorded")
    monkeypatch.setenv("ATTNBENCH_TEST_PARENTS", str(parents))
    monkeypatch.syspath_prepend(str(tmp_path))
    suite = write_suite(tmp_path / "probe.toml", ["recorded"], [16])
    ran = attnbench_in_process(["run", "--suite", suite, "--device", "cpu", "--out", tmp_path / "results", "--run-id", "r",
                                "--no-remeasure", "--quiet"], capsys)
    assert ran.code == 0, ran.err[-2000:]
    run = tmp_path / "results" / "r"
    assert [r["status"] for r in rows(run)] == ["ok"]
    # Imported three times: here, in the probe, in the worker; the probe and the worker each by the run's one template.
    lines = parents.read_text().split()
    assert len(lines) == 3 and lines[0] == str(os.getppid()), lines
    assert lines[1] == lines[2] == str(_templates(run)[0]), (lines, (run / "worker-0.log").read_text())


def test_the_template_key_ignores_only_variables_read_when_used():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": "/x"}
    # RAY_CLIENT_MODE=0 is what `import ray` writes, and what Ray reads when it is absent; 1 turns client mode on.
    same = forkserver.template_key({**base, "ATTNBENCH_TEST_LOG": "/a", "PYTEST_CURRENT_TEST": "t (call)", "RAY_CLIENT_MODE": "0",
                                    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "140000000000"})
    assert same == forkserver.template_key(base)
    for name, value in (("OMP_NUM_THREADS", "2"), ("PYTHONPATH", "/y"), ("CUDA_VISIBLE_DEVICES", "0"), ("LD_PRELOAD", "x.so"),
                        ("RAY_CLIENT_MODE", "1")):
        assert forkserver.template_key({**base, name: value}) != forkserver.template_key(base), name
    assert not forkserver.enabled({forkserver.ENV_SWITCH: "0"})


def test_the_checkouts_root_on_pythonpath_needs_no_template_of_its_own_but_a_fork_of_the_command_tells_it_apart():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    with_root = {**base, "PYTHONPATH": str(ROOT)}
    assert forkserver.template_key(with_root) == forkserver.template_key(base)
    assert forkserver.template_key({**base, "PYTHONPATH": os.pathsep.join(["/x", str(ROOT)])}) == \
        forkserver.template_key({**base, "PYTHONPATH": "/x"}) != forkserver.template_key(base)
    # The command's fork has the command's path, not `-m`'s; with PYTHONSAFEPATH `-m` adds nothing, so the entry counts.
    assert forkserver.exact_key(with_root) != forkserver.exact_key(base)
    safe = {**base, "PYTHONSAFEPATH": "1"}
    assert forkserver.template_key({**safe, "PYTHONPATH": str(ROOT)}) != forkserver.template_key(safe)


def test_the_variables_taken_as_absent_are_what_their_library_writes_on_import():
    spec = importlib.util.find_spec("ray")
    if spec is None:
        pytest.skip("ray is not installed: pip install -e '.[ray]'")
    # Ray's own source, read, not imported (seconds): its import writes the value the template key takes as absent.
    hook = Path(spec.origin).parent / "_private" / "client_mode_hook.py"
    written = [node for node in ast.walk(ast.parse(hook.read_text())) if isinstance(node, ast.Call)
               and ast.unparse(node.func) == "os.environ.update" and isinstance(node.args[0], ast.Dict)]
    assert [{ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(call.args[0].keys, call.args[0].values)}
            for call in written] == [forkserver.ABSENT_WHEN]


def test_the_variables_written_before_read_are_written_by_inductor_before_it_loads_a_kernel():
    # torch's own source, read: the variable's name appears in Python once, as the target of the first statement of the
    # function that loads a compiled kernel (whose module init reads it with getenv): no os.environ read, get or pop of it.
    source = (Path(importlib.util.find_spec("torch").origin).parent / "_inductor" / "codecache.py").read_text()
    (name,) = forkserver.WRITTEN_BEFORE_READ
    tree = ast.parse(source)
    named = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == name]
    writers = [function for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
               and isinstance(function.body[0], ast.Assign) and ast.unparse(function.body[0].targets[0]) == f"os.environ[{name!r}]"]
    assert [f.name for f in writers] == ["_load_library_inner"] and named == [writers[0].body[0].targets[0].slice], named
    assert "spec_from_file_location" in ast.unparse(writers[0]) and f'std::getenv("{name}")' in source


def _module_level_environ_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """`os.environ[...]`/`.get(...)`/`os.getenv(...)` naming an ATTNBENCH_ variable outside any function or class body."""
    found = []
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("ATTNBENCH_"):
                parent_text = ast.unparse(statement)
                if "environ" in parent_text or "getenv" in parent_text:
                    found.append((statement.lineno, node.value))
    return found


def test_no_module_reads_an_attnbench_variable_while_it_is_imported():
    """A template imports once for many workers: a variable read at import would be the template's, not the worker's."""
    offenders = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        for line, name in _module_level_environ_reads(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(ROOT)}:{line} reads {name}")
    assert not offenders, offenders


def test_the_scan_finds_a_module_level_read():
    tree = ast.parse('import os\nLIMIT = os.environ.get("ATTNBENCH_X", "1")\n\ndef f():\n    return os.getenv("ATTNBENCH_Y")\n')
    assert _module_level_environ_reads(tree) == [(2, "ATTNBENCH_X")]
