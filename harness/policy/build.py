"""From measured runs to a backend policy: per device model, per shape bucket, the backends ranked, with their evidence.

Only rows that may decide an answer decide one (harness.analysis.frame.agreeing_rows: ok, agreeing with the float64
reference, an attention core, and carrying no untrusted flag: contended, suspect, throttled, kernel_mismatch). Within
a bucket (harness.policy.reader.bucket_fields), each backend is ranked by the geometric mean, over the bucket's cases,
of its median over the case's fastest trusted median; a backend that answered fewer of the bucket's cases ranks after
those that answered all. Whether the choice's margin over the runner-up is real is compare's rule
(harness.analysis.difference): in every case both measured, their intervals do not overlap. A row without an interval
(fewer than 6 samples, or a record written before intervals were kept) leaves the margin's noise unknown, and the entry
says so rather than calling it real.

A bucket with rows but no trusted answer, and a log2 step never measured between two measured ones, is a gap: listed,
never filled; `interpolate=True` fills a never-measured step whose measured neighbours on its line agree, and marks it.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Sequence

import pandas as pd

from harness.analysis.difference import RULE_TEXT, interval_of, order
from harness.analysis.frame import agreeing_rows, is_core
from harness.analysis.trust import left_out
from harness.analysis.winners import no_winner_reason
from harness.policy.reader import SCHEMA_VERSION, bucket_fields, key_of
from harness.policy.sources import LoadedRun, combined

#: What a policy document says it is, so that a wrong JSON file is refused by name.
POLICY_KIND = "attnbench backend policy"
#: Each SDPA kernel's backend name here and its `torch.nn.attention.SDPBackend` member.
SDPA_KERNELS = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                "sdpa-math": "MATH"}
#: The fields of a bucket that place it on a line of lengths (the rest name the line).
_LENGTHS = ("S_q_log2", "S_kv_log2")
#: What `noise` says where rows carry no interval.
UNKNOWN_NOISE = "unknown noise"


def _value(row: Any, name: str, default: Any = None) -> Any:
    """A frame row's value, with None for NaN and pandas' missing values."""
    value = row.get(name, default) if hasattr(row, "get") else default
    try:
        if value is None or (not isinstance(value, (list, tuple)) and pd.isna(value)):
            return default
    except (TypeError, ValueError):
        pass
    return value


def batch_kind(row: Any) -> str | None:
    """A ragged batch's kind from its per-request lengths: decode (every query one token), prefill (every query its whole KV), or mixed."""
    lens_q, lens_kv = _value(row, "seq_lens_q"), _value(row, "seq_lens_kv")
    if not lens_q or not lens_kv:
        return None
    if max(lens_q) == 1:
        return "decode"
    return "prefill" if list(lens_q) == list(lens_kv) else "mixed"


def shape_of(row: Any) -> dict[str, Any]:
    """A record's (or frame row's) shape, as `reader.choose` takes it."""
    shape = {name: _value(row, name) for name in ("dtype", "mode", "H", "H_kv", "d_k", "S_q", "S_kv")}
    shape.update(causal=bool(_value(row, "causal", False)), layout=_value(row, "layout", "dense") or "dense", kind=batch_kind(row))
    for name in ("window", "softcap", "sinks", "alibi", "scale", "mla", "deterministic", "kv_dtype", "d_v"):
        shape[name] = _value(row, name)
    for name in ("H", "H_kv", "d_k", "S_q", "S_kv", "window", "d_v"):
        if shape[name] is not None:
            shape[name] = int(shape[name])
    return shape


def with_buckets(frame: pd.DataFrame) -> pd.DataFrame:
    """The attention-core rows of `frame`, each with its bucket's key (`bucket`)."""
    core = frame[is_core(frame)]
    return core.assign(bucket=[key_of(bucket_fields(**shape_of(r))) for _, r in core.iterrows()])


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ci(row: Any) -> list[float] | None:
    interval = interval_of(row)
    return [interval[0], interval[1]] if interval else None


def _margin(choice: dict, runner: dict, cv: float) -> dict[str, Any]:
    """The choice against the runner-up over the cases both answered: the margin, and whether the rule calls it real."""
    shared = sorted(set(choice["rows"]) & set(runner["rows"]))
    verdicts: Counter = Counter()
    for case in shared:
        a, b = choice["rows"][case], runner["rows"][case]
        if interval_of(a) is None or interval_of(b) is None:
            verdicts["unknown"] += 1
        else:
            verdicts[{-1: "faster", 0: "within_noise", 1: "slower"}[order(a, b, cv)]] += 1
    ratio = _geomean([float(runner["rows"][c]["latency_ms_median"]) / float(choice["rows"][c]["latency_ms_median"]) for c in shared]) if shared else None
    if not shared:
        noise, real = "no shared case: the runner-up answered other cases of the bucket", None
    elif verdicts["slower"]:
        noise, real = f"mixed: the runner-up is faster by the rule in {verdicts['slower']} of {len(shared)} cases", False
    elif verdicts["within_noise"]:
        noise, real = f"within noise in {verdicts['within_noise']} of {len(shared)} cases", False
    elif verdicts["unknown"]:
        noise, real = f"{UNKNOWN_NOISE}: {verdicts['unknown']} of {len(shared)} cases have a row without a 95 % interval of its median", None
    else:
        noise, real = f"real in {len(shared)} of {len(shared)} cases", True
    return {"margin_pct": None if ratio is None else round(100.0 * (ratio - 1.0), 3), "margin_real": real, "margin": noise,
            "margin_cases": dict(verdicts)}


def _entry(fields: dict, rows: pd.DataFrame, metas: dict[str, dict], cv: float) -> tuple[dict | None, list[dict]]:
    """One bucket's entry (None when no case has a trusted answer), and its cases without one, each with why."""
    answered, unanswered = {}, []
    for case, sub in rows.groupby("case_id", sort=True):
        trusted = agreeing_rows(sub)
        if trusted.empty:
            unanswered.append({"case": str(case), "why": no_winner_reason(sub)})
        else:
            answered[str(case)] = trusted
    if not answered:
        return None, unanswered
    per_backend: dict[str, dict] = {}
    for case, trusted in answered.items():
        best = float(trusted["latency_ms_median"].min())
        for _, r in trusted.iterrows():
            slot = per_backend.setdefault(str(r["backend"]), {"rows": {}, "ratios": []})
            slot["rows"][case] = r
            slot["ratios"].append(float(r["latency_ms_median"]) / best)
    ranked = sorted(per_backend.items(), key=lambda item: (-len(item[1]["rows"]), _geomean(item[1]["ratios"]), item[0]))
    flagged = left_out(agreeing_rows(rows, flagged=True))
    rivals = sorted({backend for _, backend in flagged.pairs if backend != ranked[0][0]})
    if len(ranked) == 1 and rivals:
        # Chosen only because its rivals' rows were flagged: that is no measurement of which is faster, so no answer.
        why = (f"only {ranked[0][0]} has a trusted row; {', '.join(rivals)} ran and agreed but every row was flagged "
               f"({', '.join(n for n, c in flagged.counts.items() if c)}): re-measure on a quiet machine")
        return None, unanswered + [{"case": case, "why": why} for case in answered]
    ranking = [{"backend": name, "cases": len(slot["rows"]), "of_cases": len(answered), "geomean_vs_fastest": round(_geomean(slot["ratios"]), 4),
                "fastest_in": sum(1 for r in slot["ratios"] if r == 1.0)} for name, slot in ranked]
    choice = ranked[0]
    entry: dict[str, Any] = {"bucket": fields, "choice": choice[0], "runner_up": ranked[1][0] if len(ranked) > 1 else None,
                             "only_candidate": len(ranked) == 1, "interpolated": False, "ranking": ranking}
    if len(ranked) > 1:
        entry.update(_margin(choice[1], ranked[1][1], cv))
    else:
        entry.update(margin_pct=None, margin_real=None, margin="only candidate: the one backend with a trusted row here (not a win over anything)")
    complete = [name for name, slot in ranked if len(slot["rows"]) == len(answered)]
    kernels = [SDPA_KERNELS[name] for name in complete if name in SDPA_KERNELS]
    if kernels:
        entry["sdpa_kernel_order"] = kernels
        entry["sdpa_kernel_call"] = f"sdpa_kernel([{', '.join('SDPBackend.' + k for k in kernels)}], set_priority=True)"
    evidence = [{"case": case, "backend": str(r["backend"]), "median_ms": float(r["latency_ms_median"]), "ci95_ms": _ci(r),
                 "run_id": str(r["run_id"])} for case, trusted in answered.items() for _, r in trusted.iterrows()]
    run_ids = sorted({e["run_id"] for e in evidence})
    entry["evidence"] = {
        "cases": len(answered), "rows": evidence, "run_ids": run_ids,
        "commits": sorted({str(metas[r]["harness_commit"]) for r in run_ids if metas.get(r, {}).get("harness_commit")}),
        "libraries": _libraries([metas.get(r, {}) for r in run_ids]),
    }
    entry["left_out"] = flagged.to_dict()
    entry["cases_without_answer"] = unanswered
    return entry, unanswered


def _libraries(metas: Sequence[dict]) -> dict[str, list[str]]:
    """Each library's versions across the runs (one, unless runs of different installs were combined)."""
    found: dict[str, set] = {}
    for meta in metas:
        for name, version in (meta.get("libraries") or {}).items():
            found.setdefault(name, set()).add(version)
    return {name: sorted(versions) for name, versions in sorted(found.items())}


def _holes(measured: dict[str, dict]) -> list[dict]:
    """The log2 steps never measured between two measured ones on a line (the same bucket but its lengths): (fields, below, above)."""
    lines: dict[tuple, list[dict]] = {}
    for fields in measured.values():
        square = fields["S_q_log2"] == fields["S_kv_log2"]
        line = tuple((k, v) for k, v in fields.items() if k not in _LENGTHS) + (("S_q_log2", "square" if square else fields["S_q_log2"]),)
        lines.setdefault(line, []).append(fields)
    holes = []
    for points in lines.values():
        steps = sorted({f["S_kv_log2"] for f in points})
        by_step = {f["S_kv_log2"]: f for f in points}
        for low, high in zip(steps, steps[1:]):
            for step in range(low + 1, high):
                fields = dict(by_step[low], S_kv_log2=step)
                if by_step[low]["S_q_log2"] == low:  # a square line: the queries step with the keys
                    fields["S_q_log2"] = step
                holes.append({"fields": fields, "below": key_of(by_step[low]), "above": key_of(by_step[high])})
    return holes


def device_policy(rows: pd.DataFrame, metas: dict[str, dict], *, interpolate: bool = False, cv: float = 0.0) -> dict[str, Any]:
    """One device model's buckets and gaps, from its attention-core rows (`with_buckets`)."""
    buckets: dict[str, dict] = {}
    gaps: list[dict] = []
    fields_of: dict[str, dict] = {}
    for key, sub in rows.groupby("bucket", sort=True):
        fields = bucket_fields(**shape_of(sub.iloc[0]))
        entry, unanswered = _entry(fields, sub, metas, cv)
        if entry is None:
            gaps.append({"bucket": key, "fields": fields, "why": "measured, but no trusted answer: " + "; ".join(
                sorted({u["why"] for u in unanswered})), "cases": [u["case"] for u in unanswered]})
        else:
            buckets[key] = entry
            fields_of[key] = fields
    for hole in _holes(fields_of):
        key = key_of(hole["fields"])
        below, above = buckets[hole["below"]]["choice"], buckets[hole["above"]]["choice"]
        if interpolate and below == above:
            buckets[key] = {"bucket": hole["fields"], "choice": below, "runner_up": None, "only_candidate": False, "interpolated": True,
                            "interpolated_from": [hole["below"], hole["above"]], "margin_pct": None, "margin_real": None,
                            "margin": f"interpolated: never measured; the measured buckets on either side both chose {below}",
                            "ranking": [], "evidence": {"cases": 0, "rows": [], "run_ids": [], "commits": [], "libraries": {}}}
        else:
            agree = f"they agree ({below}): --interpolate would fill it" if below == above else f"they disagree ({below} below, {above} above)"
            gaps.append({"bucket": key, "fields": hole["fields"], "why": f"never measured: measure this (between {hole['below']} and "
                         f"{hole['above']}; {agree})", "cases": []})
    runs = sorted({str(r) for r in rows["run_id"]})
    return {"runs": [metas[r] for r in runs if r in metas], "buckets": dict(sorted(buckets.items())),
            "gaps": sorted(gaps, key=lambda g: g["bucket"])}


def build_policy(runs: Sequence[LoadedRun], *, interpolate: bool = False, source: dict | None = None, cv: float = 0.0) -> dict[str, Any]:
    """The policy document (schema: docs/policy.md) of `runs`: per device model, each bucket's ranked backends and evidence, and the gaps."""
    from harness import running_version

    rows = with_buckets(combined(runs))
    metas = {run.run_id: run.meta for run in runs}
    devices = {str(model): device_policy(sub, metas, interpolate=interpolate, cv=cv) for model, sub in rows.groupby("device_model", sort=True)}
    return {
        "schema_version": SCHEMA_VERSION, "kind": POLICY_KIND, "attnbench": running_version(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source or {"runs": [run.run_id for run in runs]}, "interpolate": interpolate,
        "rule": RULE_TEXT, "excluded": "rows not ok, not agreeing with the float64 reference, or flagged contended, suspect, throttled or kernel_mismatch",
        "devices": devices,
    }


def summary_lines(policy: dict[str, Any]) -> list[str]:
    """A few lines on what a policy holds: per device, buckets answered, interpolated, gaps."""
    lines = []
    for device, held in policy["devices"].items():
        entries = held["buckets"].values()
        interpolated = sum(1 for e in entries if e.get("interpolated"))
        real = sum(1 for e in entries if e.get("margin_real") is True)
        unknown = sum(1 for e in entries if str(e.get("margin", "")).startswith(UNKNOWN_NOISE))
        lines.append(f"{device}: {len(held['buckets'])} buckets answered ({real} by a margin the rule calls real"
                     + (f", {unknown} of unknown noise: rows without a 95 % interval" if unknown else "")
                     + (f", {interpolated} interpolated" if interpolated else "") + f"), {len(held['gaps'])} gap{'' if len(held['gaps']) == 1 else 's'}, from runs "
                     + ", ".join(r["run_id"] for r in held["runs"]))
    return lines


def table_rows(held: dict[str, Any]) -> list[dict[str, str]]:
    """One device's buckets as a table shows them (report and site alike): bucket → choice, margin, evidence; then its gaps."""
    rows = []
    for key, entry in held["buckets"].items():
        evidence = entry["evidence"]
        margin = "" if entry.get("margin_pct") is None else f"{entry['margin_pct']:.1f} % over {entry['runner_up']}: "
        choice = f"only candidate: {entry['choice']}" if entry.get("only_candidate") else str(entry["choice"])
        rows.append({"bucket": key, "choice": choice + (" (interpolated)" if entry.get("interpolated") else ""),
                     "margin": margin + str(entry["margin"]),
                     "evidence": (f"{len(evidence['rows'])} rows of {evidence['cases']} cases, runs {', '.join(evidence['run_ids'])}"
                                  + (f", commit {', '.join(c[:10] for c in evidence['commits'])}" if evidence["commits"] else "")
                                  + (f"; {entry['left_out']['rows']} flagged rows left out" if entry.get("left_out", {}).get("rows") else ""))
                                 if evidence["rows"] else "none: " + " and ".join(entry.get("interpolated_from", [])),
                     "SDPA kernel order": " > ".join(entry.get("sdpa_kernel_order", []))})
    for gap in held["gaps"]:
        rows.append({"bucket": gap["bucket"], "choice": "no answer (gap)", "margin": "", "evidence": gap["why"], "SDPA kernel order": ""})
    return rows


__all__ = ["table_rows", "POLICY_KIND", "SDPA_KERNELS", "build_policy", "device_policy", "shape_of", "summary_lines", "with_buckets"]
