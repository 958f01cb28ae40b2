"""`attnbench stability`'s engine: one case measured in several fresh processes, and the spread of their medians.

Within one process the samples of a measurement agree far better than two processes do (address
layout, thread placement, clocks, what else the box is doing), so the honest noise floor for
"is a 3 % difference real?" is the coefficient of variation of medians across fresh processes.
The command (harness/cli/stability.py) writes it as a variation document that compare, recommend
and report take with `--variation FILE`: `harness.analysis.difference` widens every interval by it.

Each process's contention evidence (its record's `contended`, run-queue waits, preemptions, other GPU
processes, `suspect`) is kept beside its median. A process timed while other work ran measured that work's
speed too: its median may even agree with the others (all equally slowed), so a tight CV says nothing of the
quiet box, and a variation from it would widen every interval by the other work's noise. None is written then.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence, TextIO

from harness.analysis.difference import CV_WIDTH, ProcessEvidence, Variation, smallest_difference
from harness.errors import UserError
from harness.process.children import child_command, emit, run_child
from harness.process.jobs import job_parser
from harness.results.documents import MAX_VARIATION_PROCESSES
from harness.results.record import Record, Status
from harness.suite.cases import Case, parse_case_id


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation (n − 1) over the mean."""
    if len(values) < 2:
        raise ValueError("the coefficient of variation needs at least two values")
    return statistics.stdev(values) / statistics.fmean(values)


@dataclass(frozen=True)
class StabilityResult:
    """The medians of the fresh processes (seconds) and their spread."""

    case: Case
    backend: str
    medians: tuple[float, ...]
    #: Each process's contention evidence, in the order of `medians` (empty: not known).
    evidence: tuple[ProcessEvidence, ...] = ()
    #: torch's intra-op threads each process was timed with (None: not known).
    threads: int | None = None

    @property
    def untrusted(self) -> list[int]:
        """The processes (numbered from 1) that ran contended or suspect."""
        return [i + 1 for i, e in enumerate(self.evidence) if e.untrusted]

    @property
    def mean(self) -> float:
        """Mean of the medians."""
        return sum(self.medians) / len(self.medians)

    @property
    def cv(self) -> float:
        """Coefficient of variation of the medians."""
        return coefficient_of_variation(self.medians)

    def report(self) -> str:
        """The lines `attnbench stability` prints."""
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''} each" if self.threads is not None else ""
        lines = [f"{self.case.id} on {self.backend} ({self.case.device}), {len(self.medians)} fresh processes{threads}:"]
        for i, m in enumerate(self.medians):
            said = f", {self.evidence[i].describe()}" if i < len(self.evidence) else ""
            lines.append(f"  process {i + 1}: median {m * 1e3:.4g} ms{said}")
        lines.append(f"mean of medians {self.mean * 1e3:.4g} ms, coefficient of variation {self.cv * 100:.2f} %")
        if self.untrusted:
            lines.append(f"not this box's run-to-run noise: {len(self.untrusted)} of {len(self.medians)} processes were timed beside other work")
        else:
            # The band is the difference rule's own (harness.analysis.difference), the one compare, recommend and report apply.
            band = smallest_difference(self.cv)
            if math.isfinite(band):
                lines.append(f"a difference below {band * 100:.1f} % is within this box's run-to-run noise: compare, recommend and "
                             f"report never call it real with this variation (intervals widened by ±{CV_WIDTH:g}·CV overlap)")
            else:
                lines.append(f"a CV of {self.cv * 100:.0f} % or more is no noise band: the difference rule could call nothing different")
        return "\n".join(lines)

    def refuse_if_contended(self) -> None:
        """UserError when any process ran contended or suspect: its variation is the other work's as much as the box's."""
        if self.untrusted:
            n, which = len(self.untrusted), ", ".join(map(str, self.untrusted))
            raise UserError(f"{n} of {len(self.medians)} processes were contended or suspect (process {which}): a variation measured "
                            "under contention would widen every interval by the other work's noise; none written "
                            "(measure again when the machine is quiet, or with fewer --threads)")

    def variation(self, device_name: str) -> Variation:
        """What the difference rule widens intervals by, measured on `device_name`; UserError when a process ran contended."""
        self.refuse_if_contended()
        return Variation(self.cv, self.case.device, device_name, self.case.id, self.backend, tuple(m * 1e3 for m in self.medians),
                         threads=self.threads, per_process=self.evidence or None)


def evidence_of(record: Record) -> ProcessEvidence:
    """A measured record's median and contention evidence."""
    return ProcessEvidence(
        median_ms=record.latency_ms_median, contended=record.contended, suspect=record.suspect,
        run_queue_wait_ratio=record.run_queue_wait_ratio, involuntary_switches=record.involuntary_switches,
        cpu_wall_ratio=record.cpu_wall_ratio, iqr_ratio=record.iqr_ratio, threads=record.threads,
        gpu_other_processes=record.gpu_other_processes,
    )


def measure_in_fresh_process(case: Case, backend: str, measure_s: float, threads: int | None = None) -> ProcessEvidence:
    """The median latency and contention evidence of one measurement of `case` in a new Python process."""
    extra = ("--threads", str(threads)) if threads is not None else ()
    done = run_child(child_command("stability", case.id, "--device", case.device, "--backend", backend, "--measure-s", repr(measure_s), *extra))
    if not done.ok:
        raise UserError(f"the measuring process failed ({done.describe()})")
    record = Record.from_dict(done.objects[-1], where="stability child")
    if record.status is not Status.OK:
        raise UserError(f"{backend} gives {record.status} for {case.id}: {record.reason}")
    return evidence_of(record)


def run_stability(case: Case, backend: str, processes: int = 5, measure_s: float = 0.5, log: TextIO | None = None,
                  threads: int | None = None) -> StabilityResult:
    """Measure `case` once in each of `processes` fresh processes, one after the other (with `threads` torch threads each)."""
    if not 2 <= processes <= MAX_VARIATION_PROCESSES:
        raise UserError(f"--processes must be from 2 to {MAX_VARIATION_PROCESSES:,} (each is a fresh process, started one after another), got {processes}")
    if not measure_s > 0:
        raise UserError(f"--measure-s must be positive, got {measure_s}")
    from harness.backends.registry import load_registry

    load_registry().get(backend)  # an unknown name fails here, not in the children
    evidence = []
    for i in range(processes):
        evidence.append(measure_in_fresh_process(case, backend, measure_s, threads))
        if log is not None:
            log.write(f"\rprocess {i + 1}/{processes} done")
            log.flush()
    if log is not None:
        log.write("\n")
    counts = {e.threads for e in evidence}
    in_effect = threads if threads is not None else (counts.pop() if len(counts) == 1 else None)
    return StabilityResult(case, backend, tuple(e.median_ms / 1e3 for e in evidence), tuple(evidence), in_effect)


def measurement_job(argv: Sequence[str]) -> int:
    """The `stability` child job: in the fresh process, time the pair (no check, no memory) and emit its record."""
    from dataclasses import replace

    from harness.backends.registry import load_registry
    from harness.execution.execute import PairRunner, Phases, execute
    from harness.measure.threads import apply_threads
    from harness.measure.timing import QUICK_BUDGET

    parser = job_parser("stability", "one measurement for `attnbench stability`")
    parser.add_argument("case")
    parser.add_argument("--device", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--measure-s", type=float, required=True)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    case = parse_case_id(args.case, args.device)
    threads = apply_threads(args.threads)  # before the timing: the contention probe divides CPU time by the threads in effect
    runner = PairRunner(budget=replace(QUICK_BUDGET, measure_s=args.measure_s, max_rounds=10_000),
                        phases=Phases(check=False, memory=False, energy=False))
    record = execute(case, load_registry().get(args.backend), runner)
    record.threads = threads
    emit(record.to_dict())
    return 0
