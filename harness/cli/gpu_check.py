"""`make gpu-check`: every available backend on a small grid on one CUDA GPU, checked and timed, in minutes.

Meant for a CUDA machine without network and with only what is installed there (python3 with a
CUDA torch, and whatever attention libraries the box has): it runs from the checkout with
`python3 -m harness gpu-check`, needs no pip install, and uses neither pytest nor pandas.

Each backend runs in its own child process (a kernel that kills its process, or leaves a sticky
CUDA error, costs that backend only) over: fwd and bwd, causal and not, GQA at S = 1024, d_k 128,
bf16; MHA at d_k 64; a padded batch (varlen); decoding against a 4 Ki cache; DeepSeek's absorbed MLA.
Every output and gradient is checked against the float64 reference; a short table comes last.
Exit 0 when every pair that ran agrees, 1 when one disagrees or fails (or a backend was skipped because
the 270 s budget was spent), 2 when there is no CUDA device.
`--cpu` runs the same on the CPU with tiny shapes, for testing the command itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from harness.measure.timing import Budget
from harness.results.record import NOT_FAILURES, Record, Status
from harness.run.children import emit, python_command, run_child
from harness.suite.cases import Case

#: Short measurements: this is a check that kernels run and agree, with a rough time beside it.
CHECK_BUDGET = Budget(warmup_s=0.01, measure_s=0.03, min_sample_s=0.0, min_rounds=3, max_rounds=50)
#: Seconds one backend's child may take (flex compiles each case, about 10–20 s on a GPU).
CHILD_TIMEOUT_S = 180.0
#: The whole check's budget: `make gpu-check` must finish within 5 minutes. Backends that compile
#: (torch.compile, FlexAttention) run last; a backend reached after the budget is spent is reported
#: `skipped` (counted as a failure: it was not checked), never silently passed.
TOTAL_BUDGET_S = 270.0
#: A child is not started with less than this left (python, torch and CUDA start-up alone take seconds).
MIN_CHILD_S = 15.0
COMPILING_FAMILIES = ("flex", "compiled")
#: How far a single-kernel pair's harness median may be from the profiler's kernel time (3 %).
TIMER_TOLERANCE = 0.03


def check_cases(device: str) -> list[Case]:
    """The grid: realistic but small on CUDA, tiny on the CPU (--cpu)."""
    if device == "cuda":
        B, S, H, H_kv, d, dtype, L, mla = 2, 1024, 16, 4, 128, "bf16", 4096, (128, 576, 512)
    else:
        B, S, H, H_kv, d, dtype, L, mla = 2, 64, 4, 2, 32, "bf16", 256, (8, 72, 64)
    cases = [
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, causal=causal, mode=mode)
        for mode in ("fwd", "bwd") for causal in (False, True)
    ]
    cases += [
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H, d_k=d // 2, d_v=d // 2, dtype=dtype, device=device, causal=True),
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, causal=True, padding=True),
        Case(B=B, S_q=1, S_kv=L, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, padding=True),
        Case(B=B, S_q=1, S_kv=L, H=mla[0], H_kv=1, d_k=mla[1], d_v=mla[2], dtype=dtype, device=device, mla=True),
    ]
    return cases


def run_backend(name: str, device: str) -> list[Record]:
    """Run every check case on one backend in this process, through one runner (the cases share nothing but its budget)."""
    from harness.backends.registry import load_registry
    from harness.measure.execute import PairRunner, Phases, execute

    backend = load_registry().get(name)
    # The profiled pass gives each pair's kernel time, the reference the harness's median is held to.
    runner = PairRunner(budget=CHECK_BUDGET, phases=Phases(profile=True, profile_steps=10))
    return [execute(case, backend, runner, run_id="gpu-check") for case in check_cases(device)]


def _whole_backend(name: str, status: Status, reason: str) -> Row:
    return Row(name, "*", status, None, None, reason)


def _child(name: str, device: str, timeout_s: float = CHILD_TIMEOUT_S) -> list[Row]:
    """One backend in a child process; a crash or a hang becomes a row that says so."""
    done = run_child(python_command("harness", "gpu-check", "--one", name, *(["--cpu"] if device == "cpu" else [])), timeout_s)
    if done.timed_out:
        return [_whole_backend(name, Status.TIMEOUT, f"over {timeout_s:.0f} s")]
    if not done.ok:
        return [_whole_backend(name, Status.CRASHED, done.describe())]
    return [Row.of(Record.from_dict(obj, where=f"gpu-check child of {name}")) for obj in done.objects]


@dataclass(frozen=True)
class Row:
    """What gpu-check shows of one pair (or of a whole backend whose child failed: case `*`)."""

    backend: str
    case: str
    status: Status
    agree: bool | None
    ms: float | None
    reason: str | None
    #: The profiler's kernel time per call (CUDA) or operator time (CPU), and how many per call.
    kernel_ms: float | None = None
    kernels: float | None = None
    device: str = "cuda"

    @classmethod
    def of(cls, record: Record) -> "Row":
        """The row of one pair's record."""
        return cls(record.backend, record.case_id, record.status, record.agree, record.latency_ms_median, record.reason,
                   record.profile_kernel_ms_per_step, record.profile_kernels_per_step, record.device)

    @property
    def timer_ratio(self) -> float | None:
        """Harness median ÷ profiled kernel time (1.0: the timer measures exactly the kernels)."""
        if self.ms is None or not self.kernel_ms:
            return None
        return self.ms / self.kernel_ms

    @property
    def timer_off(self) -> bool:
        """On CUDA, a single-kernel pair whose median is more than TIMER_TOLERANCE from its kernel time.

        Only single-kernel pairs are held to it: with several kernels the gaps between them are real
        time the harness rightly counts. On the CPU operators are not kernels: the ratio is shown only.
        """
        ratio = self.timer_ratio
        single = self.kernels is not None and self.kernels <= 1.0
        return self.device == "cuda" and single and ratio is not None and abs(ratio - 1.0) > TIMER_TOLERANCE

    @property
    def failed(self) -> bool:
        """Neither ok nor honestly unsupported, ok but disagreeing, or timed off its kernel time."""
        return self.status not in NOT_FAILURES or self.agree is False or self.timer_off


def format_table(rows: Sequence[Row]) -> str:
    """Per backend: pairs ok / agreeing / unsupported / failed, the median time of the first ok case, and the first problem."""
    out = [f"{'backend':<16} {'ok':>3} {'agree':>5} {'unsup':>5} {'fail':>4}  {'first ok case':<44} {'ms':>9} {'kernel ms':>9} {'ratio':>6}  note"]
    for name in dict.fromkeys(r.backend for r in rows):
        mine = [r for r in rows if r.backend == name]
        ok = [r for r in mine if r.status is Status.OK]
        agree = sum(1 for r in ok if r.agree is True)
        unsup = sum(1 for r in mine if r.status is Status.UNSUPPORTED)
        failed = [r for r in mine if r.status not in NOT_FAILURES]
        bad = [r for r in ok if r.agree is False]
        first = ok[0] if ok else None
        problem = (failed or bad or [None])[0]
        off = [r for r in ok if r.timer_off]
        if problem is None and off:
            worst = max(off, key=lambda r: abs(r.timer_ratio - 1))
            note = f"timer {worst.timer_ratio:.3f}x the kernel time on {worst.case} (more than {TIMER_TOLERANCE:.0%} off)"
        elif problem is not None:
            note = f"{problem.status}{' (disagrees)' if problem in bad else ''} on {problem.case}: {(problem.reason or 'no reason given')[:80]}"
        elif not ok and mine:
            note = f"unsupported: {(mine[0].reason or '')[:90]}"
        else:
            note = ""
        ms = f"{first.ms:.3f}" if first and first.ms is not None else "-"
        kernel = f"{first.kernel_ms:.3f}" if first and first.kernel_ms is not None else "-"
        ratio = f"{first.timer_ratio:.3f}" if first and first.timer_ratio is not None else "-"
        out.append(f"{name:<16} {len(ok):>3} {agree:>5} {unsup:>5} {len(failed):>4}  {(first.case if first else '-'):<44} {ms:>9} {kernel:>9} {ratio:>6}  {note}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """`attnbench gpu-check [--cpu] [--backends a,b]`: run, print the table last, exit 0/1 (2 without CUDA)."""
    parser = argparse.ArgumentParser(prog="attnbench gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU with tiny shapes (to test the command)")
    parser.add_argument("--backends", help="comma-separated backend names (default: every registered one)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"attnbench gpu-check: no CUDA device is present (torch {torch.__version__} sees none); nothing to check", file=sys.stderr)
        return 2
    if args.one:
        for record in run_backend(args.one, device):
            emit(record.to_dict())
        return 0
    from harness.backends.registry import load_registry

    registry = load_registry()
    names = args.backends.split(",") if args.backends else registry.names()
    compiling = {name for name in names if registry.get(name).family in COMPILING_FAMILIES}
    names = [n for n in names if n not in compiling] + [n for n in names if n in compiling]
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--cpu)"
    print(f"gpu-check on {where}, torch {torch.__version__}: {len(check_cases(device))} cases × {len(names)} backends", flush=True)
    started = time.monotonic()
    rows: list[Row] = []
    for name in names:
        t0 = time.monotonic()
        left = TOTAL_BUDGET_S - (t0 - started)
        if left < MIN_CHILD_S:
            reason = f"not run: gpu-check's {TOTAL_BUDGET_S:.0f} s budget was spent; check it alone with --backends {name}"
            rows.append(_whole_backend(name, Status.SKIPPED, reason))
            print(f"  {name}: skipped ({reason})", flush=True)
            continue
        mine = _child(name, device, min(CHILD_TIMEOUT_S, left))
        rows += mine
        ok = sum(1 for r in mine if r.status is Status.OK)
        print(f"  {name}: {ok} ok, {sum(1 for r in mine if r.status is Status.UNSUPPORTED)} unsupported in {time.monotonic() - t0:.0f} s", flush=True)
        for r in mine:
            if r.timer_off and r.status is Status.OK and r.agree is not False:
                print(f"    {r.case}: harness median {r.ms:.4f} ms is {r.timer_ratio:.3f}x the profiled kernel time {r.kernel_ms:.4f} ms", flush=True)
            elif r.failed:
                print(f"    {r.case}: {r.status}{' disagrees' if r.agree is False else ''}: {r.reason or 'no reason given'}", flush=True)
    print(f"\n{len(rows)} pairs in {time.monotonic() - started:.0f} s")
    print(format_table(rows))
    failed = [r for r in rows if r.failed]
    return 1 if failed else 0
