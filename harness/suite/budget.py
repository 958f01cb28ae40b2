"""A measurement's time budget (the model's `Budget`), the budgets a CPU and a GPU run take by default, and a Budget
from its fields by name: a suite file's [budget] table, or the budget a run's manifest holds, validated.

The budget is part of what a run asks for (a suite names it, a manifest records it, the run options carry it), so it
lives with the suite, below the measurement that spends it (harness.measure.timing).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.suite.case_values import MAX_INT


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


#: The most seconds any one budget field (warm-up, samples, one sample) may ask for: an hour. A pair's whole
#: budget must also fit inside `run --timeout` (600 s by default); a larger value is a typo, never a plan,
#: and would end every pair as an error or a timeout.
MAX_BUDGET_S = 3600.0

#: The CPU's budget: 60 ms a pair. `quick` has 480 measured pairs on a CPU, and on one without native bf16 (AVX2) its
#: bf16 naive and projections calls last 0.1-2 s each: those take one sample (`call_exceeds_budget`, `first_call`;
#: no interval under 6 samples, and the row says why), and the budget of the rest is what keeps the sweep in minutes.
QUICK_BUDGET = Budget(warmup_s=0.01, measure_s=0.05, min_rounds=6, max_rounds=200, precision=0.01, fewest_rounds=1)
CUDA_BUDGET = Budget(warmup_s=0.025, measure_s=0.1, min_sample_s=0.0, min_rounds=10, max_rounds=1000, fewest_rounds=3)

#: Every Budget field, by name: a [budget] table may set any of them, and a run's manifest holds them all.
_BUDGET_KEYS = {f.name for f in dataclasses.fields(Budget)}


def budget_from_fields(budget_spec: dict[str, Any], where: str | Path, base: Budget = QUICK_BUDGET) -> Budget:
    """The Budget a suite file's [budget] table or a run's manifest gives by field name (the rest: `base`'s);
    UserError naming `where` and the field of a value no budget may have."""
    unknown = set(budget_spec) - _BUDGET_KEYS
    if unknown:
        raise UserError(f"{where}: unknown budget field {sorted(unknown)[0]!r} (known: {', '.join(sorted(_BUDGET_KEYS))})")
    for key, value in budget_spec.items():
        if key == "fewest_rounds" and value is None:
            continue  # no ceiling: a manifest (JSON) says so; a TOML table leaves the field out
        if key in {"min_rounds", "max_rounds", "max_iterations", "fewest_rounds"}:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
                raise UserError(f"{where}: budget field {key!r} has value {value!r}, expected a positive integer")
        elif key == "precision":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise UserError(f"{where}: budget field 'precision' has value {value!r}, expected a fraction from 0 (never stop early) to below 1")
        elif key == "min_measure_share":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise UserError(f"{where}: budget field 'min_measure_share' has value {value!r}, expected a share of measure_s from 0 to 1")
        elif (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
              or value < 0 or (key == "measure_s" and value == 0) or value > MAX_BUDGET_S):
            # warmup_s = 0 still warms up with one call, min_sample_s = 0 is what CUDA budgets use; measuring for 0 s is nothing.
            expected = "a finite, positive number of seconds" if key == "measure_s" else "a finite number of seconds, 0 or more"
            expected += f", at most {MAX_BUDGET_S:g}"
            raise UserError(f"{where}: budget field {key!r} has value {value!r}, expected {expected}")
    if budget_spec.get("min_rounds", 0) > budget_spec.get("max_rounds", float("inf")):
        raise UserError(f"{where}: budget field 'min_rounds' has value {budget_spec['min_rounds']!r}, more than max_rounds {budget_spec['max_rounds']!r}")
    return Budget(**{**base.__dict__, **budget_spec})
