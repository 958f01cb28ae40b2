"""The harness's packages stand on floors: a package imports only from its own floor and the floors below it.

The table is the house plan (docs/DESIGN.md draws it): where a new helper goes is the lowest floor whose packages
it needs. It lives here, not in harness/, because only this test reads it: nothing in attnbench decides anything by a
package's floor. The walk reads every import statement (tests/import_walk.py: function-level and TYPE_CHECKING ones too), and
a backward one fails naming its file and line; packages sharing a floor may import each other, but not both ways round.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_walk import PACKAGE, ROOT, find_cycle, import_edges, import_graph, module_paths

#: The floors, lowest first: (name, what its packages do, the packages and top-level modules on it).
FLOORS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ground", "plain tools every floor uses: errors, safe file reads, the machine's fingerprint, starting a child process",
     ("harness", "errors", "compat", "private_api", "files", "env", "process", "child")),
    ("model", "what a run is asked and what it records: cases, suites, budgets, inputs; options, records, documents",
     ("suite", "results")),
    ("compute", "attention itself: the reference and its numerics, and every backend that computes it",
     ("attention", "backends")),
    ("measurement", "instruments: timing and its stopping rule, GPU telemetry and energy, the profiler",
     ("telemetry", "profiling", "measure")),
    ("execution", "one (case, backend) pair run through its phases into a record",
     ("execution",)),
    ("readers", "what rows mean: analysis, the report, the history database and site",
     ("analysis", "policy", "report", "history")),
    ("drivers", "many pairs and processes: the run and its workers, the checks, one pair profiled",
     ("run", "checks")),
    ("cli", "the `attnbench` command: arguments and printing only",
     ("cli", "__main__")),
)


def unit_of(module: str) -> str:
    """The floor table's name for a module: its package under harness/ (`run` for harness.run.worker), a top-level
    module's own name (`errors`), or `harness` for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floor_of(unit: str, floors=FLOORS) -> int | None:
    """The index of the floor a package stands on, or None when the table does not place it."""
    return next((i for i, (_, _, units) in enumerate(floors) if unit in units), None)


def backward_imports(package: Path = PACKAGE, floors=FLOORS) -> list[str]:
    """`file:line: package (floor) imports module (floor, above)` for each import from a higher floor, file order."""
    paths = module_paths(package)
    found: dict[str, None] = {}  # one line per statement and module, in file order (`from m import a, b` is one)
    for name, path in paths.items():
        here = floor_of(unit_of(name), floors)
        for target, line in import_edges(name, path, set(paths)):
            there = floor_of(unit_of(target), floors)
            if here is not None and there is not None and there > here:
                found[f"{path.relative_to(package.parent)}:{line}: {unit_of(name)} ({floors[here][0]}) imports {target} "
                      f"({floors[there][0]}, above)"] = None
    return list(found)


def package_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Which packages each package imports (its modules' imports, grouped)."""
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph(package).items():
        graph.setdefault(unit_of(name), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(name))
    return graph


def test_every_package_stands_on_one_floor():
    """A new package must be placed: the table is the plan, not a partial list."""
    units = {unit_of(name) for name in module_paths()}
    placed = [unit for _, _, floor in FLOORS for unit in floor]
    assert {"run", "suite", "errors", "harness"} <= units  # the package is read, not empty
    assert len(placed) == len(set(placed)), "a package on two floors"
    assert sorted(units - set(placed)) == [] and sorted(set(placed) - units) == []


def test_no_package_imports_from_a_higher_floor():
    backward = backward_imports()
    assert backward == [], "imports from a higher floor:\n" + "\n".join(backward)


def test_packages_import_each_other_without_a_knot():
    """Within a floor packages may import each other, one way only: no package reaches itself back through others."""
    graph = package_graph()
    assert "suite" in graph["results"] and "results" in graph["run"]  # the graph is read, not empty
    cycle = find_cycle(graph)
    assert cycle is None, "package knot: " + " -> ".join(cycle)


def test_no_harness_module_imports_itself_back_through_others():
    """Inside a package too: with the packages knot-free, a circle of modules could only lie within one package."""
    graph = import_graph()
    assert "harness.run.supervisor" in graph["harness.run.ray_executor"]  # the graph is read, not empty
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def _planted_tree(tmp_path: Path) -> Path:
    """A tiny harness/ with a ground package `low` and a higher `high`: `low/a.py` imports `high` inside a function."""
    package = tmp_path / "harness"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("import os\n\n\ndef f():\n    from harness.high import b\n    return b\n")
    (package / "high" / "b.py").write_text("from harness.low.a import f\n")
    return package


def test_a_backward_import_inside_a_function_is_named_by_file_and_line(tmp_path):
    package = _planted_tree(tmp_path)
    floors = (("ground", "", ("harness", "low")), ("top", "", ("high",)))
    assert backward_imports(package, floors) == ["harness/low/a.py:5: low (ground) imports harness.high.b (top, above)"]
    assert backward_imports(package, (("ground", "", ("harness", "low", "high")),)) == []  # one floor: nothing is above
    assert find_cycle(package_graph(package)) == ["high", "low", "high"]


def test_imports_inside_functions_and_classes_are_edges_too(tmp_path):
    """A circle through a function-level import is still a circle: the walk reads every import statement."""
    package = tmp_path / "harness"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("class K:\n    from harness.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    import harness.a\n")
    graph = import_graph(package)
    assert graph["harness.a"] == {"harness.sub.b"} and graph["harness.sub.b"] == {"harness.a"}
    assert find_cycle(graph) == ["harness.a", "harness.sub.b", "harness.a"]


def test_the_cycle_finder_sees_a_circle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


#: What reads rows never learns a column's meaning from what measures them: their words live with the record schema
#: (a stricter rule than the floors, which would let the readers import the measurement floor below them).
_READERS = ("harness.analysis", "harness.report")
_MEASURING = ("harness.measure", "harness.execution", "harness.telemetry", "harness.profiling")


def test_the_readers_of_records_import_nothing_from_the_code_that_measures():
    graph = import_graph()
    reaching = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith(_READERS)
                      for target in targets if target.startswith(_MEASURING))
    assert any(name.startswith("harness.report") for name in graph)  # the graph is read, not empty
    assert reaching == []


@pytest.mark.parametrize("floor", [f[0] for f in FLOORS])
def test_docs_design_draws_every_floor_with_its_packages(floor):
    """docs/DESIGN.md's drawing names each floor and every package on it, so the plan a reader sees is this table."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    drawing = design[design.index("## Floors"):]
    drawing = drawing[:drawing.index("\n## ", 3)]
    (line,) = [ln for ln in drawing.splitlines() if ln.strip().startswith(f"{floor}:")] or [None]
    assert line is not None, f"floor {floor!r} not drawn"
    units = dict((f[0], f[2]) for f in FLOORS)[floor]
    assert [u for u in units if u not in line] == []
