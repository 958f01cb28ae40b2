"""The winner per published model and tensor-parallel degree: which backend to choose for a model's attention on one GPU of TP.

A row does not name its model: a TP-8 case is only its per-GPU shape (H/8 query heads), and two models may share one.
So each model preset (harness.suite.presets) is rebuilt at TP 1, 2, 4 and 8, and a measured case belongs to every
(model, TP) whose layer kinds have its shape (heads, head dims, window, softcap, sinks, scale, MLA) at any S. Per
(model, TP, phase): the backend that wins the most of its cases among the rows that may win (harness.analysis.winners),
ties to the lower geometric mean of the tied winners' times; the count is shown, as in the winner maps.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.analysis.winners import winners

#: The Case fields that, with S left out, say which layer of which model a case is.
SHAPE_FIELDS = ("H", "H_kv", "d_k", "d_v", "window", "softcap", "sinks", "alibi", "scale", "mla", "causal")
TP_DEGREES = (1, 2, 4, 8)


def _value(v: Any) -> Any:
    """A field's value as a comparable key: None for NaN, ints for integral numbers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and float(v).is_integer():
        return int(v)
    return v


def _shape(fields: Any) -> tuple:
    return tuple(_value(fields.get(name) if hasattr(fields, "get") else getattr(fields, name, None)) for name in SHAPE_FIELDS)


def model_shapes() -> dict[tuple, set[tuple[str, int]]]:
    """Each layer shape of every preset at every TP degree it shards to: shape → {(model, tp)}."""
    from harness.errors import UserError
    from harness.suite.presets import PRESETS, model_cases

    found: dict[tuple, set[tuple[str, int]]] = {}
    for name, preset in PRESETS.items():
        for tp in TP_DEGREES:
            try:
                cases = model_cases(preset, [min(256, preset.context)], tp=tp, device="cpu", dtype="fp32")
            except UserError:  # a degree that does not divide the model's heads
                continue
            for case in cases:
                found.setdefault(_shape(case), set()).add((name, tp))
    return found


def model_winners(frame: pd.DataFrame, wins: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (model, TP, phase) with measured cases: the backend that won most of them, how many, and of how many."""
    wins = winners(frame) if wins is None else wins
    if wins.empty or any(name not in frame.columns for name in ("H", "d_k")):
        return pd.DataFrame()
    shapes = model_shapes()
    per_case = frame.drop_duplicates("case_id").set_index("case_id")
    tally: dict[tuple[str, int, str], list[tuple[str, float]]] = {}
    for _, w in wins.iterrows():
        row = per_case.loc[w["case_id"]]
        phase = "decode" if int(row["S_q"]) == 1 else "prefill"
        for model, tp in shapes.get(_shape(row), ()):
            tally.setdefault((model, tp, phase), []).append((str(w["winner"]), float(w["winner_ms"])))
    out = []
    for (model, tp, phase), won in sorted(tally.items()):
        counts = pd.Series([b for b, _ in won]).value_counts()
        top = counts[counts == counts.max()].index.tolist()
        geo = {b: math.exp(sum(math.log(ms) for w, ms in won if w == b) / counts[b]) for b in top}
        best = min(geo, key=geo.get)
        out.append({"model": model, "tp": tp, "phase": phase, "winner": best, "won": int(counts[best]), "cases": len(won)})
    return pd.DataFrame(out)
