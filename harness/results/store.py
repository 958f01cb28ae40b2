"""Records: one per (case, backend), appended to `results/<run-id>/records.jsonl` and loaded into pandas.

The schema is versioned; `upgrade()` brings older records forward on load (pyperf's habit).
Numbers are stored at full precision; only reports round.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness.suite.cases import CASE_FIELDS
from harness.errors import UserError

SCHEMA_VERSION = 1
RECORDS = "records.jsonl"
RECORDS_CSV = "records.csv"
ENV = "env.json"

STATUSES = ("ok", "unsupported", "oom", "error", "crashed", "timeout")

#: Columns every record has, in CSV order (the case's fields first).
COLUMNS: tuple[str, ...] = (
    "case_id", *CASE_FIELDS, "attention_kind",
    "backend", "family", "backend_version", "status", "reason",
    "latency_ms_median", "latency_ms_p20", "latency_ms_p80", "latency_ms_min", "latency_ms_mean",
    "latency_ms_max", "latency_ms_stdev", "iqr_ratio", "samples", "iterations", "noisy", "suspect", "too_short",
    "warmup_s", "clock_resolution_s", "timer", "compile_s",
    "peak_mem_bytes", "peak_reserved_bytes", "memory_method",
    "flops", "bytes", "kv_cache_bytes", "tflops", "gbps", "arithmetic_intensity",
    "kv_expanded", "notes",
    "max_abs_err", "err_bound", "rel_err", "agree",
    "run_id", "worker", "timestamp", "schema_version",
)

#: Columns kept in JSONL but not in the flat CSV.
RAW_COLUMNS = ("sample_ms",)


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one (version 1 is the first)."""
    version = record.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        raise UserError(f"record has schema version {version}, newer than this attnbench ({SCHEMA_VERSION}): upgrade attnbench")
    return record


def _clean(value: Any) -> Any:
    """JSON has no NaN or Infinity: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunWriter:
    """Appends records to a run's JSONL one line at a time, flushed and fsynced, so a kill loses nothing finished."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line; O_APPEND keeps lines from concurrent workers whole."""
        record = {k: _clean(v) for k, v in record.items()}
        record.setdefault("schema_version", SCHEMA_VERSION)
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ReadResult:
    """Records read from a JSONL file, and whether a truncated last line was dropped."""

    records: list[dict[str, Any]]
    dropped_partial_line: bool


def read_records(path: Path | str) -> ReadResult:
    """Read a records file; a truncated last line (a kill mid-write) is dropped, any other bad line is an error naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS
    if not path.exists():
        raise UserError(f"no records file at {path}")
    records: list[dict[str, Any]] = []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    dropped = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            is_last = number == len(lines) and not raw.endswith(b"\n")
            if is_last:
                dropped = True
                break
            raise UserError(f"{path}:{number}: corrupt record ({exc})") from None
        records.append(upgrade(record))
    return ReadResult(records, dropped)


def iter_records(run_dirs: Iterable[Path | str]) -> Iterator[dict[str, Any]]:
    """Every record of the given runs, in file order."""
    for run_dir in run_dirs:
        yield from read_records(run_dir).records


def load_run(*run_dirs: Path | str):
    """Load one or more runs into one pandas DataFrame, with every column of the schema present."""
    import pandas as pd

    frame = pd.DataFrame(list(iter_records(run_dirs)))
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    ordered = [*COLUMNS, *[c for c in frame.columns if c not in COLUMNS]]
    return frame[ordered]


def write_csv(run_dir: Path | str) -> Path:
    """Write `records.csv` beside the JSONL: the flat columns, raw samples left out (they stay in the JSONL)."""
    run_dir = Path(run_dir)
    frame = load_run(run_dir)
    frame = frame.drop(columns=[c for c in RAW_COLUMNS if c in frame.columns])
    if "notes" in frame.columns:
        frame["notes"] = frame["notes"].map(lambda n: json.dumps(n, sort_keys=True) if isinstance(n, dict) else n)
    out = run_dir / RECORDS_CSV
    frame.to_csv(out, index=False)
    return out


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def validate_run_id(run_id: str) -> str:
    """A run id is a plain folder name: letters, digits, dot, dash, underscore."""
    if not _RUN_ID.match(run_id):
        raise UserError(f"invalid run id {run_id!r}: use letters, digits, '.', '-' and '_'")
    return run_id
