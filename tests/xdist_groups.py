"""`--dist loadgroup` that groups on every pytest: each test marked `xdist_group(name)` goes to the worker of its group.

pytest-xdist 3.8 tells its scheduler a test's group by renaming the test `nodeid@name` in the worker, through the
`_nodeid` attribute; pytest 9.2 keeps a node's id in a structured `_id` instead, so the renaming no longer takes and
every grouped test is spread over the workers as if unmarked, silently (pytest-xdist#1386). Here the renaming is done
after xdist's own attempt, only where that attempt did not take, and a pytest that changes its ids again stops the
session with a message instead of spreading the group. tests/test_xdist_groups.py runs a real `pytest -n 2` to hold it.

Registered by tests/conftest.py; a pytest run outside this folder loads it with `-p tests.xdist_groups`.
"""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The group name(s) of a test as xdist spells them (sorted, joined by `_`), or None when it has none."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


def module_fixture_group(item: pytest.Item) -> str | None:
    """`module::fixture` for the first module-scoped fixture that `item` uses and its own module defines, else None.

    Such a fixture is there because it is costly (a real run, a Ray head, a built venv); xdist would otherwise make it once
    on every worker that gets one of its tests, up to once per worker.
    """
    module = getattr(item, "module", None)
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        for definition in definitions.get(name, ()):
            if definition.scope == "module" and module is not None and getattr(definition.func, "__module__", None) == module.__name__:
                return f"{module.__name__}::{name}"
    return None


#: Markers of the tests that take longest, by rank: a test with none of them ranks after all of these.
LONGEST_MARKERS = (("compile",), ("slow", "e2e", "browser"))


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with the compile tests first, then the other slow ones, then the rest, each in collection order.

    xdist hands out ungrouped tests in collection order: a 50 s compile collected near the end (test_variants_check.py)
    started when the other workers had nothing left, and ran alone while they sat idle. Started first, it overlaps the many
    short tests instead. Each group keeps its own order, so a module's tests of a module-scoped fixture stay together.
    """
    def rank(item: pytest.Item) -> int:
        names = {mark.name for mark in item.iter_markers()}
        return next((i for i, markers in enumerate(LONGEST_MARKERS) if names.intersection(markers)), len(LONGEST_MARKERS))

    return sorted(items, key=rank)


def _rename(item: pytest.Item, nodeid: str) -> None:
    """Give `item` the id `nodeid`, whichever way this pytest keeps it."""
    if hasattr(item, "_id"):  # pytest >= 9.2: a structured id, whose string form is cached from the one parsed
        item._id = type(item._id).parse(nodeid)
    else:
        item._nodeid = nodeid
    if item.nodeid != nodeid:
        raise pytest.UsageError(f"cannot put {item.nodeid} in its xdist group: this pytest keeps node ids in a way "
                                "tests/xdist_groups.py does not know, and the group would be spread over the workers")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker under `--dist loadgroup`: suffix each grouped test's id with `@group` where xdist's own suffix did not take."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            _rename(item, f"{item.nodeid}@{group}")
