"""The types the measurement path is written in: a clock, a loop of timed rounds, and a time budget.

They live apart from harness.measure.timing so that the stopping rule (harness.measure.stopping) and
the timer that runs it can both name them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

#: A clock returns seconds as a float; only differences between two readings matter.
Clock = Callable[[], float]

class Loop(Protocol):
    """Runs `rounds` samples of `iterations` calls each and returns per-call seconds, one per round.

    Each round reads the clock once before its calls and once after them (the direct loop and
    pytest-benchmark's pedantic mode both do), which is how a clock's per-reading notes are matched
    to samples.
    """

    def __call__(self, fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]: ...


@dataclass(frozen=True)
class Budget:
    """How much time a measurement may spend, and how its samples are sized.

    Warm-up runs for `warmup_s` (at least one call), then the number of calls per sample is set so
    a sample lasts at least `min_sample_s` (CPU; on CUDA each sample is one call between L2
    flushes). The harness's own loop then samples until the median's 95 % interval is within
    ±`precision` of it (after `min_measure_share` of `measure_s` and DRIFT_MIN_SAMPLES samples, and
    not while the samples drift), else until the samples' wall time (between-sample setup and clock
    readings included) reaches `measure_s` with at least `min_rounds` samples, or `max_rounds`
    (`precision_reached`, `stop_reason`). An external loop runs the rounds `measure_s` holds.

    When one call (a round: setup and clock readings included) costs more than `measure_s` itself,
    `fewest_rounds` set takes that many samples instead of `min_rounds` and the row says
    `call_exceeds_budget`; None keeps `min_rounds` whatever they cost. A call the budget holds a few
    of keeps `min_rounds`: a contended machine can make a small call look dear, and six samples are
    the fewest with an interval.
    """

    warmup_s: float = 0.05
    measure_s: float = 0.25
    min_sample_s: float = 1e-3
    #: Six is the fewest samples whose order statistics give the median a 95 % interval (`Stats.median_interval`).
    min_rounds: int = 6
    max_rounds: int = 1000
    max_iterations: int = 10_000
    #: Relative half-width of the median's 95 % interval at which sampling may stop short of `measure_s` (0: never).
    precision: float = 0.01
    #: The share of `measure_s` sampled before a precision stop. Replayed on the H200's sequences, stops after
    #: 40 or 50 % of the budget left 3 or 1 intervals missing the full budget's median (a GPU's time steps as
    #: it heats), 60 % none; 70 % keeps a margin.
    min_measure_share: float = 0.7
    #: The samples taken instead of `min_rounds` when one call costs more than `measure_s` (None: `min_rounds` whatever it costs).
    fewest_rounds: int | None = None
