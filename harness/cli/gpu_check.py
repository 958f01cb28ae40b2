"""`make gpu-check`: every available backend on a small grid on one CUDA GPU, checked and timed, in minutes.

Meant for a CUDA machine without network and with only what is installed there (python3 with a
CUDA torch, and whatever attention libraries the box has): it runs from the checkout with
`python3 -m harness gpu-check`, needs no pip install, and uses neither pytest nor pandas.

Each backend runs in its own child process (a kernel that kills its process, or leaves a sticky
CUDA error, costs that backend only) over: fwd and bwd, causal and not, GQA at S = 1024, d_k 128,
bf16; MHA at d_k 64; a padded batch (varlen); decoding against a 4 Ki cache; DeepSeek's absorbed MLA.
Backends that compile each case (flex, naive-compiled) run COMPILING_CASES, 3 of them, first, so
that every backend's estimate fits the budget (gpu_check_plan). Every output and gradient is
checked against the float64 reference; a short table comes last. Each child also measures the
clock's fixed overhead per sample (an almost empty kernel), which single-kernel pairs are judged with.
Exit 0 when every pair that ran agrees, 1 when one disagrees or fails (or a backend was skipped because
the 270 s budget could not hold it), 2 when there is no CUDA device.
`--cpu` runs the same on the CPU with tiny shapes, for testing the command itself.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Sequence

from harness.cli.gpu_check_plan import MIN_CHILD_S, compiles, estimate_s, plan_schedule
from harness.errors import UserError
from harness.measure.cuda_clock import FixedOverhead
from harness.measure.timing import Budget
from harness.results.record import NOT_FAILURES, Record, Status
from harness.run.children import child_command, emit, run_child
from harness.suite.cases import Case

#: Short measurements: this is a check that kernels run and agree, with a rough time beside it.
CHECK_BUDGET = Budget(warmup_s=0.01, measure_s=0.03, min_sample_s=0.0, min_rounds=3, max_rounds=50)
#: The whole check's budget: `make gpu-check` must finish within 5 minutes. A backend the budget
#: cannot hold is reported `skipped` (counted as a failure: it was not checked), never silently passed.
TOTAL_BUDGET_S = 270.0
#: How far a single-kernel pair's harness median, less the fixed overhead, may be from the profiler's kernel time (3 %).
TIMER_TOLERANCE = 0.03
#: Which of check_cases a compiling backend runs: a forward (MHA), a backward (GQA), a padded batch (GQA).
COMPILING_CASES = (4, 3, 5)
#: Profiled calls of the empty kernel whose kernel time is subtracted from its between-readings time.
OVERHEAD_PROFILE_STEPS = 20
#: The key of the object a child prints when its fixed overhead could not be measured.
OVERHEAD_ERROR = "fixed_overhead_error"


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


def cases_for(family: str, device: str) -> list[Case]:
    """The cases a backend of `family` runs: all of check_cases, or COMPILING_CASES when each case compiles for seconds."""
    cases = check_cases(device)
    return [cases[i] for i in COMPILING_CASES] if compiles(family) else cases


def run_backend(name: str, device: str) -> list[Record]:
    """Run a backend's check cases in this process, through one runner (the cases share nothing but its budget)."""
    from harness.backends.registry import load_registry
    from harness.execution.execute import PairRunner, Phases, execute

    backend = load_registry().get(name)
    # The profiled pass gives each pair's kernel time, the reference the harness's median is held to; no energy
    # phase (up to 1 s a pair), which the cost model (CASE_S, gpu_check_plan.py) was not fitted with.
    runner = PairRunner(budget=CHECK_BUDGET, phases=Phases(profile=True, profile_steps=10, energy=False))
    return [execute(case, backend, runner, run_id="gpu-check") for case in cases_for(backend.family, device)]


def measure_box_overhead(device: str) -> FixedOverhead:
    """This device's fixed overhead per sample: a one-element add through the pairs' clock and flush, less its profiled kernel time."""
    import torch

    from harness.measure.cuda_clock import measure_fixed_overhead
    from harness.profiling.profile import profile_step
    from harness.measure.timers import device_clock

    clock, flush, _ = device_clock(device)
    one = torch.zeros(1, device=device)

    def empty_step() -> None:
        one.add_(1.0)  # one launch of the cheapest real kernel: an elementwise op on one element

    def kernel_time_s(step) -> float:
        return profile_step(step, device, steps=OVERHEAD_PROFILE_STEPS).kernel_time_s

    return measure_fixed_overhead(empty_step, clock, kernel_time_s, setup=flush)


def _whole_backend(name: str, status: Status, reason: str) -> Row:
    return Row(name, "*", status, None, None, reason)


def _child(name: str, device: str, timeout_s: float) -> list[Row]:
    """One backend in a child process; a crash or a hang becomes a row that says so."""
    done = run_child(child_command("gpu-check", name, "--device", device), timeout_s)
    if done.timed_out:
        return [_whole_backend(name, Status.TIMEOUT, f"over {timeout_s:.0f} s")]
    if not done.ok:
        return [_whole_backend(name, Status.CRASHED, done.describe())]
    for obj in done.objects:
        if OVERHEAD_ERROR in obj:
            print(f"  {name}: the fixed overhead could not be measured ({obj[OVERHEAD_ERROR]}); its timers are not judged", flush=True)
    return rows_of(name, done.objects)


def rows_of(name: str, objects: Sequence[dict]) -> list[Row]:
    """A child's printed objects as rows: its records, each carrying the fixed overhead the child measured (if it printed one)."""
    overheads = [FixedOverhead.from_dict(obj["fixed_overhead"]) for obj in objects if "fixed_overhead" in obj]
    records = [Record.from_dict(obj, where=f"gpu-check child of {name}") for obj in objects
               if "fixed_overhead" not in obj and OVERHEAD_ERROR not in obj]
    rows = [Row.of(record) for record in records]
    if not overheads:
        return rows
    ms, spread_ms = overheads[-1].seconds * 1e3, overheads[-1].spread_s * 1e3
    return [dataclasses.replace(row, overhead_ms=ms, overhead_spread_ms=spread_ms) for row in rows]


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
    #: The clock's fixed overhead per sample, measured by this pair's child, and half its 95 % interval.
    overhead_ms: float | None = None
    overhead_spread_ms: float = 0.0

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
    def net_ratio(self) -> float | None:
        """(Harness median − fixed overhead) ÷ profiled kernel time: 1.0 when the timer adds nothing but the box's fixed cost."""
        if self.ms is None or not self.kernel_ms or self.overhead_ms is None:
            return None
        return (self.ms - self.overhead_ms) / self.kernel_ms

    @property
    def timer_off(self) -> bool:
        """On CUDA, a single-kernel pair whose median is off its kernel time plus the fixed overhead by more than TIMER_TOLERANCE.

        Every sample between events carries the box's fixed overhead (about 4 µs on the H200: a
        healthy 12.7 µs decode kernel reads 16.5 µs), so the median is held to kernel + overhead,
        within 3 % of the kernel time plus the overhead's own uncertainty (half its 95 % interval),
        which a residual cannot be told apart from. Without a measured overhead the pair cannot be
        judged and counts as off. Only single-kernel pairs are held to it: with several kernels the
        gaps between them are real time the harness rightly counts. On the CPU operators are not
        kernels: the ratios are shown only.
        """
        single = self.kernels is not None and self.kernels <= 1.0
        if self.device != "cuda" or not single or self.ms is None or not self.kernel_ms:
            return False
        if self.overhead_ms is None:
            return True
        residual = self.ms - self.kernel_ms - self.overhead_ms
        return abs(residual) > TIMER_TOLERANCE * self.kernel_ms + self.overhead_spread_ms

    @property
    def failed(self) -> bool:
        """Neither ok nor honestly unsupported, ok but disagreeing, or timed off its kernel time."""
        return self.status not in NOT_FAILURES or self.agree is False or self.timer_off


def _timer_note(off: Sequence[Row]) -> str:
    """Why the worst of a backend's timer-off pairs is off: its net ratio, or no overhead to judge it with."""
    unjudged = [r for r in off if r.overhead_ms is None]
    if unjudged:
        return f"timer not judged on {unjudged[0].case}: its child measured no fixed overhead"
    worst = max(off, key=lambda r: abs(r.net_ratio - 1))
    return (f"timer {worst.net_ratio:.3f}x the kernel time on {worst.case} after the {worst.overhead_ms * 1e3:.1f} µs fixed overhead "
            f"(more than {TIMER_TOLERANCE:.0%} off)")


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(rows: Sequence[Row]) -> str:
    """Per backend: pairs ok / agreeing / unsupported / failed, the first ok case's times and ratios, and the first problem."""
    out = [f"{'backend':<16} {'ok':>3} {'agree':>5} {'unsup':>5} {'fail':>4}  {'first ok case':<44} {'ms':>9} {'kernel ms':>9} "
           f"{'ratio':>6} {'net':>6}  note"]
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
            note = _timer_note(off)
        elif problem is not None:
            note = f"{problem.status}{' (disagrees)' if problem in bad else ''} on {problem.case}: {(problem.reason or 'no reason given')[:110]}"
        elif not ok and mine:
            note = f"unsupported: {(mine[0].reason or '')[:90]}"
        else:
            note = ""
        times = [_number(first and first.ms, 3), _number(first and first.kernel_ms, 3)]
        ratios = [_number(first and first.timer_ratio, 3), _number(first and first.net_ratio, 3)]
        out.append(f"{name:<16} {len(ok):>3} {agree:>5} {unsup:>5} {len(failed):>4}  {(first.case if first else '-'):<44} "
                   f"{times[0]:>9} {times[1]:>9} {ratios[0]:>6} {ratios[1]:>6}  {note}")
    return "\n".join(out)


def backend_job(argv: Sequence[str]) -> int:
    """The `gpu-check` child job: one backend's records, then the fixed overhead its pairs are judged with (CUDA, when one ran).

    Not on the CPU: there the profiler's operator time carries the profiler's own cost per operator,
    more than a one-element add takes, so the difference says nothing (and CPU pairs are not judged).
    """
    from harness.child import job_parser

    parser = job_parser("gpu-check", "one backend's gpu-check cases, for `attnbench gpu-check`")
    parser.add_argument("backend")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        require_cuda()
    records = run_backend(args.backend, args.device)
    for record in records:
        emit(record.to_dict())
    if args.device == "cuda" and any(record.status is Status.OK for record in records):
        try:
            emit({"fixed_overhead": measure_box_overhead(args.device).to_dict()})
        except Exception as exc:  # noqa: BLE001 - the pairs' verdicts stand; their timers go unjudged, and the parent says why
            emit({OVERHEAD_ERROR: f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"})
    return 0


def require_cuda() -> None:
    """Refuse (a UserError: exit 2) on a machine where torch sees no CUDA device: there is nothing to check."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"no CUDA device is present (torch {torch.__version__} sees none): gpu-check has nothing to check")


def _report_child(name: str, mine: Sequence[Row], seconds: float) -> None:
    """The progress lines of one finished child: counts, its fixed overhead, and each problem pair."""
    ok = sum(1 for r in mine if r.status is Status.OK)
    unsupported = sum(1 for r in mine if r.status is Status.UNSUPPORTED)
    measured = next((r for r in mine if r.overhead_ms is not None), None)
    overhead = f"; fixed overhead {measured.overhead_ms * 1e3:.2f} ± {measured.overhead_spread_ms * 1e3:.2f} µs a sample" if measured else ""
    print(f"  {name}: {ok} ok, {unsupported} unsupported in {seconds:.0f} s{overhead}", flush=True)
    for r in mine:
        if r.timer_off and r.status is Status.OK and r.agree is not False:
            print(f"    {r.case}: {_timer_note([r])}: median {r.ms:.4f} ms, kernel {r.kernel_ms:.4f} ms", flush=True)
        elif r.failed:
            print(f"    {r.case}: {r.status}{' disagrees' if r.agree is False else ''}: {r.reason or 'no reason given'}", flush=True)


def _skip(name: str, reason: str) -> Row:
    print(f"  {name}: skipped ({reason})", flush=True)
    return _whole_backend(name, Status.SKIPPED, reason)


def run_gpu_check(cpu: bool, backends: Sequence[str] | None) -> int:
    """`attnbench gpu-check [--cpu] [--backends a,b]`: run, print the table last, exit 0/1 (a UserError, exit 2, without CUDA)."""
    import torch

    device = "cpu" if cpu else "cuda"
    if device == "cuda":
        require_cuda()
    from harness.backends.registry import load_registry

    registry = load_registry()
    names = list(backends) if backends else registry.names()
    families = {name: registry.get(name).family for name in names}
    schedule = plan_schedule([(n, families[n], estimate_s(families[n], cases_for(families[n], device))) for n in names], TOTAL_BUDGET_S)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--cpu)"
    print(f"gpu-check on {where}, torch {torch.__version__}: {len(check_cases(device))} cases × {len(names)} backends", flush=True)
    compiling = [n for n in names if compiles(families[n])]
    if compiling:
        print(f"  {', '.join(compiling)}: each case compiles, so run first, on {len(COMPILING_CASES)} of the {len(check_cases(device))} cases",
              flush=True)
    started = time.monotonic()
    left_out = [_skip(name, reason) for name, reason in schedule.skipped]
    rows: list[Row] = []
    for index, slot in enumerate(schedule.slots):
        t0 = time.monotonic()
        timeout_s = schedule.timeout_s(index, t0 - started)
        if timeout_s < MIN_CHILD_S:
            rows.append(_skip(slot.name, f"not run: {timeout_s:.0f} s was left for it, under the {MIN_CHILD_S:.0f} s a child needs; "
                                         f"check it alone with --backends {slot.name}"))
            continue
        mine = _child(slot.name, device, timeout_s)
        rows += mine
        _report_child(slot.name, mine, time.monotonic() - t0)
    rows += left_out
    print(f"\n{len(rows)} pairs in {time.monotonic() - started:.0f} s")
    measured = sorted({r.overhead_ms for r in rows if r.overhead_ms is not None})
    if measured:
        print(f"fixed overhead a sample between events, as the children measured it: {measured[0] * 1e3:.2f}–{measured[-1] * 1e3:.2f} µs")
    print(format_table(rows))
    failed = [r for r in rows if r.failed]
    return 1 if failed else 0
