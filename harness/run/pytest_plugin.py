"""`pytest suites/`: a suite as tests, one per (case, backend), measured through pytest-benchmark's public interface.

Each test runs its pair through the worker loop (harness.run.worker) with the timed rounds driven by
`benchmark.pedantic`: as many rounds as the harness's plan sizes from the suite's budget, read with
the harness's clock (device time from CUDA events on a GPU). The clock reaches pytest-benchmark by the
`benchmark(timer=...)` marker this plugin puts on each item, so pytest-benchmark's table,
`--benchmark-json` and `--benchmark-compare` hold the same samples as the records the test appends.

`attnbench run` does not go through pytest (its workers run the loop directly); this plugin is
loaded by suites/conftest.py only, never into a unit-test session (it freezes the garbage
collector's survivors after collection).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.backends.registry import Registry, load_registry
from harness.env import resolve_device
from harness.errors import UserError
from harness.execution.execute import PairRunner, Phases
from harness.measure.timing import Clock, Loop
from harness.results.record import Record
from harness.results.run_options import RunOptions, options as run_options
from harness.results.store import RunWriter
from harness.results.vocabulary import UNTRUSTED_FLAGS
from harness.run.worker import WorkerLoop
from harness.suite.cases import Case
from harness.suite.catalog import Suite, suite_on_device
from harness.results.record import pair_key


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options of a suite run as tests."""
    group = parser.getgroup("attnbench")
    group.addoption("--attnbench-suite", default=None, help="built-in suite name or .toml file to run as tests")
    group.addoption("--attnbench-run-dir", default=None, help="folder the records are appended to (default: a new one under results/)")
    group.addoption("--attnbench-backends", default=None, help="comma-separated backend names (default: the suite's)")
    group.addoption("--attnbench-device", default=None, help="move every case to this device (cpu or cuda)")
    for _, spec in run_options():  # --attnbench-no-check, -profile, -energy, -timer, -traces: the run options the plugin takes
        if spec.pytest is not None:
            group.addoption(spec.pytest_flag, **spec.pytest)


class PairClock:
    """The timer pytest-benchmark is given for one test: it reads the clock the pair's measurement chose (CPU or CUDA events).

    pytest-benchmark takes its timer when the `benchmark` fixture is made, before the pair has picked
    its device's clock, so the marker names this stand-in and the measurement points it at the clock.
    """

    #: How pytest-benchmark names the timer in its JSON (it reads the timer's `__name__`).
    __name__ = "attnbench_device_clock"

    def __init__(self) -> None:
        self.clock: Clock | None = None

    def __call__(self) -> float:
        """The chosen clock's reading."""
        if self.clock is None:
            raise RuntimeError("the pair's clock is read before its measurement chose one")
        return self.clock()


def pedantic_loop(benchmark: Any, timer: PairClock) -> Callable[[Clock], Loop]:
    """The loop factory that runs a pair's rounds through `benchmark.pedantic`, its timer (the marker's) reading the pair's clock."""

    def factory(clock: Clock) -> Loop:
        timer.clock = clock

        def loop(fn, *, setup, rounds, iterations):
            if benchmark.disabled:
                raise UserError("pytest-benchmark is disabled (--benchmark-disable): nothing would be timed")
            benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=iterations, warmup_rounds=0)
            return list(benchmark.stats.stats.data)

        return loop

    return factory


def selected_pairs(config: pytest.Config) -> tuple[Suite, Registry, list[tuple[Case, str]]]:
    """The suite, the registry and the (case, backend) pairs the --attnbench-* options select; touches no run folder."""
    suite = suite_on_device(config.getoption("--attnbench-suite"), resolve_device(config.getoption("--attnbench-device")))
    registry = load_registry()
    backends_opt = config.getoption("--attnbench-backends")
    names = suite.backend_names(backends_opt.split(",") if backends_opt else None, registry.names())
    for name in names:
        registry.get(name)  # unknown names fail here, before any test
    return suite, registry, suite.pairs(names)


class AttnbenchSession:
    """What a suite session needs: its pairs, one worker loop over them and the writer of its records."""

    def __init__(self, config: pytest.Config) -> None:
        self.suite: Suite | None = None
        self.pairs: list[tuple[Case, str]] = []
        if not config.getoption("--attnbench-suite"):
            return
        self.suite, registry, self.pairs = selected_pairs(config)
        run_dir = config.getoption("--attnbench-run-dir")
        if run_dir is None:
            from harness.run.rundir import new_run_id

            run_dir = str(Path("results") / new_run_id(self.suite.slug))
        self.run_dir = Path(run_dir)
        self.writer = RunWriter(self.run_dir)
        given = {f.name: config.getoption(spec.pytest_flag) for f, spec in run_options() if spec.pytest is not None}
        # The option names the traces' folder, and the plugin has always ignored it without --attnbench-profile.
        traces = given["traces"] if given["profile"] else None
        options = RunOptions.from_flags({**given, "traces": traces})
        phases = Phases.of_run(options, Path(traces) if traces else None)
        # One loop for the session: its runner's float64 reference is shared by the backends of a case.
        self.loop = WorkerLoop(self.run_dir.name, "pytest", PairRunner(budget=self.suite.budget, phases=phases), registry,
                               after_pair=gc.freeze,  # the pytest session is this process's entry point: its choice, as a worker's
                               threads=options.threads)
        #: The test ids of the rows whose medians decide nothing, by why (`contended`, `suspect`), for the closing line.
        self.undecided: dict[str, list[str]] = {why: [] for why in UNTRUSTED_FLAGS}
        self.recorded = 0

    def run(self, case: Case, backend_name: str, benchmark: Any, timer: PairClock) -> Record:
        """Measure one pair with its rounds in pytest-benchmark, append its record, and return it."""
        record = self.loop.run_pair(case, backend_name, loop_factory=pedantic_loop(benchmark, timer))
        # pytest-benchmark's table cannot say a row was contended: its JSON and the closing line do.
        benchmark.extra_info.update({"case_id": case.id, "backend": backend_name, "status": record.status.value,
                                     "contended": record.contended, "suspect": record.suspect, "threads": record.threads})
        for why in self.undecided:
            if getattr(record, why):
                self.undecided[why].append(record.pair_key)
        self.writer.append(record)
        self.recorded += 1
        return record

    def undecided_line(self, shown: int = 3) -> str | None:
        """One line naming the rows that were contended or suspect, that their numbers decide nothing; None when none was."""
        ids = list(dict.fromkeys(key for keys in self.undecided.values() for key in keys))
        if not ids:
            return None
        counts = ", ".join(f"{len(keys)} {why}" for why, keys in self.undecided.items() if keys)
        named = ", ".join(ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
        return (f"attnbench: {len(ids)} of {self.recorded} rows were contended or suspect ({counts}): "
                f"their numbers decide no answer ({named}); rows in {self.run_dir}")


_SESSION_KEY = pytest.StashKey[AttnbenchSession]()
_CHECK_KEY = pytest.StashKey[tuple]()


def _session(config: pytest.Config) -> AttnbenchSession:
    if _SESSION_KEY not in config.stash:
        try:
            config.stash[_SESSION_KEY] = AttnbenchSession(config)
        except UserError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[_SESSION_KEY]


def _no_suite(metafunc: pytest.Metafunc, argname: str) -> None:
    metafunc.parametrize(argname, [pytest.param(None, marks=pytest.mark.skip(reason="no --attnbench-suite given"))], ids=["no-suite"])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise `attn_pair` with every (case, backend) of the suite, ids `<case id>-<backend>`.

    `attn_check_pair` gets the same pairs (with the registry) for the agreement module, without the
    benchmark session's run folder: checking records nothing.
    """
    if "attn_check_pair" in metafunc.fixturenames:
        if not metafunc.config.getoption("--attnbench-suite"):
            return _no_suite(metafunc, "attn_check_pair")
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
        return _no_suite(metafunc, "attn_pair")
    metafunc.parametrize("attn_pair", session.pairs, ids=[pair_key(c, b) for c, b in session.pairs])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each pair's test its own timer through pytest-benchmark's public marker."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("attn_pair") is not None:
            item.add_marker(pytest.mark.benchmark(timer=PairClock()))


@pytest.fixture
def attnbench_session(request: pytest.FixtureRequest) -> AttnbenchSession:
    """The suite session (its pairs, worker loop and writer)."""
    return _session(request.config)


@pytest.fixture
def attnbench_timer(request: pytest.FixtureRequest) -> PairClock:
    """The timer this test's `benchmark` marker gave pytest-benchmark."""
    marker = request.node.get_closest_marker("benchmark")
    timer = marker.kwargs.get("timer") if marker is not None else None
    if not isinstance(timer, PairClock):
        pytest.fail(f"{request.node.nodeid}: its closest benchmark marker gives no attnbench timer (a marker of its own hides the plugin's)",
                    pytrace=False)
    return timer


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what is alive after collection so the per-pair `gc.collect()` calls stay cheap.

    With torch, pandas and the collected items alive, one full collection scans ~200k objects
    (about 0.1 s, more than a quick measurement itself); frozen objects are skipped, and the
    garbage a pair leaves is all younger than the freeze.
    """
    gc.freeze()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say after pytest-benchmark's table how many rows were contended or suspect: the table shows no sign of it."""
    session = config.stash.get(_SESSION_KEY, None)
    line = session.undecided_line() if session is not None and session.suite is not None else None
    if line is not None:
        terminalreporter.write_line(line, yellow=True, bold=True)
