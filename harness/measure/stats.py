"""The statistics of a measurement's samples: their summary, the median's confidence interval, and how many samples an interval needs.

Distribution-free where it matters: the median's 95 % interval is a pair of order statistics, and the
number of samples that would bring it within a precision is read from a pilot's own quantiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

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
        """A distribution-free `level` confidence interval of the median: order statistics x(j), x(n+1-j) (`median_interval_rank`).

        None with too few samples (at 95 % that is n < 6): the record then says nothing rather than overstate its precision.
        """
        j = median_interval_rank(self.n, level)
        if j is None:
            return None
        ordered = sorted(self.samples)
        return ordered[j - 1], ordered[self.n - j]


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



#: Fewest pilot samples (sample-sized groups of settled warm-up calls) a precision prediction is made from.
MIN_PILOT = 8
#: The share of the precision target the prediction aims at: the pilot is short and its spread rough,
#: so it plans for ±0.8 % to reach ±1 %.
PRECISION_MARGIN = 0.8


def rounds_for_precision(pilot: Sequence[float], precision: float, most: int) -> int | None:
    """The fewest rounds, up to `most`, whose median interval the pilot predicts within ±`precision` of the median; else None.

    Distribution-free, as the interval itself: n samples give the interval x(j), x(n+1−j), whose ends
    sit near the j/(n+1) and (n+1−j)/(n+1) quantiles, read here from the pilot's own samples (so a
    heavy tail or a handful of rounds is priced in, where a normal approximation would not be). It
    is a prediction only: the interval the samples really give is computed from them and recorded.
    """
    values = np.asarray(pilot, dtype=np.float64)
    if precision <= 0 or values.size < MIN_PILOT or most < 1:
        return None
    median = float(np.median(values))
    if median <= 0:
        return None
    target = PRECISION_MARGIN * precision * median

    def half_width(n: int) -> float:
        j = median_interval_rank(n)
        if j is None:
            return math.inf
        low, high = np.quantile(values, [j / (n + 1), (n + 1 - j) / (n + 1)])
        return max(high - median, median - low)

    if half_width(most) > target:
        return None
    low, high = 1, most
    while low < high:  # the half-width shrinks with n (up to the ranks' steps): the first n that meets the target
        middle = (low + high) // 2
        low, high = (low, middle) if half_width(middle) <= target else (middle + 1, high)
    return low
