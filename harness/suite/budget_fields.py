"""A Budget from its fields by name: a suite file's [budget] table, or the budget a run's manifest holds, validated."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.measure.timing import MAX_BUDGET_S, QUICK_BUDGET, Budget
from harness.suite.case_values import MAX_INT

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
