"""The marker's timer and `pedantic`, through the real pytest-benchmark fixture, fed a fake clock.

Run by tests/test_pytest_benchmark_contract.py in a pytest of its own: pytest-benchmark switches itself off in every
pytest-xdist worker, and `make test` runs in those.
"""

import pytest

from tests.fake_clock import FakeClock
from harness.run.pytest_plugin import PairClock, pedantic_loop

TIMER = PairClock()


@pytest.mark.benchmark(timer=TIMER)
def test_pedantic_reads_the_clock_the_marker_names(benchmark):
    clock = FakeClock()
    durations = iter([0.003, 0.001, 0.002, 0.005, 0.004])

    def call():
        clock.advance(next(durations))

    samples = pedantic_loop(benchmark, TIMER)(clock)(call, setup=None, rounds=5, iterations=1)
    assert samples == pytest.approx([0.003, 0.001, 0.002, 0.005, 0.004], abs=1e-12)
    assert benchmark.stats.stats.median == pytest.approx(0.003, abs=1e-12)


@pytest.mark.benchmark(timer=TIMER)
def test_iterations_divide_each_round_by_its_calls(benchmark):
    clock = FakeClock()

    def call():
        clock.advance(0.002)

    samples = pedantic_loop(benchmark, TIMER)(clock)(call, setup=None, rounds=3, iterations=4)
    assert samples == pytest.approx([0.002] * 3, abs=1e-12)  # per call, not per round of 4


@pytest.mark.benchmark(timer=TIMER)
def test_setup_runs_outside_the_timed_window(benchmark):
    clock = FakeClock()

    def setup():
        clock.advance(1.0)  # an L2 flush: must not be in any sample

    def call():
        clock.advance(0.001)

    samples = pedantic_loop(benchmark, TIMER)(clock)(call, setup=setup, rounds=3, iterations=1)
    assert samples == pytest.approx([0.001] * 3, abs=1e-12)
