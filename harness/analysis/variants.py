"""What each score variant costs each backend: a row with softcap (or sinks, or ALiBi) against the same backend's row of
the same case without it, both measured, agreeing and unflagged.

The pairs come from the run itself: a suite that wants the cost measures both cases (models-2026 does, for every
case of a model that uses a variant). `ratio` is the variant's median over the plain one's; above 1 the variant
costs time. Whether the two differ is the harness's one rule (`harness.analysis.difference`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.analysis.difference import differ
from harness.analysis.frame import agreeing_rows, describe_group, group_key_columns

#: Each variant: its column, and the value a row without it holds.
VARIANTS = {"softcap": None, "sinks": False, "alibi": False}


def _is_off(value: Any, off: Any) -> bool:
    """Whether a row's variant column holds its 'without' value (None and NaN both mean no softcap)."""
    if off is None:
        return value is None or (isinstance(value, float) and value != value)
    return value is False or value == off


def variant_costs(frame: pd.DataFrame, cv: float = 0.0) -> pd.DataFrame:
    """One row per (variant, backend, case with it) that has its plain twin: both medians, their ratio, and whether they differ."""
    rows = agreeing_rows(frame)
    present = [name for name in VARIANTS if name in rows.columns]
    if rows.empty or not present:
        return pd.DataFrame()
    out = []
    for name in present:
        off = VARIANTS[name]
        keys = [c for c in group_key_columns(rows, exclude=(name,)) if c not in ("seq_lens_q", "seq_lens_kv")] + ["S_q", "S_kv", "backend"]
        plain = rows[rows[name].map(lambda v, off=off: _is_off(v, off))]
        plain_by_key = {tuple(map(repr, (r[k] for k in keys))): r for _, r in plain.iterrows()}
        for _, r in rows[~rows[name].map(lambda v, off=off: _is_off(v, off))].iterrows():
            twin = plain_by_key.get(tuple(map(repr, (r[k] for k in keys))))
            if twin is None:
                continue
            on_ms, off_ms = float(r["latency_ms_median"]), float(twin["latency_ms_median"])
            out.append({"variant": name, "value": r[name], "backend": r["backend"], "case_id": r["case_id"], "plain_case_id": twin["case_id"],
                        "group": describe_group({k: r[k] for k in keys if k != "backend"}),
                        "with_ms": on_ms, "without_ms": off_ms, "ratio": on_ms / off_ms, "differs": differ(r, twin, cv)})
    return pd.DataFrame(out)


#: The Case fields that change what a score computes (beside the heads and lengths), in the order a label names them.
VARIANT_FIELDS = ("window", "softcap", "sinks", "alibi", "scale")


def holds_value(value: Any) -> bool:
    """Whether a variant column holds a value (not None, NaN, False or 0): the case has that variant."""
    if value is None or value is False or (isinstance(value, float) and value != value):
        return False
    try:
        return not pd.isna(value) and bool(value)
    except (TypeError, ValueError):
        return True


def variant_label(row: Any) -> str:
    """What a case computes beyond plain attention, as a table names it ('window 128 + sinks', 'softcap 50'), or 'plain'.

    Cases of different labels are different problems: a winner map or a count never puts them in one cell.
    """
    parts = []
    for name in VARIANT_FIELDS:
        value = row.get(name) if hasattr(row, "get") else getattr(row, name, None)
        if not holds_value(value):
            continue
        if name in ("sinks", "alibi"):
            parts.append(name)
        elif name == "scale":
            parts.append(f"scale {float(value):.4g}")
        else:
            parts.append(f"{name} {float(value):g}")
    return " + ".join(parts) or "plain"
