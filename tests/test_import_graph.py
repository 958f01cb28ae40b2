"""What the harness's modules are: each imports, none is past the size of one job, the executors know their place, and
process-wide state is set only where a process starts. (Which package may import which: test_package_layers.py.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.import_walk import PACKAGE, module_name, module_paths


# The names only (a glob): every xdist worker collects this, and parsing 200 modules for their imports is a second of each.
@pytest.mark.parametrize("name", sorted(n for n in module_paths() if not n.endswith("__main__")))  # __main__ runs the CLI
def test_every_harness_module_imports(name):
    """Each module imports (a syntax error or a missing name in a module nothing else imports shows here too)."""
    importlib.import_module(name)


def test_the_local_supervisor_knows_nothing_of_the_ray_executor():
    """The base class never builds its own subclass: which executor runs a run is chosen outside both."""
    tree = ast.parse((PACKAGE / "run" / "supervisor.py").read_text())
    named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any("ray" in (m or "") for m in named), sorted(m for m in named if m)


def test_test_modules_share_helpers_through_helper_modules_only():
    """pytest imports a test module as `test_x`; imported again as `tests.test_x` it would be a second copy with its own state."""
    tests = Path(__file__).resolve().parent
    importing = {}
    for path in sorted(tests.glob("*.py")):
        tree = ast.parse(path.read_text())
        named = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        test_modules = sorted(m for m in named if m.rpartition(".")[2].startswith("test_"))
        if test_modules:
            importing[path.name] = test_modules
    assert len(list(tests.glob("test_*.py"))) > 10  # the folder is read, not empty
    assert importing == {}


#: The most lines a harness module may have: past it a module holds more than one job. 500, not 350: a lower cap split
#: modules that held one job into shards only to get under it (issue 47, "rooms, not shards").
MAX_MODULE_LINES = 500


def test_every_harness_module_is_at_most_500_lines():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50  # the package is read, not empty
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


#: Where process-wide state may be set: a process's entry points (a command, a child job, a Ray task, the pytest
#: session, the point the process turns Ray driver), each by (module, function).
_PROCESS_ENTRY_POINTS = {
    ("harness.cli.check", "run_cli"), ("harness.run.worker", "main"), ("harness.run.pytest_plugin", "pytest_collection_finish"),
    ("harness.run.ray_tasks", "_freeze_once"), ("harness.run.ray_tasks", "_gc_freeze"), ("harness.run.ray_tasks", "_task_environment"),
    ("harness.run.ray_executor", "become_driver"), ("harness.checks.gpu", "backend_job"),
    # The suites' pytest session (harness.run.pytest_plugin's session object) hands gc.freeze to its pair loop.
    ("harness.run.pytest_plugin", "__init__"),
    # A template process after its imports, and each child it forks as it becomes its job (its environment, as asked);
    # the `attnbench` command's fork as it becomes a template (the environment the command marked itself with).
    ("harness.process.template_process", "serve_as_template"), ("harness.process.template_process", "_become_child"),
    ("harness.process.command_image", "_start_as_template"),
}


def _process_wide_calls(tree: ast.Module) -> list[tuple[str, int]]:
    """(enclosing function, line) of each `gc.freeze()` call and each write to the environment (`os.environ[...] =`,
    `.update`, `.pop`, `.setdefault`, `os.putenv`) in a module; '' for the module's top level."""
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            # gc.freeze called, or handed on to be called after each pair (`after_pair=gc.freeze`): the caller chose it either way.
            if isinstance(child, ast.Attribute) and ast.unparse(child) == "gc.freeze":
                found.append((function, child.lineno))
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                owner = ast.unparse(child.func.value)
                if (owner, child.func.attr) == ("os", "putenv") or (
                        child.func.attr in ("update", "pop", "setdefault") and owner in ("os.environ", "environ")):
                    found.append((function, child.lineno))
            if isinstance(child, ast.Assign) and any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ" for t in child.targets):
                found.append((function, child.lineno))
            walk(child, name)

    walk(tree, "")
    return found


def test_process_wide_state_is_set_only_at_process_entry_points():
    """A library function that freezes the collector or edits the environment changes every caller's process (a test's too)."""
    placed = {(module_name(p), function): line for p in PACKAGE.rglob("*.py")
              for function, line in _process_wide_calls(ast.parse(p.read_text()))}
    assert ("harness.run.worker", "main") in placed  # the walk finds them
    assert sorted(k for k in placed if k not in _PROCESS_ENTRY_POINTS) == []
    assert ("harness.checks.gpu", "backend_job") in placed  # handed on, not called: found all the same
    planted = ast.parse("import gc, os\ndef helper():\n    gc.freeze()\n    os.environ['X'] = '1'\n    run(after=gc.freeze)\n")
    assert _process_wide_calls(planted) == [("helper", 3), ("helper", 4), ("helper", 5)]


def test_only_the_one_nvml_reader_imports_nvml():
    """telemetry/nvml.py is where NVML starts and stops; run/cooldown.py once opened it on its own beside it."""
    importing = sorted(module_name(p) for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                       if isinstance(node, ast.Import) and any(a.name == "pynvml" for a in node.names)
                       or isinstance(node, ast.ImportFrom) and node.module == "pynvml")
    assert importing == ["harness.telemetry.nvml"]


def test_the_command_line_is_parsed_without_pandas_torch_or_matplotlib():
    """Every `attnbench` command builds the whole parser first (a run's supervisor and each Ray driver too): importing a
    light module of harness.analysis for a default must not load the analysis API, and pandas with it (a quarter second)."""
    import subprocess
    import sys

    script = ("import sys; from harness.cli.main import build_parser; build_parser(); "
              "print(sorted({'pandas', 'torch', 'matplotlib'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_analysis_api_is_whole_and_its_functions_outlive_their_same_named_modules():
    """`analysis.winners` and `analysis.recommend` are functions in modules of the same names: importing those modules
    (as the report does) must not turn the package's names into the modules."""
    from harness import analysis

    importlib.import_module("harness.analysis.winners")
    importlib.import_module("harness.analysis.recommend")
    assert callable(analysis.winners) and callable(analysis.recommend)
    assert analysis.winners is importlib.import_module("harness.analysis.winners").winners
    assert all(getattr(analysis, name) is not None for name in analysis.__all__) and set(analysis.__all__) <= set(dir(analysis))
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        analysis.nosuch  # noqa: B018 - the attribute access is the test
