"""Which measured rows a `recommend` question names: a shape (S, B, heads, dtype, causal), a serving batch, and what its
scores compute (a window, softcap, sinks, ALiBi, a scale). A variant is never ranked with another: a custom shape
without variant options reads the plain cases only, and a question the run cannot answer is refused naming what it holds.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from harness.analysis.frame import is_core
from harness.analysis.variants import holds_value, variant_label
from harness.errors import UserError


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
    from harness.suite.batch import parse_batch

    recorded = rows["length_dist"] if "length_dist" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
    parse_batch(batch, read=False)  # a query the grammar cannot read is the user's mistake, said in one line
    match = recorded.map(batch_key) == batch_key(batch)
    if not match.any():
        seen = sorted({str(d) for d in recorded if batch_key(d)})
        measured = f"its batches are {'; '.join(seen)}" if seen else "it has no serving batches (no row has a length_dist)"
        raise UserError(f"the run measured no batch {batch!r}: {measured}; run a suite with that batch first")
    return match


#: What a custom shape's query computes when it names no variant: plain attention (no window, softcap, sinks, ALiBi or scale).
PLAIN = {"window": None, "softcap": None, "sinks": False, "alibi": False, "scale": None}


def _same_variant(value: Any, wanted: Any) -> bool:
    """Whether a row's variant column computes what the query asks (None/False: without it; a number: that value)."""
    if wanted is None or wanted is False:
        return not holds_value(value)
    if wanted is True:
        return holds_value(value)
    return holds_value(value) and math.isclose(float(value), float(wanted), rel_tol=1e-6)


def variant_options(row: Mapping[str, Any]) -> str:
    """The recommend options that select a row's variant ('--window 128 --sinks'), or 'no variant option' for a plain case."""
    words = []
    for name in PLAIN:
        value = row.get(name)
        if holds_value(value) and name != "alibi":
            words.append(f"--{name}" if name == "sinks" else f"--{name} {float(value):g}")
        elif holds_value(value):
            words.append("alibi (no option: recommend does not select ALiBi cases)")
    return " ".join(words) or "no variant option"


def _variant_rows(rows: pd.DataFrame, variant: Mapping[str, Any]) -> pd.DataFrame:
    """The rows that compute `variant` (window, softcap, sinks, ALiBi, scale); UserError naming the variants measured when none does."""
    match = pd.Series(True, index=rows.index)
    for name, wanted in variant.items():
        if name in rows.columns:
            match &= rows[name].map(lambda v, w=wanted: _same_variant(v, w))
        elif wanted not in (None, False):
            match &= False
    if not match.any():
        seen = {variant_label(r): variant_options(r) for _, r in rows.iterrows()}
        listed = "; ".join(f"{label} ({options})" for label, options in sorted(seen.items()))
        raise UserError(f"the run measured no {variant_label(variant)} case of that shape, only {listed}: "
                        "give the options of the attention you run (a variant is never ranked with another)")
    return rows[match]


def matching_rows(frame: pd.DataFrame, query: Mapping[str, Any]) -> pd.DataFrame:
    """The attention-core rows of the cases `query` names; UserError naming the measured values when none matches.

    `query["variant"]` (the fields of `PLAIN`) selects what the cases compute; without it, any variant matches (a model's
    rows, already narrowed to its layers).
    """
    rows = frame[is_core(frame)]
    for name, value in query.items():
        if value is None or name == "variant":
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
    if query.get("variant") is not None:
        rows = _variant_rows(rows, query["variant"])
    return rows
