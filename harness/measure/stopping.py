"""The stopping rule of the harness's own loop: after each block of samples, stop for precision, budget or rounds.

The rule keeps the promise its records make (a median within ±precision of the budget's, an interval
that holds it): it looks at the samples only as they grow by a quarter, stops for precision only on
a steady run (no drift between the first and last thirds, the newest samples inside the interval)
after a minimum of samples and time, and otherwise samples to the budget.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from harness.measure.stats import DRIFT_MIN_SAMPLES, drift, inside, median_interval, within

if TYPE_CHECKING:
    from harness.suite.budget import Budget

from harness.results.vocabulary import (STOP_BUDGET, STOP_CALL_EXCEEDS_BUDGET, STOP_FIRST_CALL, STOP_MAX_ROUNDS,  # noqa: F401 - re-exported
                                         STOP_MIN_ROUNDS, STOP_PRECISION)

#: A clock returns seconds as a float; only differences between two readings matter.
Clock = Callable[[], float]

class Loop(Protocol):
    """Runs `rounds` samples of `iterations` calls each and returns per-call seconds, one per round.

    Each round reads the clock once before its calls and once after them (the direct loop and
    pytest-benchmark's pedantic mode both do), which is how a clock's per-reading notes are matched
    to samples.
    """

    def __call__(self, fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]: ...


#: How much the samples grow between two looks at them: each look is a chance to stop on a lucky
#: stretch, so the looks are spaced by a quarter of what is known rather than taken after every sample.
LOOK_GROWTH = 0.25


def precision_reached(samples: Sequence[float], since: int, elapsed_s: float, budget: Budget) -> bool:
    """Whether sampling may stop for precision: the median's interval within ±`precision` of it, on a steady run.

    Steady: at least DRIFT_MIN_SAMPLES samples and `min_measure_share` of `measure_s`, the first and last
    thirds not significantly apart (`drift`), and the samples since the previous look (`since` on)
    centred inside the interval: a stop never rests on samples that are still moving.
    """
    n = len(samples)
    if budget.precision <= 0 or n < max(budget.min_rounds, DRIFT_MIN_SAMPLES) or elapsed_s < budget.min_measure_share * budget.measure_s:
        return False
    median = float(np.median(samples))
    interval = median_interval(samples)
    if not within(interval, median, budget.precision):
        return False
    moved = drift(samples)
    if moved is None or moved.significant:
        return False
    latest = float(np.median(samples[since:])) if since < n else median
    return inside(latest, interval)  # type: ignore[arg-type]


def next_block(n: int, elapsed_s: float, measure_s: float) -> int:
    """Samples to take before the next look: a quarter more (LOOK_GROWTH), but no more than the rest of the budget holds."""
    block = max(1, math.ceil(n * LOOK_GROWTH))
    if 0 < elapsed_s < measure_s:  # a look lands near the budget's end rather than a quarter past it
        block = min(block, max(1, math.ceil((measure_s - elapsed_s) * n / elapsed_s)))
    return block


def stop_reason(samples: Sequence[float], since: int, elapsed_s: float, budget: Budget, least: int, most: int) -> str | None:
    """Why sampling stops after this look (a STOP_* word), or None to go on; `least` samples come before a budget stop, `most` is the cap."""
    if precision_reached(samples, since, elapsed_s, budget):
        return STOP_PRECISION
    if len(samples) >= most:
        return STOP_MAX_ROUNDS
    n = len(samples)
    if elapsed_s >= budget.measure_s and n >= least:
        if n < budget.min_rounds:
            return STOP_CALL_EXCEEDS_BUDGET
        # The budget was spent before the last sample: the minimum, not the budget, set the count.
        return STOP_MIN_ROUNDS if n == least and elapsed_s * (n - 1) / n >= budget.measure_s else STOP_BUDGET
    return None


class StoppingLoop:
    """The harness's own loop: samples in blocks through `block_loop` (a direct loop), looking after each whether to stop (`stop_reason`).

    A Loop whose `rounds` is the most it may take. `least` below `Budget.min_rounds` (the warm-up found
    a call dearer than the budget) is raised to it once a sample shows the call is not. Time spent is the larger of `wall`'s (the host's,
    setup included) and the samples' own, so a fake clock alone drives it in tests. Why it stopped is
    left in `stopped_by`.
    """

    def __init__(self, block_loop: Loop, budget: Budget, least: int, wall: Clock = time.perf_counter) -> None:
        self.block_loop, self.budget, self.least, self.wall = block_loop, budget, least, wall
        self.stopped_by: str | None = None

    def __call__(self, fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]:
        samples: list[float] = []
        began, since = self.wall(), 0
        block = max(1, min(self.least, rounds))
        least = self.least
        while True:
            samples += self.block_loop(fn, setup=setup, rounds=block, iterations=iterations)
            elapsed = max(self.wall() - began, sum(samples) * iterations)
            if least < self.budget.min_rounds and min(samples) * iterations <= self.budget.measure_s:
                least = min(self.budget.min_rounds, rounds)  # the warm-up's dear call was a cold (or preempted) one
            self.stopped_by = stop_reason(samples, since, elapsed, self.budget, least, rounds)
            if self.stopped_by is not None:
                return samples
            since = n = len(samples)
            block = min(next_block(n, elapsed, self.budget.measure_s), rounds - n)
