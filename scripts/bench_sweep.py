"""Where a sweep's wall time goes, and how it compares with another revision: a benchmark, not a test.

    python scripts/bench_sweep.py [--suite quick|FILE.toml] [--before REF] [--only SUBSTR,...]

Runs `attnbench run --suite SUITE` from this checkout in a fresh process (and first, with
`--before REF`, from a temporary git worktree of REF, so both run in one sitting on one machine),
then prints each run's wall time, the seconds spent in warm-up and in the timed samples (from the
records' `time_*_s` columns; a revision that predates them shows n/a), the harness's overhead
share (wall minus warm-up and timed, over wall) and the before/after wall-time ratio. Run it on a
quiet machine: on 2 shared cores, anything else running moves every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("inputs", "prepare", "check", "warmup", "timed", "memory", "profile")


def run_suite(checkout: Path, suite: str, only: str | None, out: Path) -> dict:
    """One `attnbench run` from `checkout` in a fresh process; its wall time and the phase sums of its records."""
    command = [sys.executable, "-m", "harness", "run", "--suite", suite, "--out", str(out), "--run-id", "bench", "--quiet"]
    if only:
        command += ["--only", only]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"attnbench run failed in {checkout}: {done.stderr.strip()[-500:]}")
    rows = [json.loads(line) for line in (out / "bench" / "records.jsonl").read_text().splitlines()]
    sums = {p: sum(r.get(f"time_{p}_s") or 0.0 for r in rows) for p in PHASES}
    known = any(f"time_{p}_s" in r for r in rows for p in PHASES)
    return {"wall": wall, "rows": len(rows), "ok": sum(r["status"] == "ok" for r in rows), "phases": sums if known else None,
            "pairs": sum(r.get("time_pair_s") or 0.0 for r in rows) if known else None}


def describe(name: str, result: dict) -> str:
    """The lines of one run."""
    lines = [f"{name}: {result['rows']} rows ({result['ok']} ok) in {result['wall']:.1f} s wall"]
    phases = result["phases"]
    if phases is None:
        lines.append("  per-phase seconds: n/a (this revision records none)")
        return "\n".join(lines)
    measured = phases["warmup"] + phases["timed"]
    lines.append(f"  warm-up {phases['warmup']:.1f} s + timed {phases['timed']:.1f} s = {measured:.1f} s; "
                 f"overhead {result['wall'] - measured:.1f} s = {1 - measured / result['wall']:.1%} of the wall time")
    split = ", ".join(f"{p} {phases[p]:.1f}" for p in PHASES if phases[p])
    lines.append(f"  seconds by phase: {split}; per-pair clean-up {result['pairs'] - sum(phases.values()):.1f}; "
                 f"outside pairs (peaks, worker start, pytest, writes) {result['wall'] - result['pairs']:.1f}")
    return "\n".join(lines)


def main() -> int:
    """Run the suite (after REF's run, with --before) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="quick")
    parser.add_argument("--before", help="a git revision to run first, from a temporary worktree")
    parser.add_argument("--only", help="pass --only to attnbench run (a subset of the pairs)")
    args = parser.parse_args()
    if args.suite.endswith(".toml"):
        args.suite = str(Path(args.suite).resolve())  # the same file for both checkouts, whatever REF holds
    with tempfile.TemporaryDirectory(prefix="attnbench-bench-") as tmp:
        tmp_path = Path(tmp)
        before = None
        if args.before:
            tree = tmp_path / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True, capture_output=True)
            try:
                before = run_suite(tree, args.suite, args.only, tmp_path / "out-before")
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
            print(describe(f"before ({args.before})", before), flush=True)
        after = run_suite(ROOT, args.suite, args.only, tmp_path / "out-after")
        print(describe("after (this checkout)", after))
        if before is not None:
            print(f"wall time after / before: {after['wall'] / before['wall']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
