"""The measurement engine: exact statistics from a fake clock, a real busy-wait, calibration."""

import time

import numpy as np
import pytest

from harness.measure.timing import Budget, FakeClock, Stats, direct_loop, measure, plan


def test_stats_from_known_samples_are_exact():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    stats = Stats.from_samples(samples)
    assert stats.median == 3.0
    assert stats.min == 1.0 and stats.max == 5.0
    assert stats.mean == 3.0
    assert stats.p20 == pytest.approx(1.8)  # linear interpolation: 1 + 0.8·(2 − 1)
    assert stats.p80 == pytest.approx(4.2)
    assert stats.p25 == 2.0 and stats.p75 == 4.0
    assert stats.iqr_ratio == pytest.approx(2 / 3)
    assert stats.noisy and stats.suspect
    assert stats.n == 5


def test_quiet_samples_are_not_noisy():
    stats = Stats.from_samples([1.00, 1.01, 0.99, 1.0, 1.02, 0.98])
    assert not stats.noisy


class ScriptedWork:
    """A callable that advances a fake clock by the next duration of a cycle."""

    def __init__(self, clock, durations):
        self.clock, self.durations, self.calls = clock, durations, 0

    def __call__(self):
        self.clock.advance(self.durations[self.calls % len(self.durations)])
        self.calls += 1


def test_measure_with_fake_clock_gives_exact_statistics():
    clock = FakeClock()
    durations = [0.002, 0.004, 0.003, 0.005, 0.001]
    work = ScriptedWork(clock, durations)
    # Warm-up stops once 9.5 ms have elapsed: after 2, 6, 9, 14 ms, i.e. four calls.
    budget = Budget(warmup_s=0.0095, measure_s=0.0, min_sample_s=0.0, min_rounds=10, max_rounds=10)
    m = measure(work, clock, budget)
    assert m.plan.warmup_calls == 4
    assert m.plan.iterations == 1
    assert m.plan.rounds == 10
    # After 4 warm-up calls, samples continue the cycle at index 4.
    expected = [durations[(4 + i) % 5] for i in range(10)]
    assert list(m.stats.samples) == pytest.approx(expected, abs=1e-15)
    assert m.stats.median == pytest.approx(np.median(expected), abs=1e-15)
    assert m.stats.mean == pytest.approx(0.003, abs=1e-15)


def test_calibration_batches_short_calls_into_one_millisecond_samples():
    clock = FakeClock()
    work = ScriptedWork(clock, [0.0001])  # 100 µs per call
    budget = Budget(warmup_s=0.001, measure_s=0.05, min_sample_s=0.001, min_rounds=5, max_rounds=1000)
    p = plan(work, clock, budget)
    assert p.iterations == 10  # 10 × 100 µs = 1 ms per sample
    assert p.rounds == 50  # 50 ms / 1 ms
    m = measure(work, clock, budget)
    assert m.stats.median == pytest.approx(0.0001)
    assert m.stats.iterations == 10


def test_rounds_are_capped_and_floored():
    clock = FakeClock()
    work = ScriptedWork(clock, [0.5])
    p = plan(work, clock, Budget(warmup_s=0.0, measure_s=0.1, min_sample_s=0.0, min_rounds=7, max_rounds=100))
    assert p.rounds == 7
    fast = ScriptedWork(clock, [1e-6])
    p = plan(fast, clock, Budget(warmup_s=0.0, measure_s=10.0, min_sample_s=0.0, min_rounds=7, max_rounds=100))
    assert p.rounds == 100


def test_setup_runs_outside_the_timed_window():
    clock = FakeClock()
    work = ScriptedWork(clock, [0.001])
    flushes = []

    def setup():
        flushes.append(1)
        clock.advance(1.0)  # a slow L2 flush must not show in the samples

    m = measure(work, clock, Budget(warmup_s=0.0, measure_s=0.0, min_sample_s=0.01, min_rounds=5, max_rounds=5), setup=setup)
    assert m.plan.iterations == 1  # a setup forces one call per sample
    assert list(m.stats.samples) == pytest.approx([0.001] * 5)
    assert len(flushes) == m.plan.warmup_calls + 5


def test_direct_loop_divides_by_iterations():
    clock = FakeClock()
    work = ScriptedWork(clock, [0.002])
    assert direct_loop(clock)(work, setup=None, rounds=3, iterations=4) == pytest.approx([0.002] * 3)


def busy_wait(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_ten_millisecond_busy_wait_is_reported_within_three_percent():
    m = measure(lambda: busy_wait(0.010), budget=Budget(warmup_s=0.02, measure_s=0.1, min_rounds=5, max_rounds=20))
    assert m.stats.median == pytest.approx(0.010, rel=0.03)
    assert m.stats.min >= 0.010  # a busy-wait cannot finish early
