"""Winners among agreeing rows without untrusted flags, speed-ups over the baseline, and winner maps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from harness.analysis.difference import HIGH, LOW, differ
from harness.analysis.frame import CASE_KEY, agreeing_rows, case_key, case_labels
from harness.analysis.trust import flags_of, left_out, untrusted
from harness.analysis.variants import VARIANT_FIELDS, variant_label


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
    flagged_per_case: dict[tuple, list] = {}
    for _, r in counted.iterrows():
        flagged_per_case.setdefault(tuple(r[c] for c in case_key(counted)), []).append(r)
    by_latency = metric == "latency_ms_median"
    if not by_latency:
        rows = rows[pd.to_numeric(rows[metric], errors="coerce").notna()] if metric in rows.columns else rows.iloc[0:0]
    unit = "ms" if by_latency else metric
    baseline = baseline or default_baseline(frame)
    # Only the columns read below: a row of the whole frame (~200 columns) is costly to take a thousand times.
    keep = list(dict.fromkeys([*CASE_KEY, "case", "backend", metric, *CASE_KEYS, *VARIANT_FIELDS, LOW, HIGH, "repro", "run_id"]))
    rows = rows[[c for c in keep if c in rows.columns]]
    rows = rows.assign(case_order=pd.factorize(rows["case_id"])[0]).sort_values(["case_order", metric], kind="stable")  # cases keep the frame's order
    out = []
    for _, sub in rows.groupby(case_key(rows), sort=False):
        best = sub.iloc[0]
        second = sub.iloc[1] if len(sub) > 1 else None
        base = sub[sub["backend"] == baseline]
        base_value = float(base[metric].iloc[0]) if not base.empty else None
        key = tuple(best[k] for k in case_key(sub))
        out.append({
            "case": case_labels(sub).iloc[0], **{k: best[k] for k in (*case_key(sub), *CASE_KEYS)},
            "winner": best["backend"], f"winner_{unit}": float(best[metric]),
            "runner_up": second["backend"] if second is not None else None,
            f"runner_up_{unit}": float(second[metric]) if second is not None else None,
            "margin_pct": 100.0 * (float(second[metric]) / float(best[metric]) - 1.0) if second is not None else None,
            "runner_up_ratio": float(second[metric]) / float(best[metric]) if second is not None else None,
            "within_noise": bool(second is not None and not differ(best, second, cv)) if by_latency else None,
            "candidates": len(sub), "only_candidate": len(sub) == 1, "variant": variant_label(best),
            "left_out": left_out_per_case.get(key, 0),
            "faster_left_out": faster_left_out(flagged_per_case.get(key, []), float(best[metric]), metric) if by_latency else "",
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


def winner_map(frame: pd.DataFrame, axis: str, dtype: str, wins: pd.DataFrame | None = None, variant: str | None = None) -> pd.DataFrame:
    """S × `axis` (B or H_kv) for one dtype and one score variant: per cell, the backend that wins the most cases, and how many of them.

    Only square cases (S_q = S_kv) of the one `variant` (`variant_label`: plain, sinks, softcap …; default: plain
    where the run has it): a cell never mixes problems that compute different scores. A case with one candidate is
    never a win: `won` of `cases` counts only cases with a runner-up, and `only_candidate` the rest, with the lone
    backends in `alone`; a cell with no contested case has no winner. Other parameters vary inside a cell, which is
    why the count is shown; ties go to the lower geometric-mean time of the tied winners. `wins` is `winners(frame)`.
    """
    wins = winners(frame) if wins is None else wins
    if wins.empty:
        return pd.DataFrame()
    wins = wins[(wins["dtype"] == dtype) & (wins["S_q"] == wins["S_kv"])]
    if variant is None:
        labels = list(dict.fromkeys(wins["variant"]))
        variant = "plain" if "plain" in labels or not labels else labels[0]
    wins = wins[wins["variant"] == variant]
    out = []
    for (s, a), sub in wins.groupby(["S", axis], sort=True):
        contested = sub[~sub["only_candidate"].astype(bool)]
        alone = ", ".join(sorted(set(sub.loc[sub["only_candidate"].astype(bool), "winner"])))
        cell = {"S": int(s), axis: int(a), "variant": variant, "winner": None, "won": 0, "cases": len(contested),
                "only_candidate": len(sub) - len(contested), "alone": alone}
        if len(contested):
            counts = contested["winner"].value_counts()
            top = counts[counts == counts.max()].index.tolist()
            if len(top) > 1:
                geo = {b: float(np.exp(np.log(contested.loc[contested["winner"] == b, "winner_ms"]).mean())) for b in top}
                top = [min(geo, key=geo.get)]
            cell.update(winner=top[0], won=int(counts[top[0]]))
        out.append(cell)
    return pd.DataFrame(out)


def faster_left_out(flagged: list, winner_value: float, metric: str = "latency_ms_median") -> str:
    """The flagged agreeing rows faster than the answer, named beside it ('sdpa 0.5 ms (contended)'); '' when none is."""
    faster = sorted((r for r in flagged if pd.notna(r.get(metric)) and float(r[metric]) < winner_value), key=lambda r: float(r[metric]))
    return "; ".join(f"{r['backend']} {float(r[metric]):.4g} ms ({' and '.join(flags_of(r))})" for r in faster)


def wins_per_backend(wins: pd.DataFrame) -> pd.DataFrame:
    """Per backend: the cases it won against at least one other candidate, and those it was the only candidate of (never a win)."""
    if wins.empty:
        return pd.DataFrame(columns=["backend", "cases won", "only candidate"])
    alone = wins["only_candidate"].astype(bool)
    table = pd.DataFrame({"cases won": wins.loc[~alone, "winner"].value_counts(), "only candidate": wins.loc[alone, "winner"].value_counts()})
    table = table.fillna(0).astype(int).rename_axis("backend").reset_index()
    return table.sort_values(["cases won", "only candidate", "backend"], ascending=[False, False, True], kind="stable").reset_index(drop=True)


def no_winner_reason(rows: pd.DataFrame) -> str:
    """Why `rows` (one case's, or every row a question reads) crown no backend, in the words a user acts on.

    Three reasons, checked in order: nothing supported (no row ran), no row agreed (rows ran, none agrees with the
    float64 reference), rows agreed but were flagged (contended, suspect, …: re-measure on a quiet machine). The
    report, `recommend` and the site all say it with this one function. '' when some row ran, agreed and carries no flag.
    """
    if rows is None or rows.empty:
        return "nothing measured: the run has no row for it"
    ran = rows[rows["status"] == "ok"]
    if ran.empty:
        statuses = Counter(str(s) for s in rows["status"])
        listed = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
        return f"nothing supported: no backend ran it ({listed}; each row says why)"
    agreed = ran[ran["agree"].map(lambda a: isinstance(a, (bool, np.bool_)) and bool(a))]
    if agreed.empty:
        checked = ran["agree"].map(lambda a: isinstance(a, (bool, np.bool_))).any()
        return (f"no row agreed: {len(ran)} rows ran and none agrees with the float64 reference" if checked
                else f"no row agreed: {len(ran)} rows ran unchecked (--no-check), and only a row that agrees may be chosen")
    flagged = left_out(agreed)
    if flagged.rows == len(agreed):
        names = [name for name, n in flagged.counts.items() if n]
        by_flag = ", ".join(f"{flagged.counts[name]} {name}" for name in names)
        counted = f"all {len(agreed)} rows that ran and agreed carry" if len(agreed) > 1 else "the one row that ran and agreed carries"
        return (f"rows agreed but were {' or '.join(names)}: {counted} that flag ({by_flag}), "
                "so none measures a backend's speed; re-measure on a quiet machine")
    return ""  # some row ran, agreed and carries no flag: there is an answer


def unanswered_cases(frame: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """The cases of `frame`'s attention cores that `wins` crowns no backend for, each with why (`no_winner_reason`): columns case, why."""
    from harness.analysis.frame import is_core

    core = frame[is_core(frame)]
    won = set(wins["case_id"]) if not wins.empty else set()
    rows = [{"case": str(sub["case"].iloc[0] if "case" in sub.columns else case), "why": no_winner_reason(sub)}
            for case, sub in core.groupby("case_id", sort=False) if case not in won]
    return pd.DataFrame(rows, columns=["case", "why"])
