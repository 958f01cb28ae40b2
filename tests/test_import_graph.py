"""The harness's modules import one another without a circle.

Built from the source's syntax, not by importing: an edge is any `import` or `from … import` of a
harness module anywhere in a module: its top level, class bodies, `if`/`try` blocks, `if TYPE_CHECKING:`
and function bodies alike. A function-level import only defers a circle to the first call; a reader
must still untangle it, so it counts. (Deferred imports of optional extras such as Ray name no harness
module and are no edges.)
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "harness"


def module_name(path: Path) -> str:
    """`harness.run.worker` for harness/run/worker.py, `harness.run` for harness/run/__init__.py."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it stands (function bodies included)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The harness modules `name` imports anywhere (`from pkg import mod` counts as importing `pkg.mod`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in every_import(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name` takes a name of pkg itself.
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            # A module's own packages are always imported before it, whoever asks: not an edge of this module's making.
            if candidate and candidate != name and not name.startswith(candidate + "."):
                targets.add(candidate)
    return targets


def import_graph() -> dict[str, set[str]]:
    """Every harness module and the harness modules it imports, function-level imports included."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imported_modules(name, path, modules) for name, path in sorted(paths.items())}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as the list of its modules (first repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_sees_a_circle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_inside_functions_and_classes_are_edges_too(tmp_path, monkeypatch):
    """A circle through a function-level import is still a circle: the walk reads every import statement."""
    package = tmp_path / "harness"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("class K:\n    from harness.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    import harness.a\n")
    paths = {module_name_under(tmp_path, p): p for p in package.rglob("*.py")}
    graph = {name: imported_modules(name, path, set(paths)) for name, path in paths.items()}
    assert graph["harness.a"] == {"harness.sub.b"} and graph["harness.sub.b"] == {"harness.a"}
    assert find_cycle(graph) == ["harness.a", "harness.sub.b", "harness.a"]


def module_name_under(root: Path, path: Path) -> str:
    """`module_name` for a package under another root (a test's own tree)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: What reads rows never learns a column's meaning from what measures them: their words live with the record schema.
_READERS = ("harness.analysis", "harness.report")
_MEASURING = ("harness.measure", "harness.execution", "harness.telemetry", "harness.profiling")


def test_the_readers_of_records_import_nothing_from_the_code_that_measures():
    graph = import_graph()
    reaching = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith(_READERS)
                      for target in targets if target.startswith(_MEASURING))
    assert any(name.startswith("harness.report") for name in graph)  # the graph is read, not empty
    assert reaching == []


def test_no_harness_module_imports_itself_back_through_others():
    graph = import_graph()
    assert "harness.run.supervisor" in graph["harness.run.ray_executor"]  # the graph is read, not empty
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(n for n in import_graph() if not n.endswith("__main__")))  # __main__ runs the CLI
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


def test_every_harness_module_is_at_most_350_lines():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50  # the package is read, not empty
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


#: Where process-wide state may be set: a process's entry points (a command, a child job, a Ray task, the pytest
#: session, the point the process turns Ray driver), each by (module, function).
_PROCESS_ENTRY_POINTS = {
    ("harness.cli.check", "run_cli"), ("harness.run.worker", "main"), ("harness.run.pytest_plugin", "pytest_collection_finish"),
    ("harness.run.ray_tasks", "_freeze_once"), ("harness.run.ray_tasks", "_gc_freeze"), ("harness.run.ray_tasks", "_task_environment"),
    ("harness.run.ray_executor", "become_driver"),
}


def _process_wide_calls(tree: ast.Module) -> list[tuple[str, int]]:
    """(enclosing function, line) of each `gc.freeze()` call and each write to the environment (`os.environ[...] =`,
    `.update`, `.pop`, `.setdefault`, `os.putenv`) in a module; '' for the module's top level."""
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                owner = ast.unparse(child.func.value)
                if (owner, child.func.attr) in {("gc", "freeze"), ("os", "putenv")} or (
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
    planted = ast.parse("import gc, os\ndef helper():\n    gc.freeze()\n    os.environ['X'] = '1'\n")
    assert _process_wide_calls(planted) == [("helper", 3), ("helper", 4)]
