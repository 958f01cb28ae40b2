"""What every row of a run carries from its manifest: its place in its case's order and the command that re-runs it alone.

`repro` is one shell command, run from the checkout's root, that measures the same pair again in a
new run folder: the interpreter that ran the run (its absolute path, from the manifest: in a fresh
shell a bare `python` may be one without torch, or another torch), the row's own run folder as the
suite (`--suite <run folder>`: the pair is rebuilt from the case its manifest holds, with the budget
the row had, so it re-records the pair after the suite it came from changed or was deleted), the exact
case id (`--case`, not the substring `--only`), the backend, the device, the folder the row's run folder
is in (`--out`: the new run folder lands beside the row's, wherever the command is run from), and the run
options' flags (`RunOptions.run_words`: the timer, `--threads`, `--no-check`, `--energy`, `--profile`,
`--traces`). It is built from
the manifest, so the rows of every executor, and the rows the supervisor writes for a pair that died,
get it alike.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from harness.results.record import Record
from harness.results.run_options import RunOptions
from harness.run.order import Pair, positions_in_case


def repro_command(manifest: dict[str, Any], run_folder: Path | str, case_id: str, backend: str) -> str:
    """The shell command that re-runs pair (`case_id`, `backend`) of the run in `run_folder` (whose manifest is `manifest`), alone."""
    words = [str(manifest.get("python") or "python"), "-m", "harness", "run", "--suite", str(run_folder), "--case", case_id, "--backends", backend,
             "--device", str(manifest["device"]), "--out", str(Path(run_folder).parent),
             *RunOptions.from_manifest(manifest, "the run's manifest").run_words()]
    return " ".join(shlex.quote(w) for w in words)


class RunRows:
    """Stamps a run's rows with what the manifest knows of them: `order_in_case` and `repro`."""

    def __init__(self, manifest: dict[str, Any], run_folder: Path, pairs: dict[str, Pair]) -> None:
        self.manifest, self.run_folder = manifest, Path(run_folder).resolve()
        self.positions = positions_in_case([k for k in manifest["pairs"] if k in pairs], pairs)

    def stamp(self, record: Record) -> Record:
        """`record` with its position in its case's order and its repro command set; returned for chaining."""
        record.order_in_case = self.positions.get(record.pair_key)
        record.repro = repro_command(self.manifest, self.run_folder, record.case_id, record.backend)
        return record
