"""`attnbench stability`'s engine: one case measured in several fresh processes, and the spread of their medians.

Within one process the samples of a measurement agree far better than two processes do (address
layout, thread placement, clocks, what else the box is doing), so the honest noise floor for
"is a 3 % difference real?" is the coefficient of variation of medians across fresh processes.
The command (harness/cli/stability.py) writes it as a variation document that compare, recommend
and report take with `--variation FILE`: `harness.analysis.difference` widens every interval by it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, TextIO

from harness.errors import UserError
from harness.process.children import child_command, emit, run_child
from harness.process.jobs import job_parser
from harness.results.documents import MAX_VARIATION_PROCESSES
from harness.results.record import Record, Status
from harness.suite.cases import Case, parse_case_id

if TYPE_CHECKING:
    from harness.analysis.difference import Variation


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
        lines = [f"{self.case.id} on {self.backend} ({self.case.device}), {len(self.medians)} fresh processes:"]
        lines += [f"  process {i + 1}: median {m * 1e3:.4g} ms" for i, m in enumerate(self.medians)]
        # Two independent runs differ with a spread of about √2·CV; twice that is a ~95 % band.
        band = 2 * math.sqrt(2) * self.cv
        lines.append(f"mean of medians {self.mean * 1e3:.4g} ms, coefficient of variation {self.cv * 100:.2f} %")
        lines.append(f"a difference between two runs below about {band * 100:.1f} % (2·√2·CV) is within this box's run-to-run noise")
        return "\n".join(lines)

    def variation(self, device_name: str) -> Variation:
        """What the difference rule widens intervals by, measured on `device_name` (as env.json names the device)."""
        from harness.analysis.difference import Variation

        return Variation(self.cv, self.case.device, device_name, self.case.id, self.backend, tuple(m * 1e3 for m in self.medians))


def measure_in_fresh_process(case: Case, backend: str, measure_s: float) -> float:
    """The median latency (seconds) of one measurement of `case` in a new Python process."""
    done = run_child(child_command("stability", case.id, "--device", case.device, "--backend", backend, "--measure-s", repr(measure_s)))
    if not done.ok:
        raise UserError(f"the measuring process failed ({done.describe()})")
    record = Record.from_dict(done.objects[-1], where="stability child")
    if record.status is not Status.OK:
        raise UserError(f"{backend} gives {record.status} for {case.id}: {record.reason}")
    return record.latency_ms_median / 1e3


def run_stability(case: Case, backend: str, processes: int = 5, measure_s: float = 0.5, log: TextIO | None = None) -> StabilityResult:
    """Measure `case` once in each of `processes` fresh processes, one after the other."""
    if not 2 <= processes <= MAX_VARIATION_PROCESSES:
        raise UserError(f"--processes must be from 2 to {MAX_VARIATION_PROCESSES:,} (each is a fresh process, started one after another), got {processes}")
    if not measure_s > 0:
        raise UserError(f"--measure-s must be positive, got {measure_s}")
    from harness.backends.registry import load_registry

    load_registry().get(backend)  # an unknown name fails here, not in the children
    medians = []
    for i in range(processes):
        medians.append(measure_in_fresh_process(case, backend, measure_s))
        if log is not None:
            log.write(f"\rprocess {i + 1}/{processes} done")
            log.flush()
    if log is not None:
        log.write("\n")
    return StabilityResult(case, backend, tuple(medians))


def measurement_job(argv: Sequence[str]) -> int:
    """The `stability` child job: in the fresh process, time the pair (no check, no memory) and emit its record."""
    from dataclasses import replace

    from harness.backends.registry import load_registry
    from harness.execution.execute import PairRunner, Phases, execute
    from harness.measure.timing import QUICK_BUDGET

    parser = job_parser("stability", "one measurement for `attnbench stability`")
    parser.add_argument("case")
    parser.add_argument("--device", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--measure-s", type=float, required=True)
    args = parser.parse_args(argv)
    case = parse_case_id(args.case, args.device)
    runner = PairRunner(budget=replace(QUICK_BUDGET, measure_s=args.measure_s, max_rounds=10_000),
                        phases=Phases(check=False, memory=False, energy=False))
    emit(execute(case, load_registry().get(args.backend), runner).to_dict())
    return 0
