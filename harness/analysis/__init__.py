"""From measured rows to answers: the analysis frame, scaling fits, the S² crossover, winners and recommend, run comparison.

`from harness import analysis` gives the whole public API; each part lives in its own module.
"""

from harness.analysis.crossover import Crossing, crossovers, find_crossing
from harness.analysis.fits import Fit, fit_power_law, memory_model, memory_vs_model, scaling_fits
from harness.analysis.frame import (
    GROUP_FIELDS, MIN_FIT_POINTS, RunData, agreeing_rows, declared_capabilities, derive_columns, describe_group,
    group_key_columns, groups, is_core, load, ok_rows, trusted_rows, with_roofline,
)
from harness.analysis.recommend import Answer, Recommendation, model_shape, recommend, recommend_model
from harness.analysis.trust import LeftOut, left_out, trusted
from harness.analysis.winners import default_baseline, speedups, winner_map, winners

__all__ = [
    "Crossing", "crossovers", "find_crossing", "Fit", "fit_power_law", "memory_model", "memory_vs_model", "scaling_fits",
    "GROUP_FIELDS", "MIN_FIT_POINTS", "RunData", "agreeing_rows", "declared_capabilities", "derive_columns", "describe_group",
    "group_key_columns", "groups", "is_core", "load", "ok_rows", "trusted_rows", "with_roofline",
    "Answer", "Recommendation", "model_shape", "recommend", "recommend_model", "LeftOut", "left_out", "trusted",
    "default_baseline", "speedups", "winner_map", "winners",
]
