"""What every row of a run carries from its manifest: its place in its case's order and the command that re-runs it alone.

`repro` is one shell command, run from the checkout's root, that measures the same pair again in a
new run folder: the interpreter that ran the run (its absolute path, from the manifest: in a fresh
shell a bare `python` may be one without torch, or another torch), the same suite (a built-in suite's name, or the absolute path of the frozen
`suite.toml` of the run folder, so the budget is the one the row had), the exact case id
(`--case`, not the substring `--only`), the backend, the device, the timer, and the switches that
change what a pair records (`--no-check`, `--profile`, `--traces`). It is built from the manifest,
so the rows of every executor, and the rows the supervisor writes for a pair that died, get it alike.
"""

from __future__ import annotations

import shlex
from typing import Any

from harness.results.record import Record
from harness.run.order import Pair, positions_in_case


def repro_command(manifest: dict[str, Any], suite_arg: str, case_id: str, backend: str) -> str:
    """The shell command that re-runs pair (`case_id`, `backend`) of the run `manifest` describes, alone."""
    words = [str(manifest.get("python") or "python"), "-m", "harness", "run", "--suite", suite_arg, "--case", case_id, "--backends", backend,
             "--device", str(manifest["device"]), "--timer", str(manifest.get("timer") or "events")]
    if not manifest.get("check", True):
        words.append("--no-check")
    if manifest.get("energy"):
        words.append("--energy")
    if manifest.get("profile"):
        words.append("--profile")
        if manifest.get("traces"):
            words.append("--traces")
    return " ".join(shlex.quote(w) for w in words)


class RunRows:
    """Stamps a run's rows with what the manifest knows of them: `order_in_case` and `repro`."""

    def __init__(self, manifest: dict[str, Any], suite_arg: str, pairs: dict[str, Pair]) -> None:
        self.manifest, self.suite_arg = manifest, suite_arg
        self.positions = positions_in_case([k for k in manifest["pairs"] if k in pairs], pairs)

    def stamp(self, record: Record) -> Record:
        """`record` with its position in its case's order and its repro command set; returned for chaining."""
        record.order_in_case = self.positions.get(record.pair_key)
        record.repro = repro_command(self.manifest, self.suite_arg, record.case_id, record.backend)
        return record
