"""The one private hook of pytest-benchmark the workers use, pinned: it fails the day pytest-benchmark changes it.

pytest-benchmark has no public per-test timer (`--benchmark-timer` is process-wide), so the worker
sets `benchmark._timer` to the device's clock before `pedantic`. These tests drive the real fixture
with a fake clock: if pytest-benchmark stopped reading `_timer`, its statistics would come from its
own clock and differ from the exact values the fake clock gives.
"""

import pytest

from harness.measure.timing import FakeClock
from harness.run.pytest_plugin import benchmark_loop


def test_pedantic_reads_the_clock_set_on_the_fixture(benchmark):
    clock = FakeClock()
    durations = iter([0.003, 0.001, 0.002, 0.005, 0.004])

    def call():
        clock.advance(next(durations))

    samples = benchmark_loop(benchmark, clock)(call, setup=None, rounds=5, iterations=1)
    assert samples == pytest.approx([0.003, 0.001, 0.002, 0.005, 0.004], abs=1e-12)
    assert benchmark.stats.stats.median == pytest.approx(0.003, abs=1e-12)


def test_iterations_divide_each_round_by_its_calls(benchmark):
    clock = FakeClock()

    def call():
        clock.advance(0.002)

    samples = benchmark_loop(benchmark, clock)(call, setup=None, rounds=3, iterations=4)
    assert samples == pytest.approx([0.002] * 3, abs=1e-12)  # per call, not per round of 4


def test_setup_runs_outside_the_timed_window(benchmark):
    clock = FakeClock()

    def setup():
        clock.advance(1.0)  # an L2 flush: must not be in any sample

    def call():
        clock.advance(0.001)

    samples = benchmark_loop(benchmark, clock)(call, setup=setup, rounds=3, iterations=1)
    assert samples == pytest.approx([0.001] * 3, abs=1e-12)
