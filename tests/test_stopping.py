"""The stopping rule of the harness's own loop, held to its promise on real H200 sequences and on simulated traps.

Each sequence is replayed through `measure` with a fake clock that advances by the recorded samples,
in their recorded order: the rule sees exactly what the GPU gave, one sample at a time.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from harness.measure.stats import Stats, drift
from harness.measure.timing import CUDA_BUDGET, FIRST_CALL_ONLY_FACTOR, QUICK_BUDGET, Budget, measure, plan
from tests.fake_clock import FakeClock
from tests.h200_data import h200_records, needs_h200


class Replay:
    """Work that advances a fake clock by the next recorded duration; it refuses to invent one past the end."""

    def __init__(self, clock: FakeClock, durations: list[float]) -> None:
        self.clock, self.durations, self.calls = clock, durations, 0

    def __call__(self) -> None:
        if self.calls >= len(self.durations):
            raise AssertionError(f"asked for call {self.calls + 1} of a recording of {len(self.durations)}")
        self.clock.advance(self.durations[self.calls])
        self.calls += 1


def replayed(samples: list[float], budget: Budget):
    """`measure` over `samples` with `budget`'s rule: the budget is the sequence's own time and length, so unstopped it takes them all.

    The warm-up replays the sequence from its start (cycling for one shorter than the warm-up), then
    the timed samples replay it again from the start.
    """
    warm = [samples[0]]
    while sum(warm) < budget.warmup_s:
        warm.append(samples[len(warm) % len(samples)])
    clock = FakeClock()
    full = dataclasses.replace(budget, measure_s=sum(samples), max_rounds=len(samples))
    return measure(Replay(clock, warm + list(samples)), clock, full, wall=clock)


def replay_figures(rows: list[dict], budget: Budget) -> dict:
    """Replay every ok row's `sample_ms` and count what the rule did against each full sequence."""
    early, errors, misses, no_interval = [], [], [], 0
    for row in rows:
        samples = [ms / 1e3 for ms in row["sample_ms"]]
        m = replayed(samples, budget)
        full = float(np.median(samples))
        interval = m.stats.median_interval()
        if m.stats.n < len(samples):
            early.append((row["case_id"], row["backend"], m.stats.n, len(samples), m.stopped_by))
            errors.append(abs(m.stats.median / full - 1))
        if interval is None:
            no_interval += 1
        elif not interval[0] <= full <= interval[1]:
            misses.append((row["case_id"], row["backend"], m.stats.n, len(samples)))
    return {"rows": len(rows), "early": early, "worst": max(errors, default=0.0), "misses": misses, "no_interval": no_interval}


@needs_h200
def test_every_h200_sequence_replayed_stops_within_one_percent_and_its_interval_holds_the_full_median():
    rows = [r for r in h200_records() if r["status"] == "ok"]
    figures = replay_figures(rows, CUDA_BUDGET)
    print(f"\nH200 replay: {len(figures['early'])} of {figures['rows']} rows stopped early, worst median error "
          f"{figures['worst']:.3%}, {figures['rows'] - figures['no_interval'] - len(figures['misses'])} of "
          f"{figures['rows'] - figures['no_interval']} intervals hold the full median")
    assert figures["rows"] == 84 and figures["no_interval"] == 0
    assert all(stop == "precision" for *_, stop in figures["early"])  # nothing else ends a replay short of its sequence
    assert len(figures["early"]) >= 20  # the rule does stop: a rule that never stops would pass the rest
    assert figures["worst"] <= 0.01
    assert figures["misses"] == []


@needs_h200
def test_the_drifting_h200_row_is_flagged_and_sampled_to_its_budget():
    # The README's row: 1.638 ms for its first 18 samples, then 1.684 ms and 1.733 ms at the end.
    row = next(r for r in h200_records() if r["status"] == "ok" and r["backend"] == "sdpa"
               and r["case_id"] == "B1-Sq8192-Skv8192-H32-Hkv8-dk128-bf16")
    m = replayed([ms / 1e3 for ms in row["sample_ms"]], CUDA_BUDGET)
    assert m.stats.n == len(row["sample_ms"]) and m.stopped_by == "max_rounds"
    assert m.drift.flagged and m.drift.pct == pytest.approx(2.82, abs=0.01)


def bimodal(seed: int, n: int = 400, slow_share: float = 0.3, slow: float = 1.06) -> list[float]:
    """1 ms samples (±0.2 % jitter), `slow_share` of them `slow` times longer, in random order."""
    rng = np.random.default_rng(seed)
    base = 1e-3 * (1 + 0.002 * rng.uniform(-1, 1, size=n))
    return list(np.where(rng.uniform(size=n) < slow_share, base * slow, base))


def test_bimodal_timings_never_stop_early_with_a_wrong_median_or_a_claim_their_interval_does_not_make():
    stopped = 0
    for seed in range(60):
        samples = bimodal(seed)
        m = replayed(samples, CUDA_BUDGET)
        full = float(np.median(samples))
        if m.stats.n < len(samples):
            stopped += 1
            assert m.stopped_by == "precision"
            low, high = m.stats.median_interval()
            assert high - m.stats.median <= 0.01 * m.stats.median and m.stats.median - low <= 0.01 * m.stats.median
            assert abs(m.stats.median / full - 1) <= 0.01, seed
            assert low <= full <= high, seed
    assert stopped > 30  # the median of a 70/30 mixture is the fast mode's: known to ±1 % well before the budget


def ramp_samples(kernel_s: float, ramp_s: float, seconds: float) -> list[float]:
    """A kernel timed while the GPU's clock ramps linearly from idle (345 MHz) to 1980 MHz over `ramp_s`."""
    samples, now = [], 0.0
    while now < seconds:
        mhz = 345 + (1980 - 345) * min(1.0, now / ramp_s)
        samples.append(kernel_s * 1980 / mhz)
        now += samples[-1]
    return samples


@pytest.mark.parametrize("ramp_s", [0.5, 1.0, 2.0, 5.0])
def test_a_clock_ramping_slowly_from_idle_is_never_stopped_early_and_is_flagged_as_drift(ramp_s):
    # The budget's window sits in the ramp: every sample is faster than the last, by a few % over the window.
    samples = ramp_samples(0.2e-3, ramp_s, seconds=0.2)
    clock = FakeClock()
    m = measure(Replay(clock, samples), clock, CUDA_BUDGET, wall=clock)
    assert m.stopped_by == "budget" and m.stats.n >= 50
    assert m.drift.flagged and m.drift.pct < -1.0


def test_a_ramp_finished_during_the_warm_up_stops_for_precision_on_the_steady_clock():
    samples = ramp_samples(0.2e-3, 0.01, seconds=0.2)
    clock = FakeClock()
    m = measure(Replay(clock, samples), clock, CUDA_BUDGET, wall=clock)
    assert m.stopped_by == "precision" and m.stats.median == pytest.approx(0.2e-3)
    assert not m.drift.flagged


def test_a_precision_stop_waits_for_the_minimum_time_and_samples():
    clock = FakeClock()
    steady = list(1e-3 * (1 + 0.001 * np.random.default_rng(0).uniform(-1, 1, size=200)))
    m = measure(Replay(clock, [1e-3] + steady), clock, dataclasses.replace(QUICK_BUDGET, warmup_s=0.0), wall=clock)
    assert m.stopped_by == "precision"
    assert m.loop_s is None or m.stats.n * 1e-3 >= QUICK_BUDGET.min_measure_share * QUICK_BUDGET.measure_s
    share, measure_s = QUICK_BUDGET.min_measure_share, QUICK_BUDGET.measure_s
    assert share * measure_s <= m.stats.n * 1e-3 < measure_s  # ±0.1 % jitter: within ±1 % at once, but not before 70 % of the budget
    never = measure(Replay(clock, [1e-3] + steady), clock, dataclasses.replace(QUICK_BUDGET, warmup_s=0.0, precision=0.0), wall=clock)
    assert never.stopped_by == "budget" and never.stats.n == round(measure_s / 1e-3)


def test_noisy_cpu_samples_are_taken_to_the_budget():
    clock = FakeClock()
    noisy = list(1e-3 * (1 + 0.3 * np.random.default_rng(1).uniform(-1, 1, size=300)))
    m = measure(Replay(clock, [1e-3] + noisy), clock, dataclasses.replace(QUICK_BUDGET, warmup_s=0.0), wall=clock)
    assert m.stopped_by == "budget" and m.stats.median_interval()[1] - m.stats.median > 0.01 * m.stats.median


# -- the ceiling: a call dearer than the budget -------------------------------------------------------------------------


@pytest.mark.parametrize("call_s,samples,stop", [(3.2, 1, "first_call"), (0.31, 1, "first_call"), (0.29, 1, "call_exceeds_budget"),
                                                (0.08, 1, "call_exceeds_budget"),
                                                (0.02, 6, "min_rounds"), (0.007, 8, "budget")])
def test_a_call_dearer_than_the_budget_takes_fewer_samples_and_says_so(call_s, samples, stop):
    # The AVX2 CPU's bf16 naive pair: 3.2 s a call. Six samples cost 19 s where the budget is 0.05 s. A call the
    # budget holds two of keeps the minimum (a contended machine makes small calls look dear); the loop samples
    # until the budget is spent, so it ends at most one call past it (8 calls of 7 ms: the 8th crosses 50 ms).
    clock = FakeClock()
    m = measure(lambda: clock.advance(call_s), clock, QUICK_BUDGET, wall=clock)
    assert m.stats.n == samples and m.stopped_by == stop
    assert (m.stats.median_interval() is None) == (samples < 6)  # under 6 samples the row claims no interval


def test_a_first_call_five_budgets_dear_is_the_rows_one_sample_and_no_warm_up_call_precedes_it():
    # The AVX2 CPU's bf16 naive pair again: a warm-up call before its one sample would double its cost, and quick's.
    clock, calls = FakeClock(), []

    def dear():
        calls.append(clock())
        clock.advance(3.2)

    m = measure(dear, clock, QUICK_BUDGET, wall=clock)
    assert len(calls) == 1 and m.stats.n == 1 and m.stats.median == pytest.approx(3.2)
    assert m.stopped_by == m.plan.stop == "first_call" and m.plan.warmup_calls == 0 and m.stats.median_interval() is None
    # Just under five whole budgets (0.3 s for quick's 0.06 s) the first call stays a warm-up call and a sample follows it.
    whole = QUICK_BUDGET.warmup_s + QUICK_BUDGET.measure_s
    calls.clear()
    under = measure(lambda: calls.append(clock.advance(0.95 * FIRST_CALL_ONLY_FACTOR * whole)), clock, QUICK_BUDGET, wall=clock)
    assert len(calls) == 2 and under.stopped_by == "call_exceeds_budget"
    # Without fewest_rounds 1 (CUDA keeps 3), or with an external loop, the first call is never the sample.
    cuda_like = measure(lambda: clock.advance(3.2), clock, dataclasses.replace(QUICK_BUDGET, fewest_rounds=3), wall=clock)
    assert cuda_like.stopped_by == "call_exceeds_budget" and cuda_like.stats.n == 3


def test_a_dear_first_call_that_was_only_cold_does_not_cost_the_row_its_minimum():
    # A first call that pays a lazy initialisation (or was preempted) looks dearer than the budget; the samples are not.
    clock = FakeClock()
    m = measure(Replay(clock, [0.08] + [0.012] * 20), clock, QUICK_BUDGET, wall=clock)
    # 5 samples fill the 50 ms but the minimum is 6, and the look after the 5th takes a block of two (a quarter more, rounded up).
    assert m.plan.stop == "call_exceeds_budget" and m.stopped_by == "budget" and m.stats.n == 7


def test_without_fewest_rounds_the_minimum_holds_whatever_a_call_costs():
    clock = FakeClock()
    m = measure(lambda: clock.advance(0.5), clock, dataclasses.replace(QUICK_BUDGET, fewest_rounds=None), wall=clock)
    assert m.stats.n == QUICK_BUDGET.min_rounds and m.stopped_by == "min_rounds"


def test_an_external_loop_runs_the_rounds_the_budget_holds_and_the_ceiling_applies_to_it():
    clock = FakeClock()
    seen = []

    def fixed(fn, *, setup, rounds, iterations):
        seen.append((rounds, iterations))
        out = []
        for _ in range(rounds):
            start = clock()
            fn()
            out.append(clock() - start)
        return out

    steady = measure(lambda: clock.advance(1e-3), clock, QUICK_BUDGET, loop=fixed, wall=clock)
    assert seen[-1] == (50, 1) and steady.stats.n == 50 and steady.stopped_by == "budget"  # no stop before the rounds end
    dear = measure(lambda: clock.advance(3.2), clock, QUICK_BUDGET, loop=fixed, wall=clock)
    assert seen[-1] == (1, 1) and dear.stopped_by == "call_exceeds_budget"
    assert dear.plan.warmup_calls == 2  # fixed rounds cannot be raised later: a second call confirms the first was not only cold
    cold = measure(Replay(clock, [0.5] + [0.01] * 20), clock, QUICK_BUDGET, loop=fixed, wall=clock)
    assert cold.plan.stop == "min_rounds" and cold.stats.n == 6  # sized from the cheaper second call (5 fit; 6 at least), not 1


def test_around_wraps_the_whole_stopping_loop_once():
    clock = FakeClock()
    wrapped = []

    def around(loop):
        def sampled(fn, **kwargs):
            wrapped.append(kwargs["rounds"])
            return loop(fn, **kwargs)
        return sampled

    m = measure(lambda: clock.advance(1e-3), clock, QUICK_BUDGET, around=around, wall=clock)
    assert wrapped == [QUICK_BUDGET.max_rounds] and m.stopped_by == "precision" and m.stats.n < QUICK_BUDGET.max_rounds


def test_looks_are_spaced_so_the_budget_is_not_overrun_by_more_than_a_sample():
    clock = FakeClock()
    noisy = list(1e-3 * (1 + 0.3 * np.random.default_rng(2).uniform(-1, 1, size=300)))
    m = measure(Replay(clock, [1e-3] + noisy), clock, dataclasses.replace(QUICK_BUDGET, warmup_s=0.0), wall=clock)
    spent = sum(m.stats.samples)
    assert QUICK_BUDGET.measure_s <= spent < QUICK_BUDGET.measure_s + max(m.stats.samples)


# -- drift and the widened interval --------------------------------------------------------------------------------------


def test_drift_compares_the_first_and_last_thirds():
    assert drift([1.0] * 17) is None  # fewer than 18: a third has no interval
    steady = drift([1.0, 1.01] * 15)
    assert steady.pct == pytest.approx(0.0) and not steady.significant and not steady.flagged
    stepped = drift([1.0] * 10 + [1.05] * 20)
    assert stepped.pct == pytest.approx(5.0) and stepped.significant and stepped.flagged
    small = drift([1.0] * 10 + [1.005] * 20)
    assert small.significant and not small.flagged  # real, but under the ±1 % a median is promised to


def test_the_median_interval_widens_to_the_spread_of_consecutive_blocks_medians():
    # Independent-looking values, but in time the first half is 2 % faster: the order statistics alone hide it.
    from harness.measure.stats import order_statistics_interval

    samples = [1.0, 1.001, 0.999, 1.0] * 8 + [1.02, 1.021, 1.019, 1.02] * 8
    plain = order_statistics_interval(samples)
    widened = Stats.from_samples(samples).median_interval()
    assert widened[0] <= plain[0] and widened[1] >= plain[1]
    assert widened == (pytest.approx(1.0), pytest.approx(1.02))
    shuffled = list(np.random.default_rng(0).permutation(samples))
    assert Stats.from_samples(shuffled).median_interval() == pytest.approx(order_statistics_interval(shuffled), rel=0.01)


def test_the_plan_gives_a_call_dearer_than_the_budget_its_fewest_rounds():
    clock = FakeClock()
    p = plan(lambda: clock.advance(0.2), clock, QUICK_BUDGET, wall=clock)
    assert (p.rounds, p.stop) == (1, "call_exceeds_budget")
    assert math.isclose(p.call_s, 0.2)
    p = plan(lambda: clock.advance(0.03), clock, QUICK_BUDGET, wall=clock)
    assert (p.rounds, p.stop) == (6, "min_rounds")
