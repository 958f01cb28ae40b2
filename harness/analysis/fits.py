"""Scaling laws (latency ∝ S^β, memory ∝ S^α) and measured memory against its analytic model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from harness.analysis.frame import MIN_FIT_POINTS, describe_group, group_key_columns, groups, is_core, num, ok_rows, trusted_rows


@dataclass(frozen=True)
class Fit:
    """y ∝ x^exponent on log-log axes, with R²; exponent None (and a note) when it cannot be fitted."""

    exponent: float | None
    r2: float | None
    n: int
    prefactor: float | None = None
    note: str = ""


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> Fit:
    """Least-squares line through (log x, log y): needs ≥ 3 distinct positive x with positive y."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y) if num(a) and num(b) and float(a) > 0 and float(b) > 0]
    n = len(pairs)
    distinct = len({a for a, _ in pairs})
    if distinct < MIN_FIT_POINTS:
        return Fit(None, None, n, note=f"needs ≥ {MIN_FIT_POINTS} points with distinct S, has {distinct}")
    lx = np.log([a for a, _ in pairs])
    ly = np.log([b for _, b in pairs])
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (slope * lx + intercept)
    total = ly - ly.mean()
    ss_tot = float((total**2).sum())
    r2 = 1.0 - float((residual**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return Fit(float(slope), r2, n, float(math.exp(intercept)))


def scaling_fits(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend and fixed parameters: latency ∝ S^β and peak memory ∝ S^α over the measured rows without untrusted flags, with R²."""
    rows = trusted_rows(frame)
    keys = ["backend", *group_key_columns(rows)]
    out = []
    for key, sub in groups(rows, keys):
        sub = sub.sort_values("S")
        lat = fit_power_law(sub["S"], sub["latency_ms_median"])
        mem = fit_power_law(sub["S"], sub["peak_mem_bytes"])
        out.append({
            **key, "group": describe_group(key), "S_values": ",".join(str(int(s)) for s in sorted(set(sub["S"]))),
            "beta_latency": lat.exponent, "r2_latency": lat.r2, "n_latency": lat.n, "note_latency": lat.note,
            "alpha_memory": mem.exponent, "r2_memory": mem.r2, "n_memory": mem.n, "note_memory": mem.note,
        })
    return pd.DataFrame(out)


# -- memory against its model ------------------------------------------------------------------
def memory_model(materializes_scores: bool, B: int, H: int, S_q: int, S_kv: int, d_v: int, itemsize: int) -> tuple[float, str]:
    """The analytic peak of one call (bytes) and the model's name.

    Materialising backends (naive, the SDPA math kernel): the scores and the probabilities,
    `2·B·H·S_q·S_kv` elements of the case dtype (the naive backend computes in that dtype).
    Fused kernels: `O(B·H·S·d)`, taken as the output `B·H·S_q·d_v` they must allocate.
    """
    if materializes_scores:
        return float(2 * B * H * S_q * S_kv * itemsize), "2·B·H·S_q·S_kv (scores + weights)"
    return float(B * H * S_q * d_v * itemsize), "B·H·S_q·d_v (output; O(B·H·S·d))"


def memory_vs_model(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured peak beside the analytic one, with their ratio, for every measured attention row (fwd)."""
    from harness.suite.case_values import DTYPE_BYTES, canonical_dtype

    rows = ok_rows(frame)  # a peak of memory does not depend on what else the machine ran: contended rows count
    rows = rows[is_core(rows) & (rows["mode"] == "fwd")]
    out = []
    for _, r in rows.iterrows():
        model, name = memory_model(bool(r["materializes_scores"]), int(r["B"]), int(r["H"]), int(r["S_q"]), int(r["S_kv"]), int(r["d_v"]), DTYPE_BYTES[canonical_dtype(str(r["dtype"]))])
        peak = num(r["peak_mem_bytes"])
        out.append({
            "case_id": r["case_id"], "case": r.get("case", r["case_id"]), "backend": r["backend"], "S": int(r["S"]), "group": describe_group(r),
            "peak_mem_bytes": peak, "model_bytes": model, "model": name,
            # A zero reading is below the meter's resolution (CPU RSS grows by pages), not a free call.
            "ratio": peak / model if peak and model > 0 else None,
        })
    return pd.DataFrame(out)
