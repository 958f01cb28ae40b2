"""Winners among agreeing rows, speed-ups over the baseline, winner maps, and `recommend` from measured rows only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from harness.errors import UserError

from harness.analysis.difference import HIGH, LOW, differ, interval_of
from harness.analysis.frame import CASE_KEY, agreeing_rows, case_key, case_labels, is_core


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
    by_latency = metric == "latency_ms_median"
    if not by_latency:
        rows = rows[pd.to_numeric(rows[metric], errors="coerce").notna()] if metric in rows.columns else rows.iloc[0:0]
    unit = "ms" if by_latency else metric
    baseline = baseline or default_baseline(frame)
    # Only the columns read below: a row of the whole frame (~200 columns) is costly to take a thousand times.
    keep = list(dict.fromkeys([*CASE_KEY, "case", "backend", metric, *CASE_KEYS, LOW, HIGH, "repro"]))
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
            "within_noise": bool(second is not None and not differ(best, second, cv)) if by_latency else None,
            "candidates": len(sub), "baseline": baseline, f"baseline_{unit}": base_value,
            "speedup_vs_baseline": base_value / float(best[metric]) if base_value else None,
            "winner_repro": best.get("repro"),
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


# -- model presets and recommend --------------------------------------------------------------
def model_shape(name: str) -> dict[str, Any]:
    """H, H_kv, d_k and window of a published model's preset (`harness.suite.presets`)."""
    from harness.suite.presets import get_preset

    preset = get_preset(name.strip().lower())
    return {"H": preset.H, "H_kv": preset.H_kv, "d_k": preset.d_k, "window": preset.window}


@dataclass
class Recommendation:
    """The answer for one measured case: the winner, the runner-up, and the rows it is based on."""

    case_id: str
    winner: str | None
    winner_ms: float | None
    runner_up: str | None
    runner_up_ms: float | None
    margin_pct: float | None
    rows: pd.DataFrame
    #: True when the winner and the runner-up do not differ by `harness.analysis.difference`'s rule: the order may be noise.
    within_noise: bool = False

    def lines(self) -> list[str]:
        """The human answer, then one line per row it used."""
        if self.winner is None:
            head = f"{self.case_id}: no backend ran and agreed with the reference; nothing to recommend"
        elif self.runner_up is None:
            head = f"{self.case_id}: {self.winner} ({self.winner_ms:.4g} ms), the only backend that ran and agreed"
        else:
            head = (f"{self.case_id}: {self.winner} ({self.winner_ms:.4g} ms), {self.margin_pct:.1f}% faster than "
                    f"the runner-up {self.runner_up} ({self.runner_up_ms:.4g} ms)")
            if self.within_noise:
                head += "; within noise (their 95 % intervals overlap): either is a fair choice"
        out = [head, "  based on these rows:"]
        for _, r in self.rows.sort_values("latency_ms_median", na_position="last").iterrows():
            if r["status"] == "ok":
                agree = "agrees" if r["agree_ok"] else ("not checked" if r["agree"] is None else "DISAGREES (excluded)")
                interval = interval_of(r)
                spread = f"95 % interval {interval[0]:.4g}–{interval[1]:.4g}" if interval else "no 95 % interval (under 6 samples)"
                out.append(f"    {r['backend']:<16} {r['latency_ms_median']:>10.4g} ms  {spread}  {agree}")
            else:
                out.append(f"    {r['backend']:<16} {r['status']}: {r['reason']}")
        return out


def batch_key(text: Any) -> str | None:
    """A batch description in the one spelling rows are matched by (harness.suite.batch's canonical text); None for none.

    A file is named, not read: rows carry its name. Text the grammar does not read is matched as written, spaces removed.
    """
    from harness.suite.batch import parse_batch

    if not isinstance(text, str) or not text.strip():
        return None
    try:
        text = parse_batch(text, read=False).text
    except UserError:
        pass
    return "".join(text.split())


def _batch_rows(rows: pd.DataFrame, batch: str) -> pd.Series:
    """Which rows measured the batch `batch` (their `length_dist`); UserError listing the run's batches when none did."""
    recorded = rows["length_dist"] if "length_dist" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
    from harness.suite.batch import parse_batch

    parse_batch(batch, read=False)  # a query the grammar cannot read is the user's mistake, said in one line
    match = recorded.map(batch_key) == batch_key(batch)
    if not match.any():
        seen = sorted({str(d) for d in recorded if batch_key(d)})
        measured = f"its batches are {'; '.join(seen)}" if seen else "it has no serving batches (no row has a length_dist)"
        raise UserError(f"the run measured no batch {batch!r}: {measured}; run a suite with that batch first")
    return match


def recommend(frame: pd.DataFrame, query: Mapping[str, Any], cv: float = 0.0) -> list[Recommendation]:
    """Answer from measured rows for the cases matching `query` (fields: B, S, H, H_kv, d_k, dtype, causal, window, batch).

    Winner and runner-up are judged by `harness.analysis.difference`'s rule, widened by the run-to-run variation `cv`.
    Unspecified fields match anything; `S` means S_q = S_kv = S; `batch` is a batch description, matched
    against the rows' `length_dist`. Raises UserError naming the measured values when the run holds no
    case of that shape: it never interpolates or guesses.
    """
    rows = frame[is_core(frame)]
    for name, value in query.items():
        if value is None:
            continue
        if name == "batch":
            match = _batch_rows(rows, value)
        elif name == "S":
            match = (rows["S_q"] == value) & (rows["S_kv"] == value)
        elif name == "window":
            match = rows["window"].map(lambda w: w is not None and w == w and int(w) == int(value))
        else:
            match = rows[name] == value
        if not match.any():
            column = rows["S_kv"] if name == "S" else rows[name]
            seen = [str(v) for v in sorted(column.dropna().unique(), key=lambda v: (not isinstance(v, (int, np.integer)), v if isinstance(v, (int, np.integer)) else str(v)))]
            given = ", ".join(f"{k}={v}" for k, v in query.items() if v is not None)
            raise UserError(f"the run measured no case with {given}: {name} was measured at {', '.join(seen) or 'nothing'} only; run a suite with that shape first")
        rows = rows[match]
    out = []
    for _, sub in rows.groupby(case_key(rows), sort=True):
        case_id = case_labels(sub).iloc[0]
        good = sub[(sub["status"] == "ok") & sub["agree_ok"]].sort_values("latency_ms_median")
        best = good.iloc[0] if len(good) else None
        second = good.iloc[1] if len(good) > 1 else None
        out.append(Recommendation(
            case_id, best["backend"] if best is not None else None, float(best["latency_ms_median"]) if best is not None else None,
            second["backend"] if second is not None else None, float(second["latency_ms_median"]) if second is not None else None,
            100.0 * (float(second["latency_ms_median"]) / float(best["latency_ms_median"]) - 1.0) if second is not None else None,
            sub, second is not None and not differ(best, second, cv),
        ))
    return out
