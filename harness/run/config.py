"""What `attnbench run` is asked for (`RunConfig`) and what it answers (`RunSummary`): plain data, built by the CLI or by hand in tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.results.run_options import RunOptions


@dataclass
class RunConfig:
    """What `attnbench run` was asked for (built by the CLI, or by hand in tests)."""

    suite: str
    device: str | None = None
    backends: list[str] | None = None
    out: Path = Path("results")
    run_id: str | None = None
    workers: int = 1
    gpus: list[int] | None = None
    force: bool = False
    resume: Path | None = None
    #: What shapes every pair's measurement (check, timer, energy, profile, traces, cool-down, order seed, budget);
    #: its budget None: the suite's. A resumed run has its manifest's instead.
    options: RunOptions = field(default_factory=RunOptions)
    case_timeout_s: float = 600.0
    #: Keep only pairs whose key contains every one of these substrings.
    only: list[str] = field(default_factory=list)
    #: Keep only the cases of these exact ids (`--case`; empty: every case).
    cases: list[str] = field(default_factory=list)
    progress: bool = False
    worker_env: dict[str, str] = field(default_factory=dict)
    #: Address space each CPU worker may add to its start-up size (RLIMIT_AS), in bytes; None = no cap.
    memory_limit: int | None = None
    #: Who runs the pairs: `local` (worker processes on this machine) or `ray` (tasks on a Ray cluster): harness.run.executors.
    executor: str = "local"
    #: The Ray cluster to use with `executor="ray"` (host:port of its head); None starts a local one.
    ray_address: str | None = None
    #: An earlier peaks.json a new run takes instead of measuring its own, where it matches (harness.telemetry.peaks_reuse).
    peaks: Path | None = None


@dataclass
class RunSummary:
    """Where a run went and how its pairs ended."""

    run_dir: Path
    counts: dict[str, int]
    total: int
    wall_s: float
    #: Rows whose medians decide no answer, by why: `contended` (other work took the CPU), `suspect` (the timing is in doubt).
    undecided: dict[str, int] = field(default_factory=dict)
    #: What measuring the flagged rows again at the end gave (harness.run.remeasure.outcome); empty when none was.
    remeasured: dict[str, int] = field(default_factory=dict)
