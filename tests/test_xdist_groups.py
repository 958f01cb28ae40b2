"""`make test`'s `--dist loadgroup` keeps each group on one worker (tests/xdist_groups.py), checked with a real `pytest -n 2`:
a service's tests, grouped by the fixture they use, and a costly module-scoped fixture's, which is then made once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.cli_runs import ROOT
from tests.xdist_groups import SEED_MIN_S, marker_rank, seed_seconds

#: A folder of tests: eight share a service by a fixture (grouped by its conftest, as tests/conftest.py groups Ray's), six a
#: module-scoped fixture that notes each making of it, eight neither.
SERVICE_TESTS = '''
import os
import time
import pytest

@pytest.fixture(scope="module")
def costly():
    with open(os.environ["MADE"], "a") as made:
        made.write("made\\n")

@pytest.mark.parametrize("i", range(6))
def test_uses_the_costly_fixture(costly, i):
    time.sleep(0.05)

@pytest.fixture
def service():
    return "one per machine"

@pytest.mark.parametrize("i", range(8))
def test_uses_the_service(service, i):
    time.sleep(0.05)

@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    time.sleep(0.05)
'''
GROUPING_CONFTEST = '''
import pytest
from tests.xdist_groups import module_fixture_group

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if "service" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("service"))
        elif module_fixture_group(item):
            item.add_marker(pytest.mark.xdist_group(module_fixture_group(item)))
'''


def test_a_group_added_at_collection_runs_on_one_worker(tmp_path):
    (tmp_path / "test_service.py").write_text(SERVICE_TESTS)
    (tmp_path / "conftest.py").write_text(GROUPING_CONFTEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # the inner pytest is no xdist worker of ours
    env.update(PYTHONPATH=str(ROOT), MADE=str(tmp_path / "made.txt"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.xdist_groups", "-n", "2",
                           "--dist", "loadgroup", "-v", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    workers = defaultdict(set)
    for worker, test in re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout, re.M):
        workers[test.split("::")[1].split("[")[0]].add(worker)
        if "uses_the_service" in test:
            assert test.endswith("@service"), test  # the id xdist's scheduler groups by
        if "costly" in test:
            assert test.endswith("@test_service::costly"), test
    assert sum(1 for line in done.stdout.splitlines() if " PASSED " in line) == 22, done.stdout[-3000:]
    assert len(workers["test_uses_the_service"]) == len(workers["test_uses_the_costly_fixture"]) == 1, done.stdout[-3000:]
    assert (tmp_path / "made.txt").read_text() == "made\n"


#: Tests of each rank, interleaved: longest_first must move the compiles, then the slow ones, ahead of the rest.
RANKED_TESTS = '''
import pytest

def test_quick_a():
    pass

@pytest.mark.slow
def test_slow_a():
    pass

@pytest.mark.compile
def test_compile_a():
    pass

def test_quick_b():
    pass

@pytest.mark.e2e
def test_end_to_end():
    pass

@pytest.mark.slow
@pytest.mark.compile
def test_compile_b():
    pass
'''
ORDERING_CONFTEST = '''
import json, os
from tests.xdist_groups import longest_first

def pytest_collection_modifyitems(items):
    items[:] = longest_first(items, json.loads(os.environ["SECONDS"]))
'''


@pytest.mark.parametrize("seconds, order", [
    ({}, ["test_compile_a", "test_compile_b", "test_slow_a", "test_end_to_end", "test_quick_a", "test_quick_b"]),
    # Within a rank the longest of the last session first; the marker's rank still comes before the seconds.
    ({"test_ranked.py::test_compile_b": 9.0, "test_ranked.py::test_end_to_end": 1.0, "test_ranked.py::test_quick_b": 50.0},
     ["test_compile_b", "test_compile_a", "test_end_to_end", "test_slow_a", "test_quick_b", "test_quick_a"]),
], ids=["markers", "markers-then-seconds"])
def test_the_longest_tests_are_collected_first(tmp_path, outside_xdist, monkeypatch, seconds, order):
    (tmp_path / "test_ranked.py").write_text(RANKED_TESTS)
    (tmp_path / "conftest.py").write_text(ORDERING_CONFTEST)
    monkeypatch.setenv("SECONDS", json.dumps(seconds))

    class Collected:
        names: list[str] = []

        def pytest_collection_finish(self, session):
            self.names = [item.name for item in session.items]

    collected = Collected()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--import-mode=importlib",
                        "--rootdir", str(tmp_path), "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
                       plugins=[collected])
    assert code == 0
    assert collected.names == order


#: A test that writes what its worker was handed: the seconds the controller kept from the session before.
HANDED_TESTS = '''
import json, os, time

def test_long(request):
    time.sleep(0.3)
    with open(os.environ["HANDED"] + "." + os.environ["PYTEST_XDIST_WORKER"], "w") as out:
        json.dump(request.config.workerinput.get("attnbench/test-seconds"), out)

def test_short():
    pass
'''


@pytest.mark.slow
def test_the_controller_keeps_each_tests_seconds_and_hands_them_to_every_worker_of_the_next_session(tmp_path):
    (tmp_path / "test_handed.py").write_text(HANDED_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(ROOT), HANDED=str(tmp_path / "handed"))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.xdist_groups", "-n", "2", "--dist", "loadgroup",
               "--rootdir", str(tmp_path), str(tmp_path)]
    for session in ("first", "second"):
        for old in tmp_path.glob("handed.gw*"):
            old.unlink()
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, session + done.stdout[-3000:] + done.stderr[-2000:]
        handed = [json.loads(p.read_text()) for p in tmp_path.glob("handed.gw*")]
        if session == "first":
            assert handed == [seed_seconds()], handed  # nothing kept yet: the committed seconds alone
    mine = {"test_handed.py::test_long", "test_handed.py::test_short"}
    assert len(handed) == 1 and set(handed[0]) == mine | set(seed_seconds()), set(handed[0]) - set(seed_seconds())
    # The sleep bounds the long test's seconds from below; nothing bounds an empty test's on a busy machine but zero.
    assert handed[0]["test_handed.py::test_long"] >= 0.3 and handed[0]["test_handed.py::test_short"] >= 0.0, handed


def test_the_committed_seconds_name_long_tests_of_this_suite():
    """tests/test_seconds.json orders a session with no cache: each entry a test function this suite still has, of SEED_MIN_S
    or more (a renamed test would only lose its place in the order, silently: `python -m tests.xdist_groups` rewrites them)."""
    seed = seed_seconds()
    assert len(seed) >= 50 and all(isinstance(s, float) and s >= SEED_MIN_S for s in seed.values())
    missing = []
    for nodeid in seed:
        path, _, rest = nodeid.partition("::")
        function = re.split(r"[\[@]", rest)[0]
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^def {re.escape(function)}\(", source.read_text(), re.M):
            missing.append(nodeid)
    assert not missing, missing[:5]


def test_this_sessions_workers_collect_each_rank_of_marker_after_the_longer_ones(request):
    if not hasattr(request.config, "workerinput"):
        pytest.skip("the order is changed only in an xdist worker (make test, make test-fast)")
    ranks = [marker_rank(item) for item in request.session.items]
    assert ranks == sorted(ranks), "a longer test is collected after a shorter one"
