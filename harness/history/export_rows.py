"""What every export format shares: the run's records as `read_run` checked them, a row's name, the rows left out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UserError


@dataclass
class Export:
    """What an export holds: the text to write, how many rows went in, and why each other row was left out."""

    text: str
    exported: int
    #: One {name, status, reason} per row left out.
    left_out: list[dict[str, Any]] = field(default_factory=list)
    #: Lines worth telling the user about the run read (a truncated last record dropped).
    warnings: list[str] = field(default_factory=list)


def run_records(run_dir: Path | str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[dict[str, Any]], list[str]]:
    """The run row, its manifest, its environment, its records whole, as `read_run` checked and kept them, and its warnings."""
    from harness.history.ingest import read_run

    ingested = read_run(run_dir)
    run = ingested.run
    manifest = json.loads(run["manifest_json"] or "{}")
    env = json.loads(run["env_json"] or "{}")
    return run, manifest, env, [json.loads(row["record_json"]) for row in ingested.rows], ingested.warnings


def pair_name(record: dict[str, Any]) -> str:
    """`<case_id>-<backend>`: a row's name in every exported format (the pair key)."""
    return f"{record['case_id']}-{record['backend']}"


def left_out(record: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    """The entry of a row that an export leaves out: its name, status and why."""
    return {"name": pair_name(record), "status": record.get("status"), "reason": reason or record.get("reason")}


def refuse_empty(run_dir: Path | str, exported: list, what: str = "ok row with raw samples") -> None:
    """UserError in one line when a run has nothing an export can hold (`what` names what it would need)."""
    if not exported:
        raise UserError(f"{run_dir} has no {what}: nothing to export")
