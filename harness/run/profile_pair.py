"""One pair profiled on its own (`attnbench profile CASE --backend NAME`): where its time goes, beside its harness median.

The pair runs through the same executor as a suite: checked, timed, then a few steps under
torch.profiler (never inside a timed sample), its Chrome trace (gzip JSON, opens in Perfetto and
chrome://tracing) written into a new folder under `out`. With ncu, the pair's kernels also run
under Nsight Compute for a small metric set, in a child process (the `profile-ncu` job). The
command's options and printing are harness/cli/profile.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from harness.errors import UserError
from harness.process.jobs import job_parser
from harness.results.record import Status
from harness.suite.cases import Case, parse_case_id

if TYPE_CHECKING:
    from harness.profiling.ncu import NcuKernel
    from harness.profiling.profile import ProfileSummary

#: Calls of the step an `--ncu` child makes: few, because ncu replays every kernel once per metric pass.
NCU_CALLS = 2
#: The most profiled steps: the profiler keeps every event of every step in memory, and a few steps already give stable shares.
MAX_STEPS = 10_000


@dataclass(frozen=True)
class NcuResult:
    """The pair's kernels as Nsight Compute read them, or why there are none (`why_not`)."""

    kernels: tuple[NcuKernel, ...] = ()
    why_not: str | None = None


@dataclass(frozen=True)
class ProfileResult:
    """One profiled pair: its harness median, its agreement (None: not checked), the profile, and ncu's kernels if asked."""

    case: Case
    backend: str
    median_s: float
    agree: bool | None
    profile: ProfileSummary
    ncu: NcuResult | None = None


def profile_folder(out: Path, case: Case, backend: str) -> Path:
    """A new folder for one profile: UTC time, case id and backend."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = Path(out) / f"{stamp}-{case.id}-{backend}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {folder}: {exc.strerror or exc}") from None
    return folder


def run_profile(case: Case, backend_name: str, steps: int, out: Path, ncu: bool) -> ProfileResult:
    """Profile one pair (its trace into a new folder under `out`); UserError when the pair does not run."""
    from harness.backends.registry import load_registry
    from harness.execution.execute import Phases, run_pair
    from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

    if not 1 <= steps <= MAX_STEPS:
        raise UserError(f"--steps must be from 1 to {MAX_STEPS:,} (each step's events are kept for the table and the trace), got {steps}")
    backend = load_registry().get(backend_name)
    folder = profile_folder(out, case, backend_name)
    phases = Phases(check=True, time=True, memory=False, energy=False, profile=True, profile_steps=steps, traces=folder)
    budget = CUDA_BUDGET if case.device == "cuda" else QUICK_BUDGET
    outcome = run_pair(case, backend, phases, budget=budget)
    if outcome.status is not Status.OK:
        raise UserError(f"{backend_name} gives {outcome.status} for {case.id}: {outcome.reason}")
    agree = outcome.agreement.agree if outcome.agreement else None
    return ProfileResult(case, backend_name, outcome.measurement.stats.median, agree, outcome.profile,
                         ncu_kernels(case, backend_name) if ncu else None)


def ncu_kernels(case: Case, backend_name: str) -> NcuResult:
    """The pair's kernels under ncu (a child process running the `profile-ncu` job), or why not."""
    from harness.process.children import child_command, run_child
    from harness.profiling.ncu import ncu_available, ncu_command, parse_ncu_csv

    reason = ncu_available() if case.device == "cuda" else "Nsight Compute profiles CUDA kernels: this is a CPU case"
    if reason:
        return NcuResult(why_not=reason)
    child = child_command("profile-ncu", case.id, "--backend", backend_name)
    done = run_child(ncu_command(child, profile_from_start=False), timeout_s=600, env={**os.environ, "LC_ALL": "C"})
    kernels = parse_ncu_csv(done.stdout)
    if done.returncode != 0:
        return NcuResult(why_not=f"failed ({done.describe()})")
    if not kernels:
        return NcuResult(why_not="ran, but its output held no kernel table")
    return NcuResult(tuple(kernels))


def ncu_job(argv: Sequence[str]) -> int:
    """The `profile-ncu` child job, under ncu: prepare the pair, then run NCU_CALLS steps between cudaProfilerStart and Stop."""
    import torch

    from harness.backends.base import prepare_pair
    from harness.backends.registry import load_registry
    from harness.execution.execute import build_step
    from harness.suite.ragged import make_case_inputs

    parser = job_parser("profile-ncu", "one pair's steps under Nsight Compute, for `attnbench profile --ncu`")
    parser.add_argument("case", help="the case id (its mode included), on CUDA")
    parser.add_argument("--backend", required=True)
    args = parser.parse_args(argv)
    case = parse_case_id(args.case, "cuda")
    backend = load_registry().get(args.backend)
    inputs = make_case_inputs(case)
    if case.mode != "fwd":
        for t in (inputs.q, inputs.k, inputs.v):
            t.requires_grad_(True)
    with torch.set_grad_enabled(case.mode != "fwd"):
        step = build_step(case, prepare_pair(backend, case, inputs), inputs)  # a plain callable too, as the plugin contract allows
        step()  # compile, autotune, allocate: outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(NCU_CALLS):
            step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0
