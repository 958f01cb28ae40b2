"""The statistics of a measurement's samples: their summary, the median's confidence interval, and their drift.

Distribution-free where it matters: the median's 95 % interval is a pair of order statistics, widened
to the spread of consecutive blocks' medians because timed samples are a time series, not independent
draws; drift compares the first third of the samples with the last.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from harness.results.vocabulary import DRIFT_FLAG_PCT

#: IQR / median at or above which a measurement is noisy, and suspect (torch.utils.benchmark, pyperf).
NOISY_IQR = 0.10
SUSPECT_IQR = 0.25


@dataclass(frozen=True)
class Stats:
    """Summary of per-call latencies in seconds (percentiles by linear interpolation, numpy's default)."""

    samples: tuple[float, ...]
    iterations: int
    median: float
    p20: float
    p80: float
    p25: float
    p75: float
    min: float
    max: float
    mean: float
    stdev: float

    @classmethod
    def from_samples(cls, samples: Sequence[float], iterations: int = 1) -> "Stats":
        """Statistics of per-call samples (each the mean of `iterations` calls)."""
        if not samples:
            raise ValueError("no samples to summarise")
        a = np.asarray(samples, dtype=np.float64)
        p20, p25, p50, p75, p80 = np.percentile(a, [20, 25, 50, 75, 80])
        return cls(
            samples=tuple(float(x) for x in a), iterations=iterations,
            median=float(p50), p20=float(p20), p80=float(p80), p25=float(p25), p75=float(p75),
            min=float(a.min()), max=float(a.max()), mean=float(a.mean()),
            stdev=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        )

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples)

    @property
    def iqr_ratio(self) -> float:
        """Interquartile range over median: the noise measure the flags use."""
        return (self.p75 - self.p25) / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """IQR/median ≥ 10 %."""
        return self.iqr_ratio >= NOISY_IQR

    @property
    def suspect(self) -> bool:
        """IQR/median ≥ 25 %: the median should not be trusted."""
        return self.iqr_ratio >= SUSPECT_IQR

    def median_interval(self, level: float = 0.95) -> tuple[float, float] | None:
        """The median's `level` confidence interval (`median_interval`) over these samples in their recorded order."""
        return median_interval(self.samples, level)


#: Consecutive blocks whose medians widen the median's interval. Samples in time are not independent (a
#: GPU's clock steps as it heats, another process comes and goes) and the order statistics alone assume
#: they are: on the H200's sequences, the stopping rule with them alone stopped 25 rows early, widened 39,
#: neither interval missing its full sequence's median (tests/test_stopping.py). All 8 medians of
#: independent blocks fall on one side of the true median with probability 2⁻⁷ < 1 %: the widening only widens.
INTERVAL_BLOCKS = 8


def order_statistics_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The order statistics x(j), x(n+1−j) that hold the median of independent samples with probability ≥ `level`; None under 6 samples at 95 %."""
    j = median_interval_rank(len(samples), level)
    if j is None:
        return None
    ordered = sorted(samples)
    return ordered[j - 1], ordered[len(samples) - j]


def median_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free `level` interval of the median: the order statistics', widened to the medians of INTERVAL_BLOCKS consecutive blocks.

    None with too few samples (at 95 % that is n < 6): the record then says nothing rather than overstate its precision.
    The blocks count from 2 samples each (16 samples); below that the order statistics stand alone.
    """
    interval = order_statistics_interval(samples, level)
    if interval is None or len(samples) < 2 * INTERVAL_BLOCKS:
        return interval
    medians = [float(np.median(block)) for block in np.array_split(np.asarray(samples, dtype=np.float64), INTERVAL_BLOCKS)]
    return min(interval[0], *medians), max(interval[1], *medians)


def within(interval: tuple[float, float] | None, center: float, precision: float) -> bool:
    """Whether `interval` lies within ±`precision` (relative) of `center`."""
    return interval is not None and center - interval[0] <= precision * center and interval[1] - center <= precision * center


#: Relative differences below this are float rounding (a sum of clock readings), not time.
FLOAT_NOISE = 1e-9


def inside(value: float, interval: tuple[float, float]) -> bool:
    """Whether `value` lies in `interval`, up to float rounding (FLOAT_NOISE)."""
    slack = FLOAT_NOISE * max(abs(interval[0]), abs(interval[1]))
    return interval[0] - slack <= value <= interval[1] + slack


#: The fewest samples whose first and last thirds each have a 95 % interval of their own: below it, drift cannot be told.
DRIFT_MIN_SAMPLES = 18


@dataclass(frozen=True)
class Drift:
    """How the last third of a measurement's samples compares with its first third."""

    #: The last third's median over the first third's, minus one, in %.
    pct: float
    #: The thirds' 95 % intervals of the median do not overlap: the samples moved while they were taken.
    significant: bool

    @property
    def flagged(self) -> bool:
        """Significant and at least DRIFT_FLAG_PCT in size: the row's median depends on when it was measured."""
        return self.significant and abs(self.pct) >= DRIFT_FLAG_PCT


def drift(samples: Sequence[float]) -> Drift | None:
    """The drift between the first and the last third of `samples` (in recorded order); None under DRIFT_MIN_SAMPLES."""
    third = len(samples) // 3
    if len(samples) < DRIFT_MIN_SAMPLES:
        return None
    first, last = list(samples[:third]), list(samples[-third:])
    early, late = order_statistics_interval(first), order_statistics_interval(last)
    assert early is not None and late is not None  # a third of 18 or more holds 6
    first_median = float(np.median(first))
    pct = (float(np.median(last)) / first_median - 1) * 100 if first_median > 0 else 0.0
    apart = not (inside(late[0], early) or inside(early[0], late))
    return Drift(pct=pct, significant=apart)


@functools.lru_cache(maxsize=4096)
def median_interval_rank(n: int, level: float = 0.95) -> int | None:
    """The j of the narrowest symmetric order-statistics interval x(j), x(n+1−j) that holds the median with probability ≥ `level`.

    The median lies below x(j) with probability P(Binomial(n, ½) < j), so the coverage is 1 − 2·P(Bin < j);
    None when even (x(1), x(n)) falls short. Exact integer arithmetic, O(n).
    """
    best = None
    below, term, total = 0, 1, 2**n  # Σ_{i<j} C(n, i) and C(n, j − 1)
    wanted = Fraction(level).limit_denominator(10**6)
    for j in range(1, n // 2 + 1):
        below += term
        term = term * (n - j + 1) // j
        if (total - 2 * below) * wanted.denominator >= wanted.numerator * total:
            best = j
        else:
            break
    return best
