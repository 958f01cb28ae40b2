"""How the profiler's operator time per step compares with the harness's median for the same pair, on a quiet CPU.

    python scripts/profile_overhead.py [--case B1-Sq512-Skv512-H8-Hkv8-dk64-fp32] [--backend naive] [--rounds 11]

A figure of this machine's speed, not a property of the code: it lives here, not in `make test`. The machine
is shared and its load moves a step's time by 2x within seconds, so a harness median taken once and a profile
taken later compare two different machines. Each round takes a short harness median and then a short
profiled pass, and the rounds in which another process took the CPU (the harness's own contention evidence:
run-queue waits over the round) are set apart. Prints each round's ratio and the median of the quiet ones
(expected within about 15 % of 1 on an idle machine: the profiler adds little to operators this size).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.backends.registry import load_registry
from harness.execution.execute import build_step
from harness.measure.contention import CpuProbe, contention
from harness.measure.timing import Budget, measure
from harness.profiling.profile import profile_step
from harness.suite.cases import parse_case_id
from harness.suite.inputs import make_inputs


def pair_step(backend_name: str, case_id: str):
    """The zero-argument step the harness times for a pair, built as the pair executor builds it."""
    case = parse_case_id(case_id)
    inputs = make_inputs(case)
    if case.mode != "fwd":
        for t in (inputs.q, inputs.k, inputs.v):
            t.requires_grad_(True)
    with torch.set_grad_enabled(case.mode != "fwd"):
        prepared = load_registry(plugins=False).get(backend_name).prepare(case, inputs)
        step = build_step(case, prepared, inputs)

    def run():
        with torch.set_grad_enabled(case.mode != "fwd"):
            return step()

    return run


def paired_ratios(step, rounds: int) -> tuple[list[float], list[float]]:
    """Per round, the profiled pass's median operator time per step over the harness median just before it: (quiet, contended)."""
    probe = CpuProbe()
    quiet, contended = [], []
    for _ in range(rounds):
        before = probe.read()
        median = measure(step, time.perf_counter, Budget(warmup_s=0.02, measure_s=0.1)).stats.median
        summary = profile_step(step, "cpu", steps=5, warmup=1)
        loaded = contention(before, probe.read(), probe.threads()).get("contended")
        (contended if loaded else quiet).append(statistics.median(summary.step_kernel_time_s) / median)
    return quiet, contended


def main() -> None:
    """Measure and print the profiler's operator time over the harness median, round by round."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="B1-Sq512-Skv512-H8-Hkv8-dk64-fp32")
    parser.add_argument("--backend", default="naive")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1: a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet, contended = paired_ratios(pair_step(args.backend, args.case), args.rounds)
    print(f"{args.backend} {args.case}: operator sum / harness median, quiet rounds {[round(r, 3) for r in quiet]}, "
          f"contended rounds set apart {[round(r, 3) for r in contended]}")
    if quiet:
        print(f"median of {len(quiet)} quiet rounds: {statistics.median(quiet):.3f}")
    else:
        print("every round was contended: run it again on a quiet machine")


if __name__ == "__main__":
    main()
