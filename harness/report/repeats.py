"""The report's Repeated pairs section: where several runs measured one (case, backend), every run's row, and which one the tables use.

A report over several runs shows one row per pair (`harness.analysis.frame.one_row_per_pair`: the last run's
row that carries no contended or suspect flag, else the last run's). The others are not dropped silently:
this section lists every run's median beside the one used, and whether they differ by the one rule.
"""

from __future__ import annotations

import pandas as pd

from harness.analysis.difference import differ
from harness.analysis.trust import flags_of
from harness.report.page import esc
from harness.report.writer import Csv, Section, Table

COLUMNS = ["case_id", "backend", "run_id", "latency_ms_median", "latency_ms_ci95_low", "latency_ms_ci95_high", "status",
           "flags", "run_used", "differs_from_used"]


def repeated_table(repeated: pd.DataFrame) -> pd.DataFrame:
    """Every row of a repeated pair, with its flags, whether the tables use it, and whether it differs from the used row by the rule."""
    if repeated.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for _, sub in repeated.groupby(["case_id", "backend"], sort=False, dropna=False):
        used = sub[sub["run_used"]]
        chosen = used.iloc[0] if len(used) else None
        for _, r in sub.iterrows():
            both_ok = chosen is not None and r["status"] == chosen["status"] == "ok"
            rows.append({**{c: r.get(c) for c in COLUMNS[:7]}, "flags": ", ".join(flags_of(r)), "run_used": bool(r["run_used"]),
                         "differs_from_used": (differ(r, chosen) if both_ok else None) if not r["run_used"] else None})
    return pd.DataFrame(rows, columns=COLUMNS)


def repeats_section(repeated: pd.DataFrame) -> Section | None:
    """The section, or None when no pair was measured by more than one run."""
    table = repeated_table(repeated)
    if table.empty:
        return None
    pairs = len(table.drop_duplicates(["case_id", "backend"]))
    body = [f"<p>{esc(pairs)} (case, backend) pairs were measured by more than one run. Every table above uses one row per pair: "
            "the last run's row that carries no contended or suspect flag, else the last run's (<em>used</em>). "
            "<em>differs</em> says whether a row's median differs from the used row's by the rule of the backend-choice table.</p>",
            Csv(table, "repeated_pairs.csv"),
            Table(table, headers=["case", "backend", "run", "median ms", "95 % low", "95 % high", "status", "flags", "used", "differs"])]
    return Section("repeats", "Repeated pairs", body, nav="Repeats")
