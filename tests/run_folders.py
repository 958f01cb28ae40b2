"""Run folders built by hand for the bad-input tables (tests/test_data_safety.py, test_hangs.py, test_documents.py).

Each looks like what the supervisor leaves (records.jsonl of real `Record`s, env.json, peaks.json and
a manifest with the attnbench marker), so a test changes one thing and sees only that thing refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from harness.cli.main import main
from harness.results.store import RunWriter
from harness.suite.cases import Case
from tests.synthetic_runs import PEAKS, synthetic_record

CASES = [Case(B=1, S_q=S, S_kv=S, H=2, H_kv=2, d_k=16, d_v=16) for S in (16, 32)]
BACKENDS = ("naive", "sdpa-math")
SUITE = 'name = "tiny"\nbackends = ["naive", "sdpa-math"]\n[budget]\nwarmup_s = 0.001\nmeasure_s = 0.01\nmin_rounds = 2\n' \
        '[[grid]]\nB = 1\nS = [16, 32]\nH = 2\nd_k = 16\n'


def write_suite(path: Path) -> Path:
    """The tiny two-case suite the hand-built runs were "run" from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SUITE)
    return path


def make_run(path: Path, *, suite: Path | None = None, ms: float = 1.0) -> Path:
    """A run folder as an attnbench run of the tiny suite leaves it (the suite frozen inside, as a run copies it)."""
    path.mkdir(parents=True)
    writer = RunWriter(path)
    for case in CASES:
        for backend in BACKENDS:
            writer.append(synthetic_record(case, backend, ms * (2.0 if backend == "naive" else 1.0), run_id=path.name))
    if suite is None:
        write_suite(path / "suite.toml")
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


def refused(capsys, argv: list[str], words: list[str]) -> str:
    """Run the CLI in process: exit 2, one line on stderr naming the problem (each of `words`), no traceback."""
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, (code, captured.out[-500:], err[-2000:])
    assert err.count("\n") == 1 and err.startswith("attnbench: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err
