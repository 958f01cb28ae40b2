"""A run as flashinfer-bench traces: one JSON line per ok row, so its measurements can join a flashinfer-bench dataset.

The line follows flashinfer_bench.data.Trace (definition name, workload, solution, evaluation). A dense forward
GQA/MHA case is flashinfer-bench's `gqa_ragged_prefill` kind with every request the same length, named as its
tracing adapter names a definition (`gqa_ragged_prefill_causal_h32_kv8_d128`); a case of any other kind (backward,
MLA, paged, a window, softcap, sinks, ALiBi, padding) has no definition there and is left out, counted.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.history.export_rows import Export, left_out, pair_name, refuse_empty, run_records

#: The namespace of a workload's uuid: derived from the run's uuid and the pair, so exporting twice gives the same lines.
WORKLOAD_NAMESPACE = uuid.UUID("8f3b2a51-6c0e-4d7a-9b1e-2f4c6a8d0e13")


def unrepresentable(record: dict[str, Any]) -> str | None:
    """Why a row has no flashinfer-bench trace (in words), or None when it has one."""
    if record.get("status") != "ok":
        return f"status {record.get('status')}: {record.get('reason') or 'no measurement'}"
    if record.get("latency_ms_median") is None:
        return "no median latency recorded"
    if record.get("agree") is None:
        return "not checked: flashinfer-bench's evaluation needs correctness figures"
    if record.get("mode") != "fwd":
        return f"mode {record.get('mode')}: flashinfer-bench's attention definitions are forward only"
    if (record.get("layout") or "dense") != "dense" or record.get("page_size"):
        return f"layout {record.get('layout')}: only dense cases are mapped (ragged-prefill with equal lengths)"
    if record.get("d_k") != record.get("d_v"):
        return "d_k differs from d_v: gqa_ragged_prefill has one head_dim"
    for flag in ("mla", "padding", "sinks", "alibi"):
        if record.get(flag):
            return f"{flag}: no flashinfer-bench definition of that kind"
    for value in ("window", "softcap"):
        if record.get(value) is not None:
            return f"{value}: no flashinfer-bench definition of that kind"
    return None


def definition_name(record: dict[str, Any]) -> str:
    """The flashinfer-bench definition a dense forward case is an instance of, named as their ragged-prefill adapter names it."""
    causal = "_causal" if record.get("causal") else ""  # their traced definitions are causal; a non-causal one drops the word
    return f"gqa_ragged_prefill{causal}_h{record['H']}_kv{record['H_kv']}_d{record['d_k']}"


def workload(record: dict[str, Any], run_uuid: str) -> dict[str, Any]:
    """The case as a Workload: its variable axes' values and its inputs (q, k, v random; sm_scale the scalar the case used)."""
    batch = record["B"]
    scale = record.get("scale")
    return {
        "axes": {"len_indptr": batch + 1, "total_q": batch * record["S_q"], "total_kv": batch * record["S_kv"]},
        # RandomInput has no seed field: the seed is in the evaluation's log. The indptrs (i * S for i in 0..B) are left out:
        # the schema's only tensor input that holds values is a safetensors file, and an export writes none.
        "inputs": {"q": {"type": "random"}, "k": {"type": "random"}, "v": {"type": "random"},
                   "sm_scale": {"type": "scalar", "value": scale if scale is not None else 1 / math.sqrt(record["d_k"])}},
        "uuid": str(uuid.uuid5(WORKLOAD_NAMESPACE, f"{run_uuid}/{pair_name(record)}")),
    }


def _error(value: Any) -> float:
    """An error figure as flashinfer-bench's Correctness takes it: NaN where none was recorded."""
    return float("nan") if value is None else float(value)


def evaluation(record: dict[str, Any], run: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The row's outcome as an Evaluation: PASSED with correctness and performance, or INCORRECT_NUMERICAL with correctness only."""
    before = env.get("before") or {}
    hardware = record.get("device_name") or run.get("device_model") or "unknown"
    libs = {"attnbench": run.get("harness_version"), "torch": before.get("torch"), "cuda": before.get("torch_cuda"),
            record.get("family") or record["backend"]: record.get("backend_version")}
    correctness = {"max_absolute_error": _error(record.get("max_abs_err")), "max_relative_error": _error(record.get("rel_err")),
                   "extra": {"err_bound": record.get("err_bound"), "agree": record.get("agree")}}
    status = "PASSED" if record["agree"] else "INCORRECT_NUMERICAL"
    result = {
        "status": status,
        "environment": {"hardware": hardware.replace(" ", "_"), "libs": {k: str(v) for k, v in libs.items() if v is not None}},
        "timestamp": datetime.fromtimestamp(record.get("timestamp") or 0, timezone.utc).isoformat(timespec="seconds"),
        "log": f"attnbench run {run.get('run_id')} pair {pair_name(record)} seed {record.get('seed')} "
               f"timer {record.get('timer')} samples {record.get('samples')} "
               f"contended {record.get('contended')} suspect {record.get('suspect')}",
        "correctness": correctness,
    }
    if status == "PASSED":  # their schema carries performance for a passed evaluation only
        result["performance"] = {"latency_ms": record["latency_ms_median"]}
    return result


def trace(record: dict[str, Any], run: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """One representable row as a flashinfer-bench Trace (plain data, JSON-ready)."""
    return {"definition": definition_name(record), "workload": workload(record, run["run_uuid"]), "solution": record["backend"],
            "evaluation": evaluation(record, run, env)}


def _json_line(document: dict[str, Any]) -> str:
    """A trace as one JSON line; NaN written as the string "NaN", as their Correctness serialises it (ser_json_inf_nan="strings")."""
    import json

    def strings(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if isinstance(value, dict):
            return {k: strings(v) for k, v in value.items()}
        return value

    return json.dumps(strings(document), separators=(",", ":"), default=str)


def flashinfer_export(run_dir: Path | str) -> Export:
    """The run as flashinfer-bench trace JSONL: one line per representable ok row; every other row left out, with why."""
    run, _manifest, env, records, warnings = run_records(run_dir)
    traces, skipped = [], []
    for record in records:
        why = unrepresentable(record)
        if why is None:
            traces.append(trace(record, run, env))
        else:
            skipped.append(left_out(record, why))
    refuse_empty(run_dir, traces, "checked ok row of a kind flashinfer-bench defines (dense forward attention)")
    return Export("".join(_json_line(t) + "\n" for t in traces), len(traces), skipped, warnings)
