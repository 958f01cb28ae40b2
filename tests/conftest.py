"""Fixtures shared by the CPU tests."""

import gc
import os
from pathlib import Path

import pytest
import torch

# Ray (tests/test_ray_executor.py) binds to loopback only when this is set before it is imported:
# a test cluster must never listen on, or connect to, this machine's network address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: on a shared 2-core machine, intra-op threads only spin against each other (up to 60× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: The dtypes whose CPU ceilings the session measures once for every run it starts (the tests' suites use no others).
SESSION_PEAK_DTYPES = ("fp32", "bf16", "fp16")


@pytest.fixture(scope="session", autouse=True)
def peaks_measured_once(request, tmp_path_factory):
    """One measurement of this machine's ceilings that every run a test starts takes (`run --peaks`, through ATTNBENCH_PEAKS).

    Each CPU run would otherwise sweep products for ~3 s before its first pair, hundreds of times a session. xdist's
    workers share one file, made by the first to arrive while the others wait on its lock; it is the measurement an
    earlier session on this machine kept in pytest's cache (or, in a pytest a test starts, its outer session's file) where
    a run would take it, else measured now with the machine to itself, as far as the suite goes (tests/session_peaks.py).
    A run that needs what it lacks (another thread count, an FP8 ceiling) measures its own, as without it; tests of the
    measurement call it directly and are untouched.
    """
    import fcntl

    from harness.run.protocol import atomic_write
    from harness.telemetry.peaks_reuse import PEAKS_ENV
    from tests.session_peaks import CACHE_NAME, session_peaks

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "session-peaks.json"
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    before = os.environ.get(PEAKS_ENV)
    with open(shared / "session-peaks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            inherited = Path(before) if before else None  # a pytest started by a test: its outer session's file
            atomic_write(path, session_peaks(cache.mkdir(CACHE_NAME) if cache is not None else None, SESSION_PEAK_DTYPES,
                                             inherited))
    os.environ[PEAKS_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(PEAKS_ENV, None)
    else:
        os.environ[PEAKS_ENV] = before


@pytest.fixture(autouse=True)
def collect_only_what_the_test_made():
    """Freeze the heap alive when a test starts, and thaw it after: in-process runs call gc.collect() once per pair.

    With torch, pandas, matplotlib and every collected test alive, one full collection walks the whole
    heap (a quarter of a second late in a session, more than the pair it follows); frozen objects are
    skipped, and the garbage a pair leaves is all younger than the freeze. Unlike the suites' plugin
    (harness.run.pytest_plugin), nothing stays frozen: after the test every survivor is collectable again.
    """
    gc.freeze()
    yield
    gc.unfreeze()


#: What pytest-xdist tells its workers. A pytest that a test starts (the suites' pytest route) must not inherit them:
#: pytest-benchmark reads PYTEST_XDIST_WORKER and disables itself, as it should under xdist, but that inner run is no worker.
XDIST_WORKER_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


@pytest.fixture
def outside_xdist(monkeypatch):
    """This test's environment (and its children's) without the xdist worker's variables: a pytest run inside it is its own."""
    for name in XDIST_WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


#: The tests that hold the GPU adapters to the real libraries' own code (installed or downloaded by `make test`).
LIBRARY_TESTS = ("test_flashinfer_library.py", "test_flash_attn_library.py", "test_xformers_library.py")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped real-library test fails: there, a missing library source is a broken set-up, not a machine without it."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _in_ci() and item.path.name in LIBRARY_TESTS:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where make test installs what it reads: {report.longrepr}"


def pytest_configure(config):
    """Load tests/xdist_groups.py, which keeps `--dist loadgroup` grouping where pytest-xdist's own renaming does not take."""
    from tests import xdist_groups

    if not config.pluginmanager.is_registered(xdist_groups):
        config.pluginmanager.register(xdist_groups, "tests.xdist_groups")


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """Collect what the session left once, then freeze the heap: the collections that follow (pytest's unraisable-exception
    hook and cleanup, each a full collection, then the interpreter's exit) walk only what is made after this, not torch,
    pandas and every collected test. Seen with faulthandler: each full collection took 1-2.5 s at the end of a `make test`
    worker under load, while the run waited for its last worker. First, so that pytest's hook still reports an
    unraisable exception raised in this collection."""
    gc.collect()
    gc.freeze()


#: Markers whose tests share something one machine holds once (a Ray head, a PostgreSQL server, inductor's on-disk cache):
#: under pytest-xdist's `--dist loadgroup` each group runs on one worker, so two never start side by side. Compiles share
#: graphs through the cache only once the first has finished: started side by side (the longest-first order starts every
#: worker on one), a cold cache compiled three flex kernels twice, about 6 CPU-s each, half of it g++.
SHARED_SERVICE_GROUPS = ("ray", "postgres", "compile")
#: The fixtures that start such a service: a test that asks for one carries its marker whether or not it says so.
SERVICE_FIXTURES = {"ray_cluster": "ray", "postgres_base": "postgres"}
#: Parametrized fixtures one of whose values asks for such a service at run time (getfixturevalue: unseen by fixturenames).
SERVICE_PARAMS = {("db_target", "postgresql"): "postgres"}


#: Module-scoped fixtures cheap enough to make once on each worker, whose many tests are better spread than grouped.
SPREAD_MODULE_FIXTURES = ("registry", "cells")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tests that use a shared service's fixture, and put each in that service's xdist group (before xdist reads them);
    put the tests of each costly module-scoped fixture (a real run, a built venv) in a group of their own, so it is made once
    (tests/xdist_groups.py then puts the longest tests first, so none runs alone at the end)."""
    from tests.xdist_groups import module_fixture_group

    for item in items:
        for fixture, marker in SERVICE_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, marker))
        params = getattr(getattr(item, "callspec", None), "params", {})
        for (name, value), marker in SERVICE_PARAMS.items():
            if params.get(name) == value:
                item.add_marker(getattr(pytest.mark, marker))
        for group in SHARED_SERVICE_GROUPS:
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
        else:
            shared = module_fixture_group(item)
            if shared is not None and shared.rsplit("::", 1)[1] not in SPREAD_MODULE_FIXTURES:
                item.add_marker(pytest.mark.xdist_group(shared))
