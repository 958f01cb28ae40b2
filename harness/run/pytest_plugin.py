"""The pytest plugin that turns a suite into tests: one per (case, backend), measured through pytest-benchmark.

pytest-benchmark drives the timed rounds (`benchmark.pedantic`) with the harness's clock (device
time from CUDA events on a GPU), so the statistics pytest-benchmark reports and the record holds
are the same samples: there is one measurement path.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.errors import UserError
from harness.run import protocol
from harness.run.cooldown import worker_cooldown
from harness.run.repro import RunRows
from harness.run.rundir import RunFolder
from harness.measure.execute import PairRunner, Phases, execute
from harness.measure.failures import poisons_process
from harness.results.record import Record
from harness.results.store import RunWriter
from harness.suite.catalog import Suite, load_suite, pair_key
from harness.measure.timing import Clock, Loop

CURRENT_SUFFIX = protocol.CURRENT_SUFFIX


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options of the benchmark workers (`attnbench run` sets them)."""
    group = parser.getgroup("attnbench")
    group.addoption("--attnbench-suite", default=None, help="built-in suite name or .toml file to run as tests")
    group.addoption("--attnbench-run-dir", default=None, help="folder of the run (records.jsonl is appended there)")
    group.addoption("--attnbench-backends", default=None, help="comma-separated backend names (default: the suite's)")
    group.addoption("--attnbench-device", default=None, help="move every case to this device (cpu or cuda)")
    group.addoption("--attnbench-pairs", default=None, help="file listing the pair keys to run, one per line")
    group.addoption("--attnbench-worker", default="0", help="this worker's name in records")
    group.addoption("--attnbench-no-check", action="store_true", help="skip the agreement check")
    group.addoption("--attnbench-profile", action="store_true", help="one profiled pass per pair after its timed samples")
    group.addoption("--attnbench-energy", action="store_true", help="the energy phase per pair (harness.measure.energy)")
    group.addoption("--attnbench-timer", default="events", choices=("events", "kernels", "graph"), help="what a sample is (harness.measure.timers)")
    group.addoption("--attnbench-traces", default=None, help="with --attnbench-profile: folder for one Chrome trace per pair")
    group.addoption("--attnbench-share", action="store_true",
                    help="share the pairs with other workers of the run folder: run only pairs this worker claims first")
    group.addoption("--attnbench-parent-pid", type=int, default=None, help="exit when this process (the supervisor) is gone")
    group.addoption("--attnbench-memory-limit", type=int, default=None,
                    help="cap this worker's address space at its start-up size plus this many bytes (RLIMIT_AS)")
    group.addoption("--attnbench-cooldown", type=float, default=None,
                    help="before each pair, wait up to this many seconds for the GPU to cool to its idle temperature")


def benchmark_loop(benchmark: Any, clock: Clock) -> Loop:
    """A Loop that runs the rounds through pytest-benchmark's pedantic mode, reading `clock`."""

    def loop(fn, *, setup, rounds, iterations):
        if benchmark.disabled:
            raise UserError("pytest-benchmark is disabled (--benchmark-disable): nothing would be timed")
        # pytest-benchmark reads its timer from this private attribute when it builds each round's runner
        # (pinned by tests/test_pytest_benchmark_contract.py);
        # setting it per test is how a device clock (CUDA events) replaces time.perf_counter.
        benchmark._timer = clock
        benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=iterations, warmup_rounds=0)
        return list(benchmark.stats.stats.data)

    return loop


def selected_pairs(config: pytest.Config) -> tuple[Suite, Any, list[tuple[Case, str]]]:
    """The suite, the registry and the (case, backend) pairs the --attnbench-* options select.

    A supervised run's pairs and budget are its folder's (`RunFolder.pairs`, `.budget`), never its suite's
    again (the suite may have changed since the run began): the Suite returned then holds those cases and that budget.
    """
    run_dir = config.getoption("--attnbench-run-dir")
    folder = RunFolder.read(Path(run_dir)) if run_dir else None
    if folder is not None:
        return _folder_pairs(config, folder)
    suite = load_suite(config.getoption("--attnbench-suite"))
    device = config.getoption("--attnbench-device")
    if device:
        suite = suite.on_device(device)
    registry = load_registry()
    backends_opt = config.getoption("--attnbench-backends")
    names = suite.backend_names(backends_opt.split(",") if backends_opt else None, registry.names())
    for name in names:
        registry.get(name)  # unknown names fail here, before any test
    pairs = suite.pairs(names)
    pairs_file = config.getoption("--attnbench-pairs")
    if pairs_file:
        # In the file's order, not the suite's: the run's order (harness.run.order) is the manifest's, pending.txt keeps it.
        by_key = {pair_key(*p): p for p in pairs}
        pairs = [by_key[k] for k in dict.fromkeys(Path(pairs_file).read_text().split()) if k in by_key]
    return suite, registry, pairs


def _folder_pairs(config: pytest.Config, folder: RunFolder) -> tuple[Suite, Any, list[tuple[Case, str]]]:
    """The pairs of a run folder the --attnbench-backends/--attnbench-pairs options select, in the run's order."""
    registry = load_registry()
    backends_opt = config.getoption("--attnbench-backends")
    names = backends_opt.split(",") if backends_opt else [b for b in folder.document.backends if b not in folder.broken]
    for name in names:
        registry.get(name)  # unknown names fail here, before any test
    by_key = folder.pairs()
    pairs_file = config.getoption("--attnbench-pairs")
    keys = dict.fromkeys(Path(pairs_file).read_text().split()) if pairs_file else by_key
    pairs = [by_key[k] for k in keys if k in by_key and by_key[k][1] in names]
    suite = Suite(str(folder.document.suite or folder.run_id), "", tuple(dict.fromkeys(c for c, _ in pairs)), tuple(names), folder.budget)
    return suite, registry, pairs


class AttnbenchSession:
    """What one worker needs: the suite, the registry, the run folder and its writer."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.suite: Suite | None = None
        self.pairs: list[tuple[Case, str]] = []
        suite_name = config.getoption("--attnbench-suite")
        if not suite_name:
            return
        self.suite, self.registry, self.pairs = selected_pairs(config)
        suite = self.suite
        run_dir = config.getoption("--attnbench-run-dir")
        if run_dir is None:
            from harness.run.rundir import new_run_id

            run_dir = str(Path("results") / new_run_id(suite.slug))
        self.run_dir = Path(run_dir)
        self.writer = RunWriter(self.run_dir)
        self.worker = config.getoption("--attnbench-worker")
        self.run_id = self.run_dir.name
        # One runner for the worker's life: its float64 reference is shared by the backends of a case.
        traces = config.getoption("--attnbench-traces")
        phases = Phases(check=not config.getoption("--attnbench-no-check"), profile=bool(config.getoption("--attnbench-profile")),
                        timer=config.getoption("--attnbench-timer"), energy=bool(config.getoption("--attnbench-energy")),
                        traces=Path(traces) if traces else None)
        self.runner = PairRunner(budget=suite.budget, phases=phases)
        self.current_path = protocol.current_path(self.run_dir, self.worker)
        self.share = bool(config.getoption("--attnbench-share"))
        self.rows = _run_rows(self.run_dir)
        cooldown_s = config.getoption("--attnbench-cooldown")
        self.cooldown = worker_cooldown(cooldown_s, self.run_dir) if cooldown_s is not None else None
        # Held until this process ends: a supervisor refuses to (re)start the folder while any worker lives.
        self._workers_lock = protocol.FolderLock(self.run_dir / protocol.WORKERS_LOCK)
        self._workers_lock.shared()
        parent = config.getoption("--attnbench-parent-pid")
        if parent is not None:
            protocol.watch_parent(parent)
        limit = config.getoption("--attnbench-memory-limit")
        if limit is not None:
            cap = protocol.limit_address_space(limit)
            _say(config, f"attnbench worker {self.worker}: address space capped at {cap / 2**30:.2f} GiB")

    def claim(self, key: str) -> bool:
        """Whether this worker should run pair `key`: always alone, first come first served when sharing."""
        return not self.share or protocol.try_claim(self.run_dir, key, self.worker)

    def run(self, case: Case, backend_name: str, benchmark: Any) -> Record:
        """Measure one pair, append its record, and return it."""
        backend = self.registry.get(backend_name)
        # Before the pair is named current: a cool-down is not the pair's time, so it never counts against its --timeout.
        waited = self.cooldown.wait() if self.cooldown is not None else None
        # Say which pair is running before starting it, so a supervisor can name a crash.
        protocol.atomic_write(self.current_path, pair_key(case, backend_name))
        runner = replace(self.runner, loop_factory=lambda clock: benchmark_loop(benchmark, clock))
        record = execute(case, backend, runner, self.run_id, self.worker)
        if self.rows is not None:
            self.rows.stamp(record)
        if waited is not None:
            record.cooldown_s = waited.seconds
            if waited.problem:
                record.notes = {**(record.notes or {}), "cooldown": waited.problem}
        # What survived the pair's collection is alive on purpose (imports, caches, pytest's reports):
        # frozen, the next pair's full collection walks only what that pair creates (85 ms -> ~1 ms a pair).
        gc.freeze()
        benchmark.extra_info.update({"case_id": case.id, "backend": backend_name, "status": record.status.value})
        try:
            self.writer.append(record)
            protocol.atomic_write(self.current_path, "")
        except OSError as exc:
            # Measuring on would lose every later row too: stop, and let the supervisor say so once.
            _say(self.config, f"attnbench worker {self.worker}: cannot write to {self.run_dir}: {exc.strerror or exc}")
            os._exit(protocol.EXIT_CANNOT_WRITE)
        if poisons_process(record):
            # The record is on disk; nothing else can run in this process (a dead CUDA context), so end it
            # here and let the supervisor start a fresh worker on the remaining pairs.
            _say(self.config, f"attnbench worker {self.worker}: {record.reason}; exiting for a restart")
            os._exit(protocol.EXIT_STICKY)
        return record


def _run_rows(run_dir: Path) -> RunRows | None:
    """The stamper of a supervised run's rows (from its manifest); None for a bare pytest session, which has no manifest."""
    folder = RunFolder.read(run_dir)
    if folder is None:
        return None
    return RunRows(folder.manifest, folder.suite_arg, folder.pairs())


def _say(config: pytest.Config, text: str) -> None:
    """A line in the worker's log, past pytest's output capture (which would swallow it, or lose it at os._exit)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    with capture.global_and_fixture_disabled():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


_SESSION_KEY = pytest.StashKey[AttnbenchSession]()


def _session(config: pytest.Config) -> AttnbenchSession:
    if _SESSION_KEY not in config.stash:
        try:
            config.stash[_SESSION_KEY] = AttnbenchSession(config)
        except UserError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[_SESSION_KEY]


_CHECK_KEY = pytest.StashKey[tuple]()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise `attn_pair` with every (case, backend) of the suite, ids `<case id>-<backend>`.

    `attn_check_pair` gets the same pairs (with the registry) for the agreement module, without the
    benchmark session's run folder: checking records nothing.
    """
    if "attn_check_pair" in metafunc.fixturenames:
        if not metafunc.config.getoption("--attnbench-suite"):
            metafunc.parametrize("attn_check_pair", [pytest.param(None, marks=pytest.mark.skip(reason="no --attnbench-suite given"))], ids=["no-suite"])
            return
        if _CHECK_KEY not in metafunc.config.stash:
            try:
                metafunc.config.stash[_CHECK_KEY] = selected_pairs(metafunc.config)
            except UserError as exc:
                raise pytest.UsageError(str(exc)) from None
        _, registry, pairs = metafunc.config.stash[_CHECK_KEY]
        metafunc.parametrize("attn_check_pair", [(c, registry.get(b)) for c, b in pairs], ids=[pair_key(c, b) for c, b in pairs])
        return
    if "attn_pair" not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    if session.suite is None:
        metafunc.parametrize("attn_pair", [pytest.param(None, marks=pytest.mark.skip(reason="no --attnbench-suite given"))], ids=["no-suite"])
        return
    metafunc.parametrize("attn_pair", session.pairs, ids=[pair_key(c, b) for c, b in session.pairs])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """When workers share a run, skip (silently, without a report) every pair another worker claimed first."""
    callspec = getattr(item, "callspec", None)
    pair = callspec.params.get("attn_pair") if callspec is not None else None
    if pair is None:
        return None
    session = _session(item.config)
    if session.claim(pair_key(*pair)):
        return None
    return True


@pytest.fixture
def attnbench_session(request: pytest.FixtureRequest) -> AttnbenchSession:
    """The worker's session (suite, registry, writer)."""
    return _session(request.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what is alive after collection so the per-pair `gc.collect()` calls stay cheap.

    With torch, pandas and the collected items alive, one full collection scans ~200k objects
    (about 0.1 s, more than a quick measurement itself); frozen objects are skipped, and the
    garbage a pair leaves is all younger than the freeze.
    """
    gc.freeze()
