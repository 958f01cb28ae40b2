"""What every row of a run carries from its manifest: its place in its case's order and the command that re-runs it alone.

`repro` is one shell command, run from the checkout's root, that measures the same pair again in a
new run folder: the interpreter that ran the run (its absolute path, from the manifest: in a fresh
shell a bare `python` may be one without torch, or another torch), the same suite (a built-in suite's name, or the absolute path of the frozen
`suite.toml` of the run folder, so the budget is the one the row had), the exact case id
(`--case`, not the substring `--only`), the backend, the device, the timer, and the switches that
change what a pair records (`--no-check`, `--profile`, `--traces`). It is built from the manifest,
so the rows of every executor, and the rows the supervisor writes for a pair that died, get it alike.

A run made by a repro has as its suite the frozen copy in the first run's folder, and its own frozen copy
is a copy of that copy. Its rows' repro names the first frozen copy in that chain whose bytes are the same
(`origin_suite`): a suite's relative `file:` lengths files are found beside the suite the first run was
given (the manifest beside a frozen copy names it), which a copy of a copy, one run folder further, is not.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.results.documents import MAX_DOCUMENT_BYTES, parse_json, read_regular
from harness.results.record import Record
from harness.run.order import Pair, positions_in_case

#: The most run folders `origin_suite` walks back through (repros of repros); a loop of manifests ends there too.
MAX_REPRO_CHAIN = 64


def _copied_from(copy: Path) -> Path | None:
    """The suite file that `copy`, a run folder's frozen suite, was copied from (its manifest's suite_arg), else None."""
    try:  # a FIFO or an endless file is refused, not waited on: this runs for every run's rows
        data = parse_json(read_regular(copy.parent / "manifest.json", "manifest", MAX_DOCUMENT_BYTES), copy.parent / "manifest.json")
    except UserError:
        return None
    if isinstance(data, dict) and data.get("suite_copy") == copy.name and isinstance(data.get("suite_arg"), str):
        return Path(data["suite_arg"])
    return None


def origin_suite(suite_arg: str) -> str:
    """The first frozen suite copy, back through repros of repros, with the same bytes as `suite_arg`; `suite_arg` if none."""
    current = Path(suite_arg)
    if current.suffix != ".toml":  # a built-in suite's name
        return suite_arg
    try:
        text = read_regular(current, "suite file", MAX_DOCUMENT_BYTES)
    except UserError:
        return suite_arg
    seen = {current}
    for _ in range(MAX_REPRO_CHAIN):
        source = _copied_from(current)
        # Only a frozen copy of another run folder with the very same bytes: the same cases and budget, one folder nearer the lengths files.
        if source is None or source in seen or _copied_from(source) is None:
            break
        try:
            if read_regular(source, "suite file", MAX_DOCUMENT_BYTES) != text:
                break
        except UserError:
            break
        current = source
        seen.add(current)
    return str(current)


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
        self.manifest, self.suite_arg = manifest, origin_suite(suite_arg)
        self.positions = positions_in_case([k for k in manifest["pairs"] if k in pairs], pairs)

    def stamp(self, record: Record) -> Record:
        """`record` with its position in its case's order and its repro command set; returned for chaining."""
        record.order_in_case = self.positions.get(record.pair_key)
        record.repro = repro_command(self.manifest, self.suite_arg, record.case_id, record.backend)
        return record
