"""Serving-shaped batches in the analysis: what padding costs as lengths skew, paged decode bandwidth, the winner per batch.

A serving row is one whose `layout` is not `dense` (issue 21): a batch of requests, each with its own query
and KV length (`seq_lens_q`, `seq_lens_kv`; JSON lists in records.jsonl, their JSON text in records.csv),
drawn from `length_dist`. Three views, from agreeing rows only (a row that disagrees measured another
computation, and its time or bandwidth says nothing):

- packed against padded: per backend and batch, padded median ÷ packed median against how much of the
  padded batch is padding (`padding_share`, 1 − Σ q_i·kv_i / (B·S_q·S_kv): the share of the padded
  query–key rectangle that holds no real pair). If time were proportional to real work the speed-up
  would be 1 / (1 − padding_share) (`ideal_speedup`).
- paged decode: per backend and page size, the KV bytes actually read (the record's `kv_cache_bytes`,
  real tokens only) per second, against the run's measured copy peak (`roofline.peak_gbps`). Decode
  means every request of the batch has one query token.
- the winner per batch (`length_dist` and layout; the page size beside it), among agreeing rows.

Whether two medians differ is judged by `winners.winners`, through the harness's one rule for "different"
(`harness.analysis.difference`); contended and suspect rows are left out of every view (`harness.analysis.trust`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import roofline
from harness.analysis.frame import agreeing_rows, describe_group, group_key_columns, groups, num
from harness.analysis.winners import winners

DENSE = "dense"
#: The layouts of a ragged batch, in the order the report shows them.
LAYOUTS = ("padded", "packed", "paged")
#: Case fields that a padded and a packed row of one batch may not share, that the lengths already fix (the batch's
#: description), or that the serving tables show in columns of their own (the layout and its page size).
_NOT_BATCH_FIELDS = ("B", "padding", "q_len", "layout", "page_size", "length_dist")


def lengths(value: Any) -> tuple[int, ...] | None:
    """A row's sequence lengths as a tuple: the record's JSON list, or its JSON text (records.csv); None when it has none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if isinstance(value, (list, tuple, np.ndarray)) and len(value):
        return tuple(int(v) for v in value)
    return None


def serving_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ragged batches (layout padded, packed or paged); none in a run recorded before layouts existed."""
    if "layout" not in frame.columns:
        return frame.iloc[0:0]
    layout = frame["layout"]
    return frame[layout.notna() & (layout != DENSE)]


def has_serving_rows(frame: pd.DataFrame) -> bool:
    """Whether any row of the frame is a ragged batch."""
    return not serving_rows(frame).empty


def rows_without_lengths(frame: pd.DataFrame) -> pd.DataFrame:
    """Serving rows that carry no sequence lengths (a damaged or hand-edited record): no view can place them."""
    rows = serving_rows(frame)
    has = [lengths(q) is not None and lengths(kv) is not None
           for q, kv in zip(rows.get("seq_lens_q", pd.Series(None, index=rows.index)), rows.get("seq_lens_kv", pd.Series(None, index=rows.index)))]
    return rows[[not h for h in has]]


def padding_share(lens_q: tuple[int, ...], lens_kv: tuple[int, ...]) -> float:
    """The share of the padded batch's query–key rectangle (B·max q·max kv) that no real pair fills."""
    real = sum(q * kv for q, kv in zip(lens_q, lens_kv))
    return 1.0 - real / (len(lens_q) * max(lens_q) * max(lens_kv))


def with_batch_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with their lengths as tuples (`lens_q`, `lens_kv`), tokens, `padding_share`, `kv_max_over_mean` and a `batch` label."""
    rows = rows.copy()
    rows["lens_q"] = rows["seq_lens_q"].map(lengths) if "seq_lens_q" in rows.columns else None
    rows["lens_kv"] = rows["seq_lens_kv"].map(lengths) if "seq_lens_kv" in rows.columns else None
    rows = rows[rows["lens_q"].notna() & rows["lens_kv"].notna()]
    rows["tokens_q"] = rows["lens_q"].map(sum)
    rows["tokens_kv"] = rows["lens_kv"].map(sum)
    rows["padding_share"] = [padding_share(q, kv) for q, kv in zip(rows["lens_q"], rows["lens_kv"])]
    rows["kv_max_over_mean"] = rows["lens_kv"].map(lambda kv: max(kv) / (sum(kv) / len(kv)))
    rows["length_dist"] = rows["length_dist"].astype(object) if "length_dist" in rows.columns else None
    rows["batch"] = [str(d) if isinstance(d, str) and d else f"{len(q)} requests" for d, q in zip(rows["length_dist"], rows["lens_q"])]
    for name in ("page_size", "plan_ms", "kv_cache_bytes"):
        rows[name] = pd.to_numeric(rows[name], errors="coerce") if name in rows.columns else np.nan
    return rows


def _fixed_columns(rows: pd.DataFrame) -> list[str]:
    """The case fields that, with the lengths, say which problem a row solved (and the device it ran on)."""
    return group_key_columns(rows, exclude=_NOT_BATCH_FIELDS) + (["device_model"] if "device_model" in rows.columns else [])


def packed_vs_padded(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend and batch with an agreeing padded and packed row: padded ms ÷ packed ms beside the batch's skew."""
    rows = with_batch_columns(agreeing_rows(serving_rows(frame)))
    rows = rows[rows["layout"].isin(("padded", "packed"))]
    if rows.empty:
        return pd.DataFrame()
    fixed = _fixed_columns(rows)
    pairs, candidates = [], []
    for key, sub in groups(rows, ["backend", "batch", "lens_q", "lens_kv", *fixed]):
        padded, packed = sub[sub["layout"] == "padded"], sub[sub["layout"] == "packed"]
        if len(padded) != 1 or len(packed) != 1:
            continue
        pair = f"pair {len(pairs)}"
        pad, pack = padded.iloc[0], packed.iloc[0]
        pairs.append({
            "pair": pair, "backend": key["backend"], "batch": key["batch"], "group": describe_group({k: key[k] for k in fixed}),
            "B": len(key["lens_q"]), "tokens_q": int(pad["tokens_q"]), "tokens_kv": int(pad["tokens_kv"]),
            "kv_max_over_mean": float(pad["kv_max_over_mean"]), "padding_share": float(pad["padding_share"]),
            "padded_ms": float(pad["latency_ms_median"]), "packed_ms": float(pack["latency_ms_median"]),
            "speedup": float(pad["latency_ms_median"]) / float(pack["latency_ms_median"]),
            "ideal_speedup": 1.0 / (1.0 - float(pad["padding_share"])),
            "padded_case_id": pad["case_id"], "packed_case_id": pack["case_id"],
        })
        candidates.append(sub.assign(case_id=pair, backend=sub["layout"]))
    if not pairs:
        return pd.DataFrame()
    # The two layouts compete as winners' candidates, so that whether they differ is the harness's judgement, not a new one.
    judged = winners(pd.concat(candidates), baseline="padded").set_index("case_id")
    out = pd.DataFrame(pairs)
    out["within_noise"] = out["pair"].map(judged["within_noise"]).astype(bool)
    return out.drop(columns="pair").sort_values(["group", "backend", "padding_share"], ignore_index=True)


def is_decode(lens_q: tuple[int, ...]) -> bool:
    """Whether every request of the batch has one query token (a decode step)."""
    return max(lens_q) == 1


def paged_decode_bandwidth(frame: pd.DataFrame) -> pd.DataFrame:
    """Agreeing paged decode rows: GB/s of the KV they read (real tokens only) and its share of the run's measured copy peak."""
    rows = with_batch_columns(agreeing_rows(serving_rows(frame)))
    rows = rows[(rows["layout"] == "paged") & rows["lens_q"].map(is_decode) & rows["kv_cache_bytes"].notna()]
    if rows.empty:
        return pd.DataFrame()
    fixed = _fixed_columns(rows)
    seconds = rows["latency_ms_median"].astype(float) / 1e3
    peak = pd.to_numeric(rows["peak_gbps"], errors="coerce") if "peak_gbps" in rows.columns else pd.Series(np.nan, index=rows.index)
    out = pd.DataFrame({
        "backend": rows["backend"], "batch": rows["batch"],
        "group": [describe_group({k: r[k] for k in fixed}) for _, r in rows.iterrows()],
        "page_size": rows["page_size"].astype("Int64"), "B": rows["lens_q"].map(len), "tokens_kv": rows["tokens_kv"],
        "latency_ms_median": rows["latency_ms_median"].astype(float), "kv_bytes": rows["kv_cache_bytes"].astype(float),
        "kv_gbps": rows["kv_cache_bytes"].astype(float) / seconds / 1e9, "peak_gbps": peak, "run_id": rows["run_id"], "case_id": rows["case_id"],
    })
    out["pct_copy_peak"] = 100.0 * out["kv_gbps"] / out["peak_gbps"]
    out["impossible"] = out["pct_copy_peak"] > roofline.IMPOSSIBLE_PCT
    return out.sort_values(["group", "batch", "backend", "page_size"], ignore_index=True)


def layout_order(layout: Any, page_size: Any) -> tuple[int, float]:
    """A sort key: padded, packed, then paged by page size (the order in which the layouts drop padding and copies)."""
    rank = LAYOUTS.index(layout) if layout in LAYOUTS else len(LAYOUTS)
    return rank, float(page_size) if num(page_size) is not None else 0.0


def batch_winners(frame: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Per serving case (a batch in one layout and page size): winners' winner, runner-up and margin, with the batch and the winner's plan_ms."""
    rows = with_batch_columns(serving_rows(frame))
    wins = winners(rows, baseline)
    if wins.empty:
        return wins
    per_case = rows.drop_duplicates("case_id").set_index("case_id")
    for name in ("batch", "layout", "page_size", "tokens_q", "tokens_kv"):
        wins[name] = wins["case_id"].map(per_case[name])
    wins["group"] = [describe_group({k: per_case.at[c, k] for k in _fixed_columns(rows)}) for c in wins["case_id"]]
    plan = rows.set_index(["case_id", "backend"])["plan_ms"]
    wins["winner_plan_ms"] = [num(plan.get((c, w))) for c, w in zip(wins["case_id"], wins["winner"])]
    order = [layout_order(l, p) for l, p in zip(wins["layout"], wins["page_size"])]
    return wins.assign(_order=order).sort_values(["group", "batch", "_order"], ignore_index=True).drop(columns="_order")

