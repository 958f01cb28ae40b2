"""Run folders built by hand for the bad-input tables (tests/test_data_safety.py, test_hangs.py, test_documents.py).

Each looks like what the supervisor leaves (records.jsonl of real `Record`s, env.json, peaks.json and
a manifest with the attnbench marker), so a test changes one thing and sees only that thing refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from harness.results.store import RunWriter
from harness.suite.cases import Case
from tests.cli_runs import write_suite
from tests.synthetic_runs import PEAKS, synthetic_record

SIZES = (16, 32)
CASES = [Case(B=1, S_q=S, S_kv=S, H=2, H_kv=2, d_k=16, d_v=16) for S in SIZES]
BACKENDS = ("naive", "sdpa-math")


def tiny_suite(path: Path) -> Path:
    """The tiny two-case suite (CASES × BACKENDS) the hand-built runs were "run" from, written at `path`."""
    return write_suite(path, list(BACKENDS), list(SIZES), name="tiny")


def make_run(path: Path, *, suite: Path | None = None, ms: float = 1.0) -> Path:
    """A run folder as an attnbench run of the tiny suite leaves it (the suite frozen inside, as a run copies it)."""
    path.mkdir(parents=True)
    writer = RunWriter(path)
    for case in CASES:
        for backend in BACKENDS:
            writer.append(synthetic_record(case, backend, ms * (2.0 if backend == "naive" else 1.0), run_id=path.name))
    if suite is None:
        tiny_suite(path / "suite.toml")
    manifest = {"run_id": path.name, "harness": "attnbench", "run_uuid": "0" * 32, "suite": "tiny",
                "suite_arg": str(suite or path / "suite.toml"), "suite_copy": None if suite else "suite.toml", "device": "cpu",
                "backends": list(BACKENDS), "broken": {}, "pairs": [f"{c.id}-{b}" for c in CASES for b in BACKENDS], "check": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "env.json").write_text(json.dumps({"before": {"device_type": "cpu", "device_name": "synthetic CPU", "torch": "2.x"},
                                               "telemetry_before": None, "telemetry_after": None}))
    (path / "peaks.json").write_text(json.dumps(PEAKS))
    (path / "records.csv").write_text("case_id,backend\n")
    return path


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed) with a hash of its content, or its link target."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = "-> " + os.readlink(path)
            elif path.is_file():
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                found[key] = "dir"
            else:
                found[key] = "special"
    return found
