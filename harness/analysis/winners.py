"""Winners among agreeing rows without untrusted flags, speed-ups over the baseline, and winner maps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from harness.analysis.difference import HIGH, LOW, differ
from harness.analysis.frame import CASE_KEY, agreeing_rows, case_key, case_labels
from harness.analysis.trust import untrusted


def default_baseline(frame: pd.DataFrame) -> str | None:
    """The backend that declares itself the baseline (sdpa-math), among those in the frame."""
    declared = frame.loc[frame["baseline"].astype(bool), "backend"]
    return str(declared.iloc[0]) if len(declared) else None


#: The case's fields a winners row repeats.
CASE_KEYS = ("B", "S_q", "S_kv", "S", "H", "H_kv", "d_k", "dtype", "causal", "mode")


def winners(frame: pd.DataFrame, baseline: str | None = None, metric: str = "latency_ms_median", cv: float = 0.0) -> pd.DataFrame:
    """Per case, the agreeing backend lowest in `metric` (the fastest by default), its margin over the runner-up and its ratio to `baseline`.

    `within_noise` is True when the winner and the runner-up do not differ by `harness.analysis.difference`'s rule
    (their intervals, widened by the run-to-run variation `cv`, overlap). With another metric (energy per call)
    rows without it are left out, its columns are named after it (`winner_<metric>`) and `within_noise` is None:
    only latency has an interval to judge noise by.
    """
    rows = agreeing_rows(frame)
    flagged = agreeing_rows(frame, flagged=True)
    counted = flagged[untrusted(flagged)]
    left_out_per_case = Counter(zip(*(counted[c] for c in case_key(counted))))  # per case, the candidates its flags left out
    by_latency = metric == "latency_ms_median"
    if not by_latency:
        rows = rows[pd.to_numeric(rows[metric], errors="coerce").notna()] if metric in rows.columns else rows.iloc[0:0]
    unit = "ms" if by_latency else metric
    baseline = baseline or default_baseline(frame)
    # Only the columns read below: a row of the whole frame (~200 columns) is costly to take a thousand times.
    keep = list(dict.fromkeys([*CASE_KEY, "case", "backend", metric, *CASE_KEYS, LOW, HIGH, "repro", "run_id"]))
    rows = rows[[c for c in keep if c in rows.columns]]
    rows = rows.assign(case_order=pd.factorize(rows["case_id"])[0]).sort_values(["case_order", metric], kind="stable")  # cases keep the frame's order
    out = []
    for _, sub in rows.groupby(case_key(rows), sort=False):
        best = sub.iloc[0]
        second = sub.iloc[1] if len(sub) > 1 else None
        base = sub[sub["backend"] == baseline]
        base_value = float(base[metric].iloc[0]) if not base.empty else None
        out.append({
            "case": case_labels(sub).iloc[0], **{k: best[k] for k in (*case_key(sub), *CASE_KEYS)},
            "winner": best["backend"], f"winner_{unit}": float(best[metric]),
            "runner_up": second["backend"] if second is not None else None,
            f"runner_up_{unit}": float(second[metric]) if second is not None else None,
            "margin_pct": 100.0 * (float(second[metric]) / float(best[metric]) - 1.0) if second is not None else None,
            "runner_up_ratio": float(second[metric]) / float(best[metric]) if second is not None else None,
            "within_noise": bool(second is not None and not differ(best, second, cv)) if by_latency else None,
            "candidates": len(sub), "left_out": left_out_per_case.get(tuple(best[k] for k in case_key(sub)), 0),
            "baseline": baseline, f"baseline_{unit}": base_value,
            "speedup_vs_baseline": base_value / float(best[metric]) if base_value else None,
            "winner_repro": best.get("repro"), "winner_run": best.get("run_id"),
        })
    return pd.DataFrame(out)


def speedups(frame: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Cases × backends: baseline median ÷ backend median (agreeing rows only; > 1 is faster than the baseline)."""
    rows = agreeing_rows(frame)
    baseline = baseline or default_baseline(frame)
    rows = rows.assign(case=case_labels(rows))
    base = rows[rows["backend"] == baseline].set_index("case")["latency_ms_median"]
    if base.empty:
        return pd.DataFrame()
    rows = rows[rows["case"].isin(base.index)]
    table = rows.pivot_table(index="case", columns="backend", values="latency_ms_median", aggfunc="first")
    return table.rdiv(base, axis=0).reindex(base.index)


def winner_map(frame: pd.DataFrame, axis: str, dtype: str, wins: pd.DataFrame | None = None) -> pd.DataFrame:
    """S × `axis` (B or H_kv) for one dtype: per cell, the backend that wins the most cases, and how many of them.

    Only square cases (S_q = S_kv); the other parameters vary inside a cell, which is why the
    count is shown (`won`/`cases`); ties go to the lower geometric-mean time of the tied winners.
    `wins` is `winners(frame)` when the caller already has it.
    """
    wins = winners(frame) if wins is None else wins
    if wins.empty:
        return pd.DataFrame()
    wins = wins[(wins["dtype"] == dtype) & (wins["S_q"] == wins["S_kv"])]
    out = []
    for (s, a), sub in wins.groupby(["S", axis], sort=True):
        counts = sub["winner"].value_counts()
        top = counts[counts == counts.max()].index.tolist()
        if len(top) > 1:
            geo = {b: float(np.exp(np.log(sub.loc[sub["winner"] == b, "winner_ms"]).mean())) for b in top}
            top = [min(geo, key=geo.get)]
        out.append({"S": int(s), axis: int(a), "winner": top[0], "won": int(counts[top[0]]), "cases": len(sub)})
    return pd.DataFrame(out)
