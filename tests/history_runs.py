"""Run folders for the results-database tests: real-format runs (tests/run_folders.make_run), each with its own uuid and time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.run_folders import make_run, snapshot

#: The latency fields scaled when a run is made slower.
LATENCIES = ("latency_ms_median", "latency_ms_p20", "latency_ms_p80", "latency_ms_ci95_low", "latency_ms_ci95_high")


def run_folder(path: Path, uuid_char: str, created: str, *, ms: float = 1.0, slower: dict[str, float] | None = None) -> Path:
    """A real-format run folder (tests/run_folders.make_run) with its own uuid and creation time; `slower` scales a backend's latencies."""
    make_run(path, ms=ms)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(run_uuid=uuid_char * 32, created_utc=created)
    (path / "manifest.json").write_text(json.dumps(manifest))
    if slower:
        lines = []
        for line in (path / "records.jsonl").read_text().splitlines():
            record = json.loads(line)
            factor = slower.get(record["backend"], 1.0)
            lines.append(json.dumps({**record, **{k: record[k] * factor for k in LATENCIES if record.get(k) is not None}}))
        (path / "records.jsonl").write_text("\n".join(lines) + "\n")
    return path


# --- what the results-are-kept tables (tests/test_results_kept*.py) share ---

def stored(db: Path) -> tuple[list, list]:
    """Every run and every row the SQLite database holds, read raw (no attnbench code between)."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return (conn.execute("SELECT * FROM runs ORDER BY run_uuid").fetchall(),
                conn.execute('SELECT * FROM "rows" ORDER BY run_uuid, ordinal').fetchall())
    finally:
        conn.close()


def records_of(run: Path) -> list[dict]:
    """The run folder's records, parsed."""
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def write_records(run: Path, records: list[dict]) -> None:
    """Replace the run folder's records (a hand edit)."""
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_json(path: Path, **changes) -> None:
    """Change top-level fields of a JSON document in place."""
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def changed(before: dict[str, str], after: dict[str, str], *allowed: str) -> list[str]:
    """The entries of the tree that differ, but those under `allowed` (relative paths)."""
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k) and not any(k == a or k.startswith(a + "/") for a in allowed))


def refused_untouched(tmp_path: Path, argv: list, capsys, *words: str, db: Path | None = None) -> str:
    """Run ARGV; assert a one-line refusal naming WORDS, the tree's bytes unchanged and (with `db`) every stored row kept."""
    rows_before = stored(db) if db is not None else None
    before = snapshot(tmp_path)
    err = assert_one_line_error(attnbench_in_process(argv, capsys), *words)
    assert changed(before, snapshot(tmp_path)) == []
    if db is not None:
        assert stored(db) == rows_before
    return err


def with_samples(run: Path) -> Path:
    """Give each record raw per-call samples around its median (what an export needs); the run folder."""
    write_records(run, [{**r, "sample_ms": [r["latency_ms_median"] * f for f in (0.99, 1.0, 1.01)]} for r in records_of(run)])
    return run


def database_of(tmp_path: Path, capsys, *runs: Path) -> Path:
    """A results database (SQLite) holding `runs`."""
    db = tmp_path / "team.sqlite"
    ran = attnbench_in_process(["db", "add", *runs, "--db", db], capsys)
    assert ran.code == 0, ran
    return db
