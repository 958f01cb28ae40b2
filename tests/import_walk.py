"""The harness's imports read from its source's syntax, not by importing: every `import` and `from … import` statement of
a module, wherever it stands (top level, class bodies, `if`/`try` blocks, `if TYPE_CHECKING:`, function bodies).

A function-level import only defers a knot to the first call; a reader must still untangle it, so it counts. (Deferred
imports of optional extras such as Ray name no harness module and are no edges; the child-job table names its modules as
strings, which is no import either.)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "harness"


def module_name(path: Path, root: Path = ROOT) -> str:
    """`harness.run.worker` for harness/run/worker.py, `harness.run` for harness/run/__init__.py."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it stands (function bodies included)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


@functools.lru_cache(maxsize=None)
def _imports_of(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """A file's import statements, parsed once per test process (several tests walk the same tree)."""
    return tuple(every_import(ast.parse(path.read_text(), str(path))))


def import_edges(name: str, path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(harness module imported, line) for each import of another harness module in `name` (`from pkg import mod` imports
    the module pkg.mod; `from pkg import name` takes a name of pkg itself)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: list[tuple[str, int]] = []
    for node in _imports_of(path):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            # A module's own packages are always imported before it, whoever asks: not an edge of this module's making.
            if candidate and candidate != name and not name.startswith(candidate + "."):
                edges.append((candidate, node.lineno))
    return edges


def module_paths(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package (under `package`'s parent as root) by its dotted name."""
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every harness module and the harness modules it imports, function-level imports included."""
    paths = module_paths(package)
    return {name: {target for target, _ in import_edges(name, path, set(paths))} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as the list of its nodes (first repeated at the end), or None."""
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
