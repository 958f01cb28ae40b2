"""The harness's modules import one another without a circle.

Built from the source's syntax, not by importing: an edge is an `import` or `from … import` of a
harness module in a module's top level (class bodies and `if`/`try` blocks included, since they run
at import time; `if TYPE_CHECKING:` too, since a circle there is one a reader must still untangle).
Imports inside functions are deferred on purpose (Ray, an optional extra) and are not edges.
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


def top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: everything outside function bodies."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The harness modules `name` imports at its top level (`from pkg import mod` counts as importing `pkg.mod`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in top_level_imports(ast.parse(path.read_text(), str(path))):
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
    """Every harness module and the harness modules it imports at its top level."""
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


def test_function_level_imports_are_not_edges_and_class_level_ones_are():
    source = ("import harness.a\nclass K:\n    from harness import b\n"
              "def f():\n    import harness.c\nif True:\n    from harness.d import thing\n")
    tree = ast.parse(source)
    names = sorted(n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in top_level_imports(tree))
    assert names == ["harness", "harness.a", "harness.d"]  # `from harness import b` names module harness, alias b


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
