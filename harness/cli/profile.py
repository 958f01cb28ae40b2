"""`attnbench profile CASE --backend NAME`: where one pair's time goes, beside its harness median, with a trace to open.

The pair runs through the same executor as a suite: checked, timed, then a few steps under
torch.profiler (never inside a timed sample). The table lists each operator (CPU) or kernel (CUDA)
per step; the sum is set against the median, the rest being launch overhead and gaps. A Chrome
trace (gzip JSON, opens in Perfetto and chrome://tracing) goes into a folder under `--out`.
With `--ncu`, the pair's kernels also run under Nsight Compute for a small metric set.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from harness.errors import UserError
from harness.results.record import Status
from harness.suite.cases import MODES, Case, parse_case_id

#: Calls of the step an `--ncu` child makes: few, because ncu replays every kernel once per metric pass.
NCU_CALLS = 2
#: The most profiled steps: the profiler keeps every event of every step in memory, and a few steps already give stable shares.
MAX_STEPS = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `attnbench profile` (the case as an id or shape flags, as for `stability`)."""
    from harness.cli.stability import add_case_arguments

    add_case_arguments(parser)
    parser.add_argument("--backend", default="sdpa", help="backend to profile (default sdpa)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    parser.add_argument("--profile-mode", dest="profile_mode", choices=MODES, help="profile this mode instead of the case's (fwd, bwd, fwd_bwd)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    parser.add_argument("--out", default="results/profiles", help="parent folder of the profile's folder (default results/profiles)")
    parser.add_argument("--ncu", action="store_true", help="also run the pair's kernels under Nsight Compute (CUDA, ncu on PATH)")


def profile_folder(out: Path, case: Case, backend: str) -> Path:
    """A new folder for one profile: UTC time, case id and backend."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = Path(out) / f"{stamp}-{case.id}-{backend}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {folder}: {exc.strerror or exc}") from None
    return folder


def run_profile(case: Case, backend_name: str, steps: int, out: Path, ncu: bool) -> str:
    """Profile one pair; return the text the command prints (table, trace path, ncu metrics or why not)."""
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
    median_s = outcome.measurement.stats.median
    verdict = {True: "agrees", False: "DISAGREES", None: "not checked"}[outcome.agreement.agree if outcome.agreement else None]
    lines = [f"{case.id} on {backend_name} ({case.device}): harness median {median_s * 1e3:.4g} ms, "
             f"{verdict} with the float64 reference", outcome.profile.format_table(median_s)]
    if ncu:
        lines.append(_ncu_lines(case, backend_name))
    return "\n".join(lines)


def _ncu_lines(case: Case, backend_name: str) -> str:
    """The pair's kernels under ncu (a child process), one line per kernel; or one line saying why not."""
    from harness.profiling.ncu import NCU_READINGS, ncu_available, ncu_command, ncu_readings, parse_ncu_csv
    from harness.run.children import child_command, run_child

    reason = ncu_available() if case.device == "cuda" else "Nsight Compute profiles CUDA kernels: this is a CPU case"
    if reason:
        return f"ncu: {reason}"
    child = child_command("profile-ncu", case.id, "--backend", backend_name)
    done = run_child(ncu_command(child, profile_from_start=False), timeout_s=600, env={**os.environ, "LC_ALL": "C"})
    kernels = parse_ncu_csv(done.stdout)
    if done.returncode != 0:
        return f"ncu: failed ({done.describe()})"
    if not kernels:
        return "ncu: ran, but its output held no kernel table"
    out = [f"ncu metrics (% of peak): kernel, {', '.join(NCU_READINGS)}"]
    for k in kernels:
        # By name: ncu's details page lists a kernel's metrics alphabetically, not in the order asked.
        values = "  ".join("-" if v is None else f"{v:5.1f}" for v in ncu_readings(k).values())
        out.append(f"  {k.kernel[:70]:<70}  {values}")
    return "\n".join(out)


def ncu_job(argv: Sequence[str]) -> int:
    """The `profile-ncu` child job, under ncu: prepare the pair, then run NCU_CALLS steps between cudaProfilerStart and Stop."""
    import torch

    from harness.backends.registry import load_registry
    from harness.child import job_parser
    from harness.execution.execute import build_step
    from harness.suite.inputs import make_case_inputs

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
        step = build_step(case, backend.prepare(case, inputs), inputs)
        step()  # compile, autotune, allocate: outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(NCU_CALLS):
            step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile one pair and print where its time goes."""
    from harness.cli.stability import case_from_args
    from harness.env import resolve_device

    case = case_from_args(args, resolve_device(args.device))
    if args.profile_mode:
        case = case.replace(mode=args.profile_mode)
    print(run_profile(case, args.backend, args.steps, Path(args.out), args.ncu))
    sys.stdout.flush()
    return 0
