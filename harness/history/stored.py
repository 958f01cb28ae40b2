"""What the results database hands back, checked as a run folder's readers check the same data: a row tampered with inside a
team's database (a record that is not JSON, a median stored as text, a manifest that is not an object) is one line naming the
database, the run, the row and the field, never a traceback in `regress` or `site` and never a wrong trend.

A row's queried columns are copies of its record's fields (harness.history.ingest), so each must equal what its record says.
A run stored is replaced only by what can be a later state of it (`later_state_problem`): a resume only appends.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.errors import UserError
from harness.history.ingest import ROW_COLUMNS, IngestedRun

#: The run columns that hold a run folder's documents, and the document each is read as.
_DOCUMENTS = {"manifest_json": "Manifest", "env_json": "Environment", "peaks_json": "Peaks"}
_COUNTS = ("pairs", "rows", "rows_ok")


def _run_name(run_id: Any, run_uuid: Any) -> str:
    """How a message names a run: its id and the first characters of its uuid."""
    return f"run {run_id} ({str(run_uuid)[:8]})"


def _json_object(text: Any, where: str, field: str) -> dict[str, Any]:
    """The JSON object stored as text in `field`; UserError naming it otherwise."""
    if not isinstance(text, str):
        raise UserError(f"{where}: field {field!r} holds {type(text).__name__}, not JSON text")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise UserError(f"{where}: field {field!r} is not valid JSON") from None
    if not isinstance(value, dict):
        raise UserError(f"{where}: field {field!r} is not a JSON object")
    return value


def check_run(run: dict[str, Any], database: str) -> None:
    """Refuse (UserError) a stored run whose key, counts or documents are not what `db add` stores."""
    from harness.results import documents

    where = f"results database {database}: {_run_name(run.get('run_id'), run.get('run_uuid'))}"
    for name in ("run_uuid", "run_id"):
        if not isinstance(run.get(name), str) or not run[name]:
            raise UserError(f"{where}: field {name!r} is {run.get(name)!r}, not a non-empty string")
    for name in _COUNTS:
        value = run.get(name)
        if not (value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)):
            raise UserError(f"{where}: field {name!r} is {value!r}, not a count")
    for name, kind in _DOCUMENTS.items():
        if name == "manifest_json" or run.get(name) is not None:
            data = _json_object(run.get(name), where, name)
            getattr(documents, kind).from_dict(data, where=f"{where}, field {name!r}")


def _same(stored: Any, expected: Any) -> bool:
    """Whether a stored column value is the one its record gives (NaN equal to NaN, a number's type exact)."""
    if isinstance(expected, float) and math.isnan(expected):  # SQLite stores a NaN as NULL
        return stored is None or (isinstance(stored, float) and math.isnan(stored))
    return type(stored) is type(expected) and stored == expected


def check_row(row: dict[str, Any], run_id: Any, ordinal: Any, database: str) -> dict[str, Any]:
    """The stored row's record, parsed; UserError when it is not one a records file could hold, or its columns disagree with it."""
    from harness.history.schema import coerce
    from harness.results.store import record_problem

    where = f"results database {database}: {_run_name(run_id, row.get('run_uuid'))}, row {ordinal}"
    record = _json_object(row.get("record_json"), where, "record_json")
    problem = record_problem(record)
    if problem is not None:
        raise UserError(f"{where}: record_json: {problem}")
    for name in ROW_COLUMNS:
        if name in ("run_uuid", "record_json"):
            continue
        expected = coerce(name, record.get(name))
        if not _same(row.get(name), expected):
            raise UserError(f"{where}: field {name!r} holds {row.get(name)!r} but its record says {expected!r}: the row was changed "
                            "after it was added; add the run again with --replace from its folder")
    return record


def later_state_problem(stored_manifest: str | None, stored_records: list[str], new: IngestedRun) -> str | None:
    """Why `new` cannot be a later state of the stored run (None when it can): a resume only appends records and attempts.

    The stored records are the first of the new ones, byte for byte; the manifest is the same but for attempts appended; and
    something was appended (records or an attempt). Anything else is an earlier copy, a damaged one or a different run."""
    new_records = [row["record_json"] for row in new.rows]
    if len(new_records) < len(stored_records):
        return f"it has {len(new_records)} rows, fewer than the {len(stored_records)} stored"
    for i, (old, now) in enumerate(zip(stored_records, new_records)):
        if old != now:
            return f"row {i + 1} differs from the stored one"
    before, after = json.loads(stored_manifest or "{}"), json.loads(new.run["manifest_json"] or "{}")
    old_attempts, new_attempts = before.pop("attempts", None) or [], after.pop("attempts", None) or []
    if before != after:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        return f"its manifest differs in {', '.join(repr(k) for k in changed[:3])}"
    if new_attempts[:len(old_attempts)] != old_attempts:
        return "its manifest's attempts are not the stored ones followed by more"
    if len(new_records) == len(stored_records) and len(new_attempts) == len(old_attempts):
        return "it holds the same rows and attempts, with other documents"
    return None
