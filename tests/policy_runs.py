"""Run folders for the policy tests: one grid (several S, H_kv and causal values) with chosen latencies, and the H200 slice's copy."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

from harness.suite.cases import Case
from tests.h200_data import H200
from tests.synthetic_runs import synthetic_record, write_run

#: S = 256 is left out on purpose: a log2 step never measured between two measured ones.
GRID_S = (64, 128, 512)
BACKEND_FACTORS = {"sdpa": 1.0, "sdpa-math": 1.5, "naive": 3.0}


def grid_cases() -> list[Case]:
    """The grid's cases: S × H_kv (MHA, GQA 4) × causal, fp32, d_k 32."""
    return [Case(B=1, S_q=S, S_kv=S, H=8, H_kv=h_kv, d_k=32, d_v=32, causal=causal) for S in GRID_S for h_kv in (8, 2) for causal in (False, True)]


def grid_run(path: Path, *, ms: dict | None = None, flags: dict | None = None, spread: float = 0.01, device: str = "synthetic CPU",
             no_interval: tuple = (), created: str | None = None) -> Path:
    """A run of the grid named after its folder: each (case, backend)'s median is S/64 · 0.1 ms × the backend's factor unless `ms`
    names it ((case id, backend) → ms); `flags` sets untrusted flags ((case id, backend) → flag name); `no_interval` rows have none; `created`
    dates the run (and gives it a uuid) for the results database."""
    records = []
    for case in grid_cases():
        for backend, factor in BACKEND_FACTORS.items():
            key = (case.id, backend)
            record = synthetic_record(case, backend, (ms or {}).get(key, case.S_kv / 64 * 0.1 * factor), spread=spread, run_id=path.name)
            if key in (flags or {}):
                setattr(record, flags[key], True)
            if key in no_interval:
                record.latency_ms_ci95_low = record.latency_ms_ci95_high = None
            records.append(record)
    path.mkdir(parents=True)
    env = {"before": {"device_type": "cpu", "device_name": device, "torch": "2.13.0", "harness_commit": "abc1234"}}
    write_run(path, records, env=env, capabilities={b: {"attention_core": True, "baseline": b == "sdpa-math"} for b in BACKEND_FACTORS})
    if created is not None:  # a run the results database orders by its time, under a uuid of its own
        manifest = json.loads((path / "manifest.json").read_text())
        manifest.update(created_utc=created, run_uuid=hashlib.sha256(path.name.encode()).hexdigest()[:32], harness="attnbench",
                        suite_arg="synthetic", suite_copy=None, device="cpu", broken={}, check=True)
        (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def h200_copy(path: Path) -> Path:
    """The real H200 slice as a run folder (its records gunzipped), at `path`."""
    path.mkdir(parents=True)
    for name in ("manifest.json", "env.json", "peaks.json"):
        shutil.copy(H200 / name, path / name)
    with gzip.open(H200 / "records.jsonl.gz", "rb") as src, open(path / "records.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path
