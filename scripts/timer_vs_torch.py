"""Compare the harness's median with torch.utils.benchmark's blocked_autorange, in one process, in alternation.

    python scripts/timer_vs_torch.py [--rounds 5]

Case: sdpa, B=1, H=8, S=1024, d_k=64, fp32, CPU. Both timers see the same callable and the same
thread count (torch.utils.benchmark defaults to one thread; it is set to torch's current count).
Prints each pair of medians and the ratio of their medians.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tub

from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from harness.measure.timing import Budget, measure


def main() -> None:
    """Alternate the two timers and print the ratio of the harness's median to blocked_autorange's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    case = Case(B=1, S_q=1024, S_kv=1024, H=8, H_kv=8, d_k=64, d_v=64, dtype="fp32")
    prepared = load_registry().get("sdpa").prepare(case, make_inputs(case))
    fn = prepared.fn
    budget = Budget(warmup_s=0.1, measure_s=1.0)
    timer = tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    ours, theirs = [], []
    with torch.no_grad():
        for i in range(args.rounds):
            harness_ms = measure(fn, budget=budget).stats.median * 1e3
            torch_ms = timer.blocked_autorange(min_run_time=1.0).median * 1e3
            ours.append(harness_ms)
            theirs.append(torch_ms)
            print(f"round {i + 1}: harness {harness_ms:.4f} ms   blocked_autorange {torch_ms:.4f} ms   ratio {harness_ms / torch_ms:.4f}")
    print(f"threads {torch.get_num_threads()}; median ratio harness / blocked_autorange = {statistics.median(ours) / statistics.median(theirs):.4f}")


if __name__ == "__main__":
    main()
