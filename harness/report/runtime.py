"""The report's Run time section: where a sweep's wall time went, per phase of the pair executor, and the harness's overhead.

Every record carries its phases' host seconds (`time_*_s`) and the manifest each attempt's wall time;
overhead is what the wall time spent outside warm-up and timed samples, so it is a measured number.
"""

from __future__ import annotations

import pandas as pd

from harness import analysis
from harness.results.vocabulary import PHASE_NAMES
from harness.results.vocabulary import STOP_BUDGET, STOP_CALL_EXCEEDS_BUDGET, STOP_FIRST_CALL, STOP_MAX_ROUNDS, STOP_MIN_ROUNDS, STOP_PRECISION
from harness.report.writer import Csv, Section, Table

#: What each phase is, in words, for the table.
PHASE_WORDS = {
    "inputs": "seeded inputs and their fingerprints",
    "prepare": "the backend's untimed preparation (layouts, masks, compilation)",
    "check": "the float64 reference (once per case) and the comparison with it",
    "warmup": "warm-up (the pair's first call) and calibration",
    "timed": "the timed samples",
    "memory": "resetting and reading the peak-memory counters",
    "energy": "the energy phase (calls back to back on the energy counter; none without one)",
    "profile": "the profiled pass",
}


def run_time_table(data: analysis.RunData) -> pd.DataFrame:
    """Seconds per phase summed over the runs' rows, the pairs' clean-up, what no pair accounts for, and the wall time."""
    frame = data.frame
    wall = sum(float(a.get("wall_s") or 0.0) for m in data.manifests.values() for a in m.get("attempts", []))
    rows = []
    for phase in PHASE_NAMES:
        column = f"time_{phase}_s"
        if column in frame.columns:
            rows.append({"where": phase, "what": PHASE_WORDS[phase], "seconds": float(pd.to_numeric(frame[column], errors="coerce").sum())})
    phases = sum(r["seconds"] for r in rows)
    pairs = float(pd.to_numeric(frame.get("time_pair_s"), errors="coerce").sum()) if "time_pair_s" in frame.columns else 0.0
    rows.append({"where": "per-pair clean-up", "what": "releasing memory between pairs", "seconds": max(0.0, pairs - phases)})
    if wall > 0:
        rows.append({"where": "outside pairs", "what": "peaks, worker start-up, pytest per test, record writes, CSV",
                     "seconds": max(0.0, wall - pairs)})
    table = pd.DataFrame(rows)
    total = wall if wall > 0 else pairs
    table["share"] = table["seconds"] / total if total > 0 else None
    return table


def overhead_share(table: pd.DataFrame) -> float | None:
    """Share of the wall time spent outside warm-up and timed samples (None without a wall time)."""
    total = float(table["seconds"].sum())
    if not total > 0:
        return None
    measured = float(table.loc[table["where"].isin(["warmup", "timed"]), "seconds"].sum())
    return 1.0 - measured / total


#: What set a row's number of samples (harness.measure.stopping), in words.
STOP_WORDS = {
    STOP_PRECISION: "once the median's 95 % interval was within ±1 % on a steady run",
    STOP_BUDGET: "at the time budget",
    STOP_MIN_ROUNDS: "at the minimum of samples (the budget held fewer)",
    STOP_MAX_ROUNDS: "at the maximum of samples",
    STOP_CALL_EXCEEDS_BUDGET: "short of the minimum, because one call costs more than the budget holds",
    STOP_FIRST_CALL: "after the first call, which cost five budgets or more and is the one sample",
}


def sampling_summary(frame: pd.DataFrame) -> str | None:
    """One sentence: what stopped the sampling of the ok rows, and how many of their medians are known to ±1 %."""
    if "stopped_by" not in frame.columns:
        return None
    ok = frame[(frame["status"].astype(str) == "ok") & frame["stopped_by"].notna()]
    if ok.empty:
        return None
    counts = ok["stopped_by"].value_counts()
    parts = [f"{int(counts[k])} {STOP_WORDS.get(k, k)}" for k in STOP_WORDS if k in counts]
    low, high, median = (pd.to_numeric(ok[c], errors="coerce") for c in ("latency_ms_ci95_low", "latency_ms_ci95_high", "latency_ms_median"))
    tight = int(((median - low <= 0.01 * median) & (high - median <= 0.01 * median)).sum())
    return (f"Sampling of the {len(ok)} ok rows stopped: {'; '.join(parts)}. "
            f"{tight} of them have their median's 95 % interval within ±1 %; each row carries its own (latency_ms_ci95_low/high).")


def runtime_section(data: analysis.RunData) -> Section:
    """The Run time section."""
    table = run_time_table(data)
    share = overhead_share(table)
    body: list = ["<p>Host seconds of every phase of every pair, summed, beside the runs' wall time (each attempt, "
                  "set-up included). The harness's overhead is everything but warm-up and the timed samples.</p>"]
    if share is not None:
        body.append(f"<p><b>Overhead: {share:.0%} of {table['seconds'].sum():.0f} s</b> "
                    f"(timed samples {float(table.loc[table['where'] == 'timed', 'seconds'].sum()):.0f} s).</p>")
    summary = sampling_summary(data.frame)
    if summary:
        body.append(f"<p>{summary}</p>")
    body.append(Csv(table, "run_time.csv"))
    body.append(Table(table, headers=["where", "what", "seconds", "share of the wall time"], scroll=False,
                      formats={"share": lambda v, r: (f"{v:.1%}" if v == v and v is not None else "", "")}))
    return Section("runtime", "Run time: where the sweep's time went", body, nav="Run time")
