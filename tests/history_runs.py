"""Run folders for the results-database tests: real-format runs (tests/run_folders.make_run), each with its own uuid and time."""

from __future__ import annotations

import json
from pathlib import Path

from tests.run_folders import make_run

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
