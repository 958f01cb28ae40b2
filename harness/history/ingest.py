"""A run folder read as what the results database keeps: one run row, and one row per (case, backend) record.

The database is self-contained: a run's manifest, environment and peaks, and every record whole (raw samples
included), are stored as JSON text beside the columns that are queried, so a site or an export can be rebuilt
from the database alone after the run folder is gone (a team's PostgreSQL holds runs of many machines).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import UserError

#: The run table's columns, in order (every one text, integer, real or boolean; the *_json ones hold JSON text).
RUN_COLUMNS = (
    "run_uuid", "run_id", "suite", "device_type", "device_model", "host",
    "harness_version", "harness_commit", "harness_dirty", "torch", "torch_cuda", "cudnn", "python", "libraries_json",
    "created_utc", "added_utc", "source_path", "pairs", "rows", "rows_ok",
    "manifest_json", "env_json", "peaks_json",
)
#: The row table's columns, in order: the ones a trend, a winner or the gate reads, then the whole record.
ROW_COLUMNS = (
    "run_uuid", "case_id", "backend", "status", "reason", "dtype", "mode", "agree",
    "latency_ms_median", "latency_ms_ci95_low", "latency_ms_ci95_high", "latency_ms_p20", "latency_ms_p80", "samples",
    "tflops", "gbps", "peak_mem_bytes", "contended", "suspect", "record_json",
)
#: The libraries whose versions a run's fingerprint names, kept together in `libraries_json`.
LIBRARY_KEYS = ("xformers", "flash_attn", "flashinfer", "numpy", "pandas", "pytest_benchmark")
#: The device model of a run whose folder has no env.json (the one document that names the machine).
UNKNOWN_DEVICE = "unknown device (no env.json)"
#: The namespace of the uuid given to a run written before manifests carried one (derived from its manifest, so stable).
LEGACY_NAMESPACE = uuid.UUID("5d1f0c8e-2b7a-4c8e-9f43-6a0d3b1e7c21")


@dataclass
class IngestedRun:
    """One run folder as the database stores it: `run` has RUN_COLUMNS' keys, each of `rows` ROW_COLUMNS'."""

    run: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Lines worth telling the user (a truncated last line dropped, a uuid derived for an older run).
    warnings: list[str] = field(default_factory=list)


def run_uuid_of(manifest: dict[str, Any]) -> tuple[str, bool]:
    """The run's uuid, and whether it was derived: a manifest written before `run_uuid` existed gets one from its own bytes' key fields."""
    given = manifest.get("run_uuid")
    if isinstance(given, str) and given:
        return given, False
    key = json.dumps({k: manifest.get(k) for k in ("run_id", "created_utc", "suite_arg", "device", "pairs")}, sort_keys=True)
    return uuid.uuid5(LEGACY_NAMESPACE, key).hex, True


def device_model(env: dict[str, Any], device_type: str | None) -> str:
    """What the run measured on, as a site groups it: the GPU's name on CUDA, the CPU's model on the CPU."""
    before = env.get("before") or {}
    name = before.get("device_name") if device_type == "cuda" else before.get("cpu_model")
    return str(name or before.get("device_name") or before.get("cpu_model") or device_type or "unknown device")


def _json_or_none(value: Any) -> str | None:
    """JSON text of a document (sorted keys: the same run gives the same bytes), or None."""
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _document(path: Path) -> dict[str, Any] | None:
    """A run folder's JSON document as plain data (checked as the run's readers check it), or None when absent."""
    from harness.results.documents import Environment, Manifest, Peaks, read_document
    from harness.files import parse_json, read_regular

    kind = {"manifest.json": Manifest, "env.json": Environment, "peaks.json": Peaks}[path.name]
    if not os.path.lexists(path):
        return None
    read_document(path, kind)  # one line naming the file and field for a document attnbench would not read
    return parse_json(read_regular(path, "JSON document"), path)


def read_run(run_dir: Path | str) -> IngestedRun:
    """Read a run folder (manifest, environment, peaks, records) into a run row and its record rows; UserError in one line otherwise."""
    from harness.results.documents import Manifest, read_document
    from harness.results.pair_specs import pair_cases
    from harness.results.store import read_records

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder: give a run folder (results/<run-id>/)")
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"{run_dir} is not a run folder: it has no manifest.json")
    typed = read_document(manifest_path, Manifest)
    problem = typed.run_problem()
    if problem is not None:
        raise UserError(f"{manifest_path} is not an attnbench run's manifest: {problem}")
    pair_cases(typed, manifest_path)  # every pair a case that can exist, as resume checks it
    manifest = _document(manifest_path) or {}
    env = _document(run_dir / "env.json") or {}
    peaks = _document(run_dir / "peaks.json")
    result = read_records(run_dir)  # a newer schema, a corrupt line: one line naming file:line
    warnings = [result.dropped_message] if result.dropped_message else []
    run_uuid, derived = run_uuid_of(manifest)
    if derived:
        warnings.append(f"{run_dir}: its manifest has no run_uuid (written before attnbench gave one); keyed by {run_uuid}, derived from the manifest")
    before = env.get("before") or {}
    device_type = manifest.get("device") or before.get("device_type")
    model = device_model(env, device_type)
    if not os.path.lexists(run_dir / "env.json"):  # every run writes one: without it, nothing says which machine measured
        model = UNKNOWN_DEVICE
        warnings.append(f"{run_dir}: it has no env.json, so nothing says which {device_type or 'device'} measured it: "
                        f"its device model is kept as {UNKNOWN_DEVICE!r} (restore env.json and add it again with --replace to name it)")
    first = result.records[0] if result.records else {}
    run = {
        "run_uuid": run_uuid, "run_id": manifest.get("run_id"), "suite": manifest.get("suite") or manifest.get("suite_arg"),
        "device_type": device_type, "device_model": model, "host": before.get("host"),
        "harness_version": manifest.get("harness_version") or before.get("harness_version") or first.get("harness_version"),
        "harness_commit": manifest.get("harness_commit") or before.get("harness_commit") or first.get("harness_commit"),
        "harness_dirty": manifest.get("harness_dirty", before.get("harness_dirty")),
        "torch": before.get("torch"), "torch_cuda": before.get("torch_cuda"),
        "cudnn": None if before.get("cudnn") is None else str(before.get("cudnn")), "python": manifest.get("python") or before.get("python"),
        "libraries_json": _json_or_none({k: before.get(k) for k in LIBRARY_KEYS if before.get(k) is not None}),
        "created_utc": manifest.get("created_utc") or before.get("time_utc"),
        "added_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source_path": str(run_dir.resolve()), "pairs": len(manifest.get("pairs") or []), "rows": len(result.records),
        "rows_ok": sum(1 for r in result.records if r.get("status") == "ok"),
        "manifest_json": _json_or_none(manifest), "env_json": _json_or_none(env), "peaks_json": _json_or_none(peaks),
    }
    rows = [{**{name: record.get(name) for name in ROW_COLUMNS if name not in ("run_uuid", "record_json")},
             "run_uuid": run_uuid, "record_json": _json_or_none(record)} for record in result.records]
    return IngestedRun({name: run[name] for name in RUN_COLUMNS}, [{name: row[name] for name in ROW_COLUMNS} for row in rows], warnings)


def content_digest(ingested: IngestedRun) -> str:
    """A digest of what a run holds (its records and documents, not when it was added): the same folder added twice gives the same."""
    digest = hashlib.sha256()
    for name in ("manifest_json", "env_json", "peaks_json"):
        digest.update((ingested.run[name] or "").encode() + b"\0")
    for row in ingested.rows:
        digest.update(row["record_json"].encode() + b"\n")
    return digest.hexdigest()
