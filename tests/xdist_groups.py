"""`--dist loadgroup` that groups on every pytest: each test marked `xdist_group(name)` goes to the worker of its group.

pytest-xdist 3.8 tells its scheduler a test's group by renaming the test `nodeid@name` in the worker, through the
`_nodeid` attribute; pytest 9.2 keeps a node's id in a structured `_id` instead, so the renaming no longer takes and
every grouped test is spread over the workers as if unmarked, silently (pytest-xdist#1386). Here the renaming is done
after xdist's own attempt, only where that attempt did not take, and a pytest that changes its ids again stops the
session with a message instead of spreading the group. tests/test_xdist_groups.py runs a real `pytest -n 2` to hold it.

Each worker also collects the longest tests first (longest_first: by marker, then by the seconds each took in the last
session, which the controller keeps in pytest's cache and hands every worker), so no long test starts last and runs alone.
A session whose cache has none yet (a fresh clone, CI) orders by tests/test_seconds.json, the long tests' seconds kept
beside the tests as pytest-split keeps its durations; `python -m tests.xdist_groups` rewrites it from the cache.

Registered by tests/conftest.py; a pytest run outside this folder loads it with `-p tests.xdist_groups`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

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
#: pytest's cache key of each test's seconds (setup, call and teardown) in the last session that ran it, by node id.
SECONDS_KEY = "attnbench/test-seconds"
#: The seconds of each test that took SEED_MIN_S or more in one `make test` on the project's 2-core machine, by node id: the
#: order of a session whose pytest cache has none (a fresh clone orders by markers alone: on one clone, 297 s so against 277).
SEED_PATH = Path(__file__).with_name("test_seconds.json")
SEED_MIN_S = 1.0


def seed_seconds() -> dict[str, float]:
    """The long tests' seconds kept beside the tests (SEED_PATH), {} where the file is absent."""
    try:
        return json.loads(SEED_PATH.read_text())
    except FileNotFoundError:
        return {}


def marker_rank(item: pytest.Item) -> int:
    """The index in LONGEST_MARKERS of the first rank whose marker `item` carries; len(LONGEST_MARKERS) with none."""
    names = {mark.name for mark in item.iter_markers()}
    return next((i for i, markers in enumerate(LONGEST_MARKERS) if names.intersection(markers)), len(LONGEST_MARKERS))


def longest_first(items: list[pytest.Item], seconds: Mapping[str, float] | None = None) -> list[pytest.Item]:
    """`items` with the compile tests first, then the other slow ones, then the rest; within each rank the longest by
    `seconds` (the last session's, by node id) first, and those it lacks after them, in collection order.

    xdist hands out ungrouped tests in collection order: a 50 s compile collected near the end (test_variants_check.py)
    started when the other workers had nothing left, and ran alone while they sat idle. Started first, it overlaps the many
    short tests instead. A group's tests still go to one worker together, so a module-scoped fixture is still made once.
    """
    seconds = seconds or {}
    return sorted(items, key=lambda item: (marker_rank(item), -seconds.get(item.nodeid, 0.0)))


class SecondsKept:
    """In the process that reports the session (xdist's controller, or a pytest without workers): each test's seconds,
    kept in pytest's cache at the end beside those of the tests this session did not run (make test-fast runs a part)."""

    def __init__(self, cache: Any) -> None:
        # Read once: every worker must get the same seconds (a session ending beside this one may rewrite them), or xdist
        # would see two orders and stop the run.
        self.cache, self.kept, self.seconds = cache, cache.get(SECONDS_KEY, {}), {}
        self.handed = {**seed_seconds(), **self.kept}  # this machine's own seconds before the committed ones

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist's controller starting a worker: hand it the last sessions' seconds, so every worker orders its tests alike."""
        node.workerinput[SECONDS_KEY] = self.handed

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add a phase's seconds to its test's."""
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        """Keep this session's seconds, the others' where this session ran no such test."""
        if self.seconds:
            self.cache.set(SECONDS_KEY, {**self.kept, **{k: round(v, 3) for k, v in self.seconds.items()}})


def pytest_configure(config: pytest.Config) -> None:
    """Outside xdist's workers, with pytest's cache on: keep each test's seconds for the next session's order."""
    cache = getattr(config, "cache", None)
    if cache is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(SecondsKept(cache), "tests.xdist_groups.seconds")


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
    """In an xdist worker under `--dist loadgroup`: suffix each grouped test's id with `@group` where xdist's own suffix did not
    take, then put the longest tests first (longest_first), by the seconds the controller handed over."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            _rename(item, f"{item.nodeid}@{group}")
    # After the renaming: the seconds kept are by the ids the controller saw, suffixes included.
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        items[:] = longest_first(items, workerinput.get(SECONDS_KEY))


def write_seed(cache_file: Path) -> int:
    """Rewrite SEED_PATH from a session's seconds (pytest's cache file of SECONDS_KEY): the tests of SEED_MIN_S or more."""
    try:
        seconds = json.loads(cache_file.read_text())
    except (OSError, ValueError) as exc:
        print(f"tests.xdist_groups: cannot read the seconds of a session from {cache_file}: {exc}", file=sys.stderr)
        return 2
    long = {nodeid: round(s, 1) for nodeid, s in sorted(seconds.items()) if s >= SEED_MIN_S}
    SEED_PATH.write_text(json.dumps(long, indent=0, sort_keys=True) + "\n")
    print(f"{SEED_PATH}: {len(long)} tests of {SEED_MIN_S:g} s or more, of {len(seconds)}")
    return 0


if __name__ == "__main__":
    # After a whole `make test` on the 2-core machine: python -m tests.xdist_groups [.pytest_cache/v/attnbench/test-seconds]
    sys.exit(write_seed(Path(sys.argv[1] if len(sys.argv) > 1 else ".pytest_cache/v/" + SECONDS_KEY)))
