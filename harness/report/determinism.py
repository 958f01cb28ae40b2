"""The report's Deterministic backward section: what asking for a bitwise-repeatable backward costs each backend."""

from __future__ import annotations

import pandas as pd

from harness.analysis.determinism import determinism_cost, has_deterministic_rows
from harness.report.page import fmt
from harness.report.writer import Csv, Section, Table


def _yes_no(value: object) -> str:
    """A bitwise_repeatable cell: yes, NO, or - where it was not measured."""
    return "-" if value is None or value != value else ("yes" if value else "NO")


def determinism_section(frame: pd.DataFrame) -> Section | None:
    """The section, or None when the run has no deterministic rows."""
    if not has_deterministic_rows(frame):
        return None
    costs = determinism_cost(frame)
    body = ["<p>Each row: one backend's deterministic-backward case against the same backend's case without it, both measured, "
            "agreeing with the float64 reference and neither contended nor suspect. <em>ratio</em> is the deterministic time over "
            "the plain one; <em>by the rule</em> says whether the two rows' 95 % intervals of the median are disjoint (dearer, "
            "cheaper) or overlap (within noise: that ratio is not a cost). <em>bitwise repeatable</em> is measured, not claimed: the check's two consecutive calls compared bit for "
            "bit (a deterministic case whose calls differ disagrees, and is in Agreement, not here). A backend without a "
            "deterministic backward is unsupported for such cases, with its reason in Failures.</p>"]
    if costs.empty:
        body.append("<p>No deterministic row has a measured plain twin to compare with.</p>")
    else:
        body += [Csv(costs, "determinism_cost.csv"),
                 Table(costs, columns=["backend", "case_id", "det_ms", "plain_ms", "ratio", "verdict", "bitwise_repeatable",
                                       "plain_bitwise_repeatable"],
                       headers=["backend", "case", "det (ms)", "plain (ms)", "ratio", "by the rule", "bitwise repeatable",
                                "plain: bitwise repeatable"],
                       formats={"ratio": lambda v, r: (f"{fmt(v)}×", ""),
                                "bitwise_repeatable": lambda v, r: (_yes_no(v), ""),
                                "plain_bitwise_repeatable": lambda v, r: (_yes_no(v), "")})]
    return Section("determinism", "Deterministic backward: its cost, and bitwise repetition measured", body, nav="Determinism")
