"""The S² crossover: where the attention core overtakes the projections, measured and modelled."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from harness.analysis.frame import describe_group, group_key_columns, groups, is_core, num, trusted_rows


@dataclass(frozen=True)
class Crossing:
    """Where a rising curve (the core) overtakes another (the projections) over a sweep of S.

    `s_star` is set only when the curves cross inside the sweep; otherwise `bound` is `<` (the core
    is already slower at the smallest S) or `>` (it never catches up) and `limit` is that S.
    """

    s_star: float | None
    bound: str | None
    limit: int | None
    crossings: int
    note: str = ""

    def text(self) -> str:
        """`1234`, `> 2048` or `< 64`."""
        if self.s_star is not None:
            return f"{self.s_star:,.0f}"
        if self.bound is not None:
            return f"{self.bound} {self.limit:,}"
        return "n/a"

    def over(self, D: int) -> str:
        """S*/D as text, a bound when S* is one."""
        if self.s_star is not None:
            return f"{self.s_star / D:.2f}"
        if self.bound is not None and self.limit is not None:
            return f"{self.bound} {self.limit / D:.2f}"
        return "n/a"


def find_crossing(S: Sequence[float], t_core: Sequence[float], t_proj: Sequence[float]) -> Crossing:
    """The S at which t_core overtakes t_proj, interpolated on log-log axes between the two bracketing points.

    Between S_i (core below) and S_{i+1} (core at or above), log t is taken as linear in log S for
    both curves, so the ratio r = t_core/t_proj crosses 1 at
    log S* = log S_i + (0 − log r_i)·(log S_{i+1} − log S_i)/(log r_{i+1} − log r_i).
    When the curves cross more than once (noise near the crossing) the last upward crossing is
    reported, the one after which the core stays above within the sweep, and the count is noted.
    """
    points = sorted((float(s), float(c), float(p)) for s, c, p in zip(S, t_core, t_proj) if num(s) and num(c) and num(p) and c > 0 and p > 0)
    if len(points) < 2:
        return Crossing(None, None, None, 0, note=f"needs ≥ 2 values of S measured for both curves, has {len(points)}")
    log_s = [math.log(s) for s, _, _ in points]
    log_r = [math.log(c / p) for _, c, p in points]
    ups = [i for i in range(len(points) - 1) if log_r[i] < 0 <= log_r[i + 1]]
    downs = [i for i in range(len(points) - 1) if log_r[i] >= 0 > log_r[i + 1]]
    crossings = len(ups) + len(downs)
    if log_r[-1] < 0:
        note = "core stays below the projections over the whole sweep" if not ups else "core overtook, then fell back below by the largest S"
        return Crossing(None, ">", int(points[-1][0]), crossings, note)
    if not ups:
        return Crossing(None, "<", int(points[0][0]), crossings, "core already slower than the projections at the smallest S")
    i = ups[-1]
    frac = (0.0 - log_r[i]) / (log_r[i + 1] - log_r[i])
    s_star = math.exp(log_s[i] + frac * (log_s[i + 1] - log_s[i]))
    note = f"curves cross {crossings} times; the last upward crossing is reported" if crossings > 1 else ""
    return Crossing(s_star, None, None, crossings, note)


def crossovers(frame: pd.DataFrame) -> pd.DataFrame:
    """S* per attention backend, model width D and fixed parameters, beside the FLOP model's S* (GQA- and causal-aware) and the rule S ≈ D."""
    from harness.attention.theory import model_crossover

    rows = trusted_rows(frame)
    proj = rows[~rows["computes_attention"].astype(bool)]  # the projections: the layer's other term
    # Core rows that disagree with the reference are not attention worth timing; unchecked ones are kept.
    core = rows[is_core(rows) & (rows["agree"].map(lambda a: a is not False and a != 0))]
    if proj.empty or core.empty:
        return pd.DataFrame()
    keys = group_key_columns(rows)
    out = []
    proj_groups = {tuple(k.values()): sub for k, sub in groups(proj, keys)}
    for key, sub in groups(core, ["backend", *keys]):
        pkey = tuple(v for k, v in key.items() if k != "backend")
        psub = proj_groups.get(pkey)
        if psub is None:
            continue
        merged = sub[["S", "latency_ms_median"]].merge(psub[["S", "latency_ms_median"]], on="S", suffixes=("_core", "_proj"))
        if merged.empty:
            continue
        crossing = find_crossing(merged["S"], merged["latency_ms_median_core"], merged["latency_ms_median_proj"])
        D = int(key["H"]) * int(key["d_k"])
        out.append({
            "backend": key["backend"], "D": D, **{k: v for k, v in key.items() if k != "backend"}, "group": describe_group(key),
            "S_star": crossing.s_star, "S_star_text": crossing.text(), "S_star_over_D": crossing.over(D),
            "bound": crossing.bound, "model_S_star": model_crossover(D, int(key["H"]), int(key["H_kv"]), bool(key["causal"])), "rule_of_thumb_S": D,
            "S_min": int(merged["S"].min()), "S_max": int(merged["S"].max()), "points": len(merged),
            "crossings": crossing.crossings, "note": crossing.note,
        })
    return pd.DataFrame(out)
