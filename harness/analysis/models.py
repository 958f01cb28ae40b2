"""The winner per published model, tensor-parallel degree and layer kind: which backend to choose for a model's attention on one GPU of TP.

A row does not name its model: a TP-8 case is only its per-GPU shape (H/8 query heads), and two models may share one.
So each model preset (harness.suite.presets) is rebuilt at TP 1, 2, 4 and 8 with `model_cases` (the mapping
`run --model … --tp` runs), and a measured case belongs to every (model, TP, layer kind) whose cases have its shape
(heads, head dims, window, softcap, sinks, scale, MLA) at any S. Per (model, TP, layer kind, phase): the backend that
wins the most of its cases that had another candidate (harness.analysis.winners), ties to the lower geometric mean of
the tied winners' times; a case one backend alone could run is counted as only candidate, never as a win.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import pandas as pd

from harness.analysis.winners import winners

#: The Case fields that, with S left out, say which layer of which model a case is.
SHAPE_FIELDS = ("H", "H_kv", "d_k", "d_v", "window", "softcap", "sinks", "alibi", "scale", "mla", "causal")
TP_DEGREES = (1, 2, 4, 8)


def _value(v: Any) -> Any:
    """A field's value as a comparable key: None for NaN, ints for integral numbers, floats rounded (a scale read back from JSON)."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        v = v.item() if hasattr(v, "item") else v
        if isinstance(v, float) and not v.is_integer():
            return round(v, 9)
        return int(v) if isinstance(v, (int, float)) else v
    return v


def shape_of(fields: Any) -> tuple:
    """The shape key of a case, a row or a mapping: `SHAPE_FIELDS`' values, S left out."""
    return tuple(_value(fields.get(name) if hasattr(fields, "get") else getattr(fields, name, None)) for name in SHAPE_FIELDS)


def layer_shapes(preset: Any, tp: int) -> dict[tuple, Any]:
    """Each shape the preset's layers have on one GPU of `tp` (prefill and decode): shape → its `LayerKind`.

    Built with `presets.model_cases` one layer kind at a time, so it is the same mapping `run --model … --tp` runs.
    Raises the UserError of a TP that does not shard the preset.
    """
    from harness.suite.presets import model_cases

    found: dict[tuple, Any] = {}
    for kind in preset.kinds:
        alone = dataclasses.replace(preset, layer_kinds=(kind,))
        for case in model_cases(alone, [min(256, preset.context)], tp=tp, device="cpu", dtype="fp32"):
            found.setdefault(shape_of(case), kind)
    return found


def model_shapes() -> dict[tuple, set[tuple[str, int, str]]]:
    """Each layer shape of every preset at every TP degree it shards to: shape → {(model, tp, layer kind)}."""
    from harness.errors import UserError
    from harness.suite.presets import PRESETS

    found: dict[tuple, set[tuple[str, int, str]]] = {}
    for name, preset in PRESETS.items():
        for tp in TP_DEGREES:
            try:
                shapes = layer_shapes(preset, tp)
            except UserError:  # a degree that does not divide the model's heads
                continue
            for shape, kind in shapes.items():
                found.setdefault(shape, set()).add((name, tp, kind.name))
    return found


def model_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of `frame` whose case is a layer of some preset at some TP degree."""
    if frame.empty or any(name not in frame.columns for name in ("H", "d_k")):
        return frame.iloc[0:0]
    shapes = model_shapes()
    return frame[[shape_of(r) in shapes for _, r in frame.iterrows()]]


def model_winners(frame: pd.DataFrame, wins: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (model, TP, layer kind, phase) with measured cases: the backend that won most of its contested cases, how many, the runner-up.

    `cases` counts the cases with at least two candidates; `only_candidate` those one backend alone ran (`note` names it).
    A group with no contested case has no winner.
    """
    wins = winners(frame) if wins is None else wins
    if wins.empty or any(name not in frame.columns for name in ("H", "d_k")):
        return pd.DataFrame()
    shapes = model_shapes()
    per_case = frame.drop_duplicates("case_id").set_index("case_id")
    tally: dict[tuple[str, int, str, str], list[Any]] = {}
    for _, w in wins.iterrows():
        row = per_case.loc[w["case_id"]]
        phase = "decode" if int(row["S_q"]) == 1 else "prefill"
        for model, tp, kind in shapes.get(shape_of(row), ()):
            tally.setdefault((model, tp, kind, phase), []).append(w)
    out = []
    for (model, tp, kind, phase), cases in sorted(tally.items()):
        contested = [w for w in cases if not w["only_candidate"]]
        alone = Counter(str(w["winner"]) for w in cases if w["only_candidate"])
        note = "; ".join(f"only candidate in {n} case{'s' if n > 1 else ''}: {b}" for b, n in sorted(alone.items()))
        entry = {"model": model, "tp": tp, "layer_kind": kind, "phase": phase, "winner": None, "won": 0, "cases": len(contested),
                 "runner_up": None, "only_candidate": sum(alone.values()), "note": note}
        if contested:
            counts = Counter(str(w["winner"]) for w in contested)
            top = [b for b, n in counts.items() if n == max(counts.values())]
            geo = {b: math.exp(sum(math.log(float(w["winner_ms"])) for w in contested if w["winner"] == b) / counts[b]) for b in top}
            best = min(geo, key=geo.get)
            seconds = Counter(str(w["runner_up"]) for w in contested if w["winner"] == best and w["runner_up"] is not None)
            entry.update(winner=best, won=counts[best], runner_up=seconds.most_common(1)[0][0] if seconds else None)
        out.append(entry)
    return pd.DataFrame(out)
