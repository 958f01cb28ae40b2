"""The range checks of a record's numbers: what a type check lets through but no measurement gives.

`Record.from_dict` checks each field's type; these then refuse a value of the right type that no writer
produces (a negative duration, position, cool-down, energy or power, a NaN or infinity where a figure is
finite), naming the file, the row and the field as `where` gives them, so a corrupt or hand-edited row
stops the reader instead of skewing a report.
"""

from __future__ import annotations

import math
from typing import Any

from harness.errors import UserError

#: The latency columns: durations, never negative; on an `ok` row the median is what every ratio divides by.
LATENCY_FIELDS = ("latency_ms_median", "latency_ms_p20", "latency_ms_p80", "latency_ms_min", "latency_ms_mean", "latency_ms_max",
                  "latency_ms_stdev", "latency_ms_ci95_low", "latency_ms_ci95_high")
#: Columns that are finite and never negative where present: the pair's place in its case's order, the cool-down
#: before it, and the energy phase's and GPU state's energy, power and counts (a writer stores an unknown one as null).
NON_NEGATIVE_FIELDS = ("order_in_case", "cooldown_s", "energy_mj_per_call", "avg_power_w", "gflop_per_joule", "energy_window_s",
                       "energy_calls", "energy_counter_updates", "gpu_power_w_mean")


def check_latencies(record: Any, where: str) -> None:
    """UserError for a negative latency, or an `ok` row whose median is 0: no measurement gives either, and ratios would lie."""
    for name in LATENCY_FIELDS:
        value = getattr(record, name)
        if value is not None and value < 0:
            raise UserError(f"{where}: field {name!r} has value {value!r}, a negative duration")
    if record.status == "ok" and record.latency_ms_median is not None and record.latency_ms_median <= 0:
        raise UserError(f"{where}: field 'latency_ms_median' is {record.latency_ms_median!r} on an ok row; a measured call takes time")
    if record.sample_ms is not None and any(isinstance(v, (int, float)) and v < 0 for v in record.sample_ms):
        raise UserError(f"{where}: field 'sample_ms' holds a negative duration")


def check_ranges(record: Any, where: str) -> None:
    """UserError naming the field of a negative or non-finite position, cool-down, energy, power or count."""
    for name in NON_NEGATIVE_FIELDS:
        value = getattr(record, name)
        # The type check turned the numbers into ints or floats; a NaN compares false with everything, so test it apart.
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UserError(f"{where}: field {name!r} has value {value!r}, expected a finite non-negative number")
