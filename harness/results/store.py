"""Records: one per (case, backend), appended to `results/<run-id>/records.jsonl` and loaded into pandas.

The schema is versioned; `upgrade()` brings older records forward on load (pyperf's habit).
Numbers are stored at full precision; only reports round.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness.errors import UserError
from harness.results.record import COLUMNS, RAW_COLUMNS, SCHEMA_VERSION, Record

RECORDS = "records.jsonl"
RECORDS_CSV = "records.csv"
ENV = "env.json"


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one (version 1 is the first)."""
    version = record.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        raise UserError(f"record has schema version {version}, newer than this attnbench ({SCHEMA_VERSION}): upgrade attnbench")
    return record


class RunWriter:
    """Appends records to a run's JSONL one line at a time, flushed and fsynced, so a kill loses nothing finished."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS

    def append(self, record: Record) -> None:
        """Write one record as one line; O_APPEND keeps lines from concurrent workers whole."""
        line = json.dumps(record.to_dict(), separators=(",", ":"), default=str) + "\n"
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


def typed_records(path: Path | str) -> list[Record]:
    """The records of a run folder or records file, each type-checked (UserError naming the file, record and field)."""
    return [Record.from_dict(r, where=f"{path} record {i}") for i, r in enumerate(read_records(path).records, start=1)]


def iter_records(run_dirs: Iterable[Path | str]) -> Iterator[Record]:
    """Every record of the given runs, in file order."""
    for run_dir in run_dirs:
        yield from typed_records(run_dir)


def load_run(*run_dirs: Path | str):
    """Load one or more runs into one pandas DataFrame, with every column of the schema present."""
    import pandas as pd

    frame = pd.DataFrame([r.to_dict() for r in iter_records(run_dirs)])
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
