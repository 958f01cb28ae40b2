"""Synthetic records and run folders with chosen latencies, shaped as the executor and the supervisor write them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness import analysis
from harness.attention import theory
from harness.results.record import Record, Status
from harness.results.store import RunWriter
from harness.suite.cases import Case


def synthetic_record(case: Case, backend: str, ms: float, *, status: str = "ok", agree: bool | None = True, mem: float | None = None,
                     spread: float = 0.01, run_id: str = "synthetic", family: str = "test", flops: float | None = None) -> Record:
    """A record shaped like the executor's, with a chosen median latency (p20/p80 and the 95 % interval of the median at ±spread)."""
    attention_flops, nbytes = theory.flops(case), theory.min_bytes(case)
    record = Record(
        case=case, backend=backend, family=family, status=Status(status),
        run_id=run_id, reason=None if status == "ok" else "synthetic failure", flops=flops if flops is not None else attention_flops,
        bytes=nbytes, kv_cache_bytes=theory.kv_cache_bytes(case), arithmetic_intensity=attention_flops / nbytes,
    )
    if status == "ok":
        seconds = ms / 1e3
        record.latency_ms_median, record.latency_ms_p20, record.latency_ms_p80 = ms, ms * (1 - spread), ms * (1 + spread)
        record.latency_ms_ci95_low, record.latency_ms_ci95_high = ms * (1 - spread), ms * (1 + spread)
        record.iqr_ratio, record.noisy, record.suspect, record.peak_mem_bytes = spread, False, False, mem
        record.tflops, record.gbps = record.flops / seconds / 1e12, record.bytes / seconds / 1e9
        record.agree, record.max_abs_err, record.err_bound = agree, 1e-7 if agree else 1.0, 1e-6 if agree is not None else None
    return record


def write_run(run_dir: Path, records: list[Record], *, peaks: dict | None = None, env: dict | None = None,
              capabilities: dict | None = None) -> Path:
    """A run folder as the supervisor leaves it: records.jsonl, env.json, manifest.json and peaks.json."""
    writer = RunWriter(run_dir)
    for r in records:
        writer.append(r)
    (run_dir / "env.json").write_text(json.dumps(env or {"before": {"device_type": "cpu", "device_name": "synthetic CPU", "torch": "2.x"}}))
    manifest = {"run_id": run_dir.name, "suite": "synthetic", "pairs": [], "backends": sorted({r.backend for r in records}), "capabilities": capabilities or {}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    if peaks is not None:
        (run_dir / "peaks.json").write_text(json.dumps(peaks))
    return run_dir


PEAKS = {"device": "cpu", "matmul": {"fp32": {"n": 1024, "tflops": 1.0, "tflops_median": 0.9}}, "copy": {"bytes": 2**26, "gbps": 100.0, "gbps_median": 90.0}, "errors": {}}


def frame_of(records: list[Record], peaks: dict | None = PEAKS, capabilities: dict | None = None) -> pd.DataFrame:
    """Records → the analysis frame (derived and roofline columns), as `analysis.load` builds it."""
    frame = pd.DataFrame([r.to_dict() for r in records])
    declared = analysis.declared_capabilities(set(frame["backend"]), [{"capabilities": capabilities or {}}])
    return analysis.with_roofline(analysis.derive_columns(frame, declared), {"synthetic": peaks})


def winner_records() -> list[Record]:
    """Two causal bf16 cases: three agreeing cores, one wrong fastest row, an error and a whole-layer row."""
    records = []
    for S in (128, 256):
        case = Case(B=1, S_q=S, S_kv=S, H=32, H_kv=8, d_k=128, d_v=128, dtype="bf16", causal=True)
        records.append(synthetic_record(case, "sdpa-math", 4.0))
        records.append(synthetic_record(case, "sdpa-flash", 1.0))
        records.append(synthetic_record(case, "sdpa", 1.25))
        records.append(synthetic_record(case, "cheat", 0.1, agree=False))  # fastest, but wrong
        records.append(synthetic_record(case, "broken", 0.0, status="error"))
        records.append(synthetic_record(case, "whole-layer", 0.5, family="layer"))  # agrees, but times another problem
    return records
