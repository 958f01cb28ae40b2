"""Measuring flagged rows once more at the end of a sweep, through the same workers: what `make bench` on a busy machine answers from.

A row timed while other work took the CPU (`contended`), whose samples spread too widely (`suspect`) or whose GPU
was slowed (`throttled`) decides nothing (harness.analysis.trust). Other work comes and goes, so once every pair has
a row the supervisor measures each such row again, cheapest first, in fresh workers running the one worker loop
(harness.run.worker), for at most REMEASURE_SHARE of the run's wall time so far (REMEASURE_FLOOR_S at the least): a busy laptop's sweep ends with
answers where its load let up, at a bounded cost. `kernel_mismatch` is not measured again: the same path would run.

The new row is appended (records.jsonl is append-only) carrying `remeasured_from`, its first row's evidence; readers
see it in place of the first (harness.results.store.superseded_positions), so a row keeps its flag only if its
re-measure is flagged too, and the first row stays in the file. The plan travels to the workers as a file of the run
folder (`protocol.REMEASURE`: each key with the evidence they stamp), like the pending list.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from harness.errors import UserError
from harness.results.record import Record, Status
from harness.results.store import ReadResult, write_file
from harness.run import protocol
from harness.run.progress import Progress

#: The flags a second measurement may clear (a row that ran another kernel would run it again).
REMEASURED_FLAGS = ("contended", "suspect", "throttled")
#: The share of the run's wall time so far that re-measuring may add: `quick`'s 1.5 minutes become at most 2.25.
REMEASURE_SHARE = 0.5
#: Seconds re-measuring may take at the least: a fresh worker's start (importing torch) alone takes seconds on a busy machine.
REMEASURE_FLOOR_S = 20.0


def allowed_s(run_wall_s: float) -> float:
    """Seconds re-measuring may take after a run of `run_wall_s` seconds so far."""
    return max(REMEASURE_FLOOR_S, REMEASURE_SHARE * run_wall_s)
#: The columns of a first row a re-measure keeps as `remeasured_from`.
EVIDENCE_FIELDS = ("latency_ms_median", "latency_ms_ci95_low", "latency_ms_ci95_high", "iqr_ratio", "samples", *REMEASURED_FLAGS,
                   "run_queue_wait_ratio", "involuntary_switches", "cpu_wall_ratio", "threads", "throttle_reason", "worker", "timestamp")


def flags(record: Record) -> list[str]:
    """The re-measurable flags `record` carries."""
    return [name for name in REMEASURED_FLAGS if getattr(record, name) is True]


def to_remeasure(rows: ReadResult) -> list[Record]:
    """The rows to measure again: measured (`ok`), flagged, not re-measured before (a resumed run's); cheapest first."""
    done = rows.remeasured_keys()
    flagged = [r for r in rows.typed() if r.status is Status.OK and flags(r) and r.pair_key not in done]
    return sorted(flagged, key=lambda r: r.time_pair_s if r.time_pair_s is not None else float("inf"))


def evidence(record: Record) -> dict[str, Any]:
    """What a re-measured row keeps of its first row (`remeasured_from`)."""
    return {name: getattr(record, name) for name in EVIDENCE_FIELDS}


def write_plan(run_dir: Path, rows: list[Record]) -> list[str]:
    """Write the re-measure plan (each row's key and evidence) for the workers; the keys, in order."""
    plan = {row.pair_key: evidence(row) for row in rows}
    write_file(Path(run_dir) / protocol.REMEASURE, json.dumps(plan, default=str))
    return list(plan)


def read_plan(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The plan a worker stamps its rows from ({} outside the re-measure phase); UserError when it is not a JSON object."""
    path = Path(run_dir) / protocol.REMEASURE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        plan = json.loads(text)
    except ValueError:
        plan = None
    if not isinstance(plan, dict) or not all(isinstance(v, dict) for v in plan.values()):
        raise UserError(f"{path} is not a re-measure plan (a JSON object of pair keys and evidence)")
    return plan


def outcome(rows: ReadResult, keys: list[str]) -> dict[str, int]:
    """How the re-measure of `keys` went: flagged (asked), remeasured (a row came back `ok`), cleared (that row carries no flag)."""
    standing = {r.pair_key: r for r in rows.typed()}
    again = [standing[k] for k in keys if k in standing and standing[k].remeasured_from is not None]
    return {"flagged": len(keys), "remeasured": len(again), "cleared": sum(1 for r in again if not flags(r))}


def remeasure_flagged(folder: Any, execute: Callable[[list[str], Progress, float], None], started: float,
                      log: TextIO | None) -> dict[str, int]:
    """Measure `folder`'s flagged rows once more through `execute` (the executor's pairs, a Progress, when to stop), cheapest
    first, for `allowed_s` of the run's time so far (its earlier attempts and this one since `started`); the outcome."""
    rows = to_remeasure(folder.read_rows())
    if not rows:
        return {}
    seconds = allowed_s(sum(float(a.get("wall_s") or 0.0) for a in folder.document.attempts) + time.monotonic() - started)
    keys = write_plan(folder.path, rows)
    if log is not None:
        log.write(f"re-measuring {len(keys)} contended, suspect or throttled rows, cheapest first, for at most {seconds:.0f} s\n")
    progress = Progress(len(keys), 0, log, label="re-measure: ", offset=folder.count_lines())
    try:
        execute(keys, progress, time.monotonic() + seconds)
    finally:
        (folder.path / protocol.REMEASURE).unlink(missing_ok=True)
    progress.update(folder.count_lines(), final=True, last_pair=folder.last_recorded_key)
    return outcome(folder.read_rows(), keys)


def summary_text(counts: dict[str, int]) -> str:
    """One line for the end of `run`: what re-measuring the flagged rows gave."""
    n, asked, cleared = counts["remeasured"], counts["flagged"], counts["cleared"]
    text = f"re-measured {n} of {asked} flagged rows at the end of the sweep: {cleared} now unflagged, {n - cleared} flagged again"
    if n < asked:
        text += f", {asked - n} not measured again (out of the time allowed, or the re-measure failed: their first row stands)"
    return text
