"""`--cpu-durations=N`: the N tests that cost the most CPU, beside pytest's `--durations` (which reports wall time).

On a shared 2-core machine a test's wall time says as much about what ran beside it as about the test: under load the
whole suite's walls grow together, and the slowest test by wall is often one that waited. CPU seconds move little
with load (821 quiet, 883 beside two CPU-bound processes), so this list names the tests that make `make test` long on
any machine. Each test is charged the CPU of its xdist worker while it ran (its setup, call and teardown) and of the
child processes that ended, and were waited for, within it: a process that outlives the test (a worker template, a Ray
head) is charged to the test that reaps it, or to none. Works with and without pytest-xdist: the figures travel to the
controller on each test's teardown report.

Loaded by `make test` with `-p tests.cpu_durations --cpu-durations=25` (the Makefile's SLOWEST).
"""

from __future__ import annotations

import resource

import pytest

#: The report property that carries a test's CPU seconds from its worker to the controller.
PROPERTY = "cpu_s"
_START = pytest.StashKey[tuple[float, float]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The option, beside pytest's own --durations."""
    parser.getgroup("debugconfig").addoption(
        "--cpu-durations", type=int, default=None, metavar="N",
        help="show the N tests that cost the most CPU seconds (their process's and their waited-for children's); 0 for all")


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Charge the test the CPU spent between its start and the end of its teardown."""
    item.stash[_START] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """On the teardown's report (the last of a test's three), the test's CPU seconds: its process's, its children's."""
    outcome = yield
    report = outcome.get_result()
    start = item.stash.get(_START, None)
    if report.when == "teardown" and start is not None:
        own, children = _cpu_s()
        report.user_properties.append((PROPERTY, (own - start[0], children - start[1])))


def pytest_configure(config: pytest.Config) -> None:
    """Where the option is given, the summary that collects the reports (the controller's, under xdist)."""
    if config.getoption("cpu_durations") is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(CpuSummary(config.getoption("cpu_durations")), "cpu-durations-summary")


class CpuSummary:
    """The tests' CPU seconds as their reports arrive, printed at the end of the session."""

    def __init__(self, shown: int) -> None:
        self.shown = shown
        self.charged: list[tuple[float, float, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep a test's figures from its teardown report."""
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.charged.append((value[0], value[1], report.nodeid))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Print the most costly tests, after the sum over all of them."""
        if not self.charged:
            return
        charged = sorted(self.charged, key=lambda row: row[0] + row[1], reverse=True)
        shown = charged[:self.shown] if self.shown else charged
        terminalreporter.write_sep("=", f"the {len(shown)} tests costing the most CPU seconds")
        total = sum(own + children for own, children, _ in charged)
        terminalreporter.write_line(f"{total:.1f} CPU-s in {len(charged)} tests: a test's process, then its waited-for children")
        for own, children, nodeid in shown:
            terminalreporter.write_line(f"{own + children:7.1f}s = {own:6.1f} + {children:6.1f}  {nodeid}")
