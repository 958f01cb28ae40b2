"""What a deterministic backward costs: each backend's deterministic row against its row of the same case without it.

Both rows must be measured, agree with the float64 reference and carry no untrusted flag (contended, suspect:
harness.analysis.trust), so the ratio compares two numbers the run stands behind. The plain twin is the row whose
case differs only in `deterministic` (its case id is the deterministic one's without `-det`).
"""

from __future__ import annotations

import pandas as pd

from harness.analysis.difference import order
from harness.analysis.frame import agreeing_rows

#: The columns of `determinism_cost`'s frame, in order.
COST_COLUMNS = ("backend", "case_id", "plain_case_id", "det_ms", "plain_ms", "ratio", "verdict", "bitwise_repeatable",
                "plain_bitwise_repeatable")
#: What the one rule for "different" (harness.analysis.difference) says of the two rows: their 95 % intervals of the median.
DEARER, CHEAPER, WITHIN_NOISE = "dearer", "cheaper", "within noise"


def plain_case_id(case_id: str) -> str:
    """The id of the same case without deterministic: its `-det` token dropped."""
    return "-".join(token for token in case_id.split("-") if token != "det")


def _repeatable(value: object) -> bool | None:
    """A row's bitwise_repeatable as a bool, None where unmeasured (NaN in a frame, or a run recorded before the column)."""
    return None if value is None or value != value else bool(value)


def determinism_cost(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend and deterministic case with a plain twin: both medians, det / plain, whether the rule calls them different, and
    each row's bitwise repetition. A ratio whose intervals overlap is noise, however far from 1 it reads."""
    if frame.empty or "deterministic" not in frame.columns:
        return pd.DataFrame(columns=COST_COLUMNS)
    rows = agreeing_rows(frame)
    deterministic = rows["deterministic"].map(lambda v: v is True or v == 1)
    plain = {(r["backend"], r["case_id"]): r for _, r in rows[~deterministic].iterrows()}
    out = []
    for _, r in rows[deterministic].iterrows():
        twin = plain.get((r["backend"], plain_case_id(r["case_id"])))
        if twin is None:
            continue
        det_ms, plain_ms = float(r["latency_ms_median"]), float(twin["latency_ms_median"])
        out.append({"backend": r["backend"], "case_id": r["case_id"], "plain_case_id": twin["case_id"], "det_ms": det_ms,
                    "plain_ms": plain_ms, "ratio": det_ms / plain_ms,
                    "verdict": {1: DEARER, -1: CHEAPER}.get(order(r, twin), WITHIN_NOISE),
                    "bitwise_repeatable": _repeatable(r.get("bitwise_repeatable")),
                    "plain_bitwise_repeatable": _repeatable(twin.get("bitwise_repeatable"))})
    # Object columns: a measured True/False stays a Python bool beside an unmeasured None, never numpy's.
    return pd.DataFrame(out, columns=COST_COLUMNS).astype({"bitwise_repeatable": object, "plain_bitwise_repeatable": object})


def has_deterministic_rows(frame: pd.DataFrame) -> bool:
    """Whether any row of the run is a deterministic case."""
    return "deterministic" in frame.columns and bool(frame["deterministic"].map(lambda v: v is True or v == 1).any())
