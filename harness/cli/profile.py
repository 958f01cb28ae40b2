"""`attnbench profile CASE --backend NAME`: its options, and the printing of what harness/run/profile_pair.py found.

The table lists each operator (CPU) or kernel (CUDA) per step; the sum is set against the median,
the rest being launch overhead and gaps; the Chrome trace's path follows, then ncu's metrics (or why not).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.suite.cases import MODES

if TYPE_CHECKING:
    from harness.run.profile_pair import NcuResult, ProfileResult


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
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch's intra-op CPU threads while timing and profiling (default: torch's, the core count); "
                             "on a busy machine fewer are far less disturbed, as for run --threads")


def ncu_lines(ncu: NcuResult) -> str:
    """ncu's kernels, one line each with their readings (% of peak); or one line saying why there are none."""
    from harness.profiling.ncu import NCU_READINGS, ncu_readings

    if ncu.why_not is not None:
        return f"ncu: {ncu.why_not}"
    out = [f"ncu metrics (% of peak): kernel, {', '.join(NCU_READINGS)}"]
    for k in ncu.kernels:
        # By name: ncu's details page lists a kernel's metrics alphabetically, not in the order asked.
        values = "  ".join("-" if v is None else f"{v:5.1f}" for v in ncu_readings(k).values())
        out.append(f"  {k.kernel[:70]:<70}  {values}")
    return "\n".join(out)


def format_profile(result: ProfileResult, threads: int | None = None) -> str:
    """The text `attnbench profile` prints: the median and verdict (and the CPU threads, when known), the table, ncu's lines if asked."""
    verdict = {True: "agrees", False: "DISAGREES", None: "not checked"}[result.agree]
    where = result.case.device + (f", {threads} thread{'s' if threads != 1 else ''}" if threads is not None else "")
    lines = [f"{result.case.id} on {result.backend} ({where}): harness median {result.median_s * 1e3:.4g} ms, "
             f"{verdict} with the float64 reference", result.profile.format_table(result.median_s)]
    if result.ncu is not None:
        lines.append(ncu_lines(result.ncu))
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile one pair and print where its time goes."""
    import torch

    from harness.cli.stability import case_from_args
    from harness.env import resolve_device
    from harness.measure.threads import apply_threads
    from harness.results.run_options import check_threads
    from harness.run.profile_pair import run_profile

    check_threads(args.threads)  # run --threads' rule, before a case is built or a folder made
    case = case_from_args(args, resolve_device(args.device))
    if args.profile_mode:
        case = case.replace(mode=args.profile_mode)
    before = torch.get_num_threads()
    try:  # the pair is profiled in this process: its thread count is put back after, for a caller that goes on (a test)
        threads = apply_threads(args.threads)
        result = run_profile(case, args.backend, args.steps, Path(args.out), args.ncu)
    finally:
        torch.set_num_threads(before)
    print(format_profile(result, threads if case.device == "cpu" else None))
    sys.stdout.flush()
    return 0
