"""`attnbench gpu-check`'s engine: every available backend on a small grid on one CUDA GPU, checked and timed, in minutes.

Meant for a CUDA machine without network and with only what is installed there (python3 with a
CUDA torch, and whatever attention libraries the box has): it runs from the checkout with
`python3 -m harness gpu-check`, needs no pip install, and uses neither pytest nor pandas.

Each backend runs in its own child process (a kernel that kills its process, or leaves a sticky
CUDA error, costs that backend only) over: fwd and bwd, causal and not, GQA at S = 1024, d_k 128,
bf16; MHA at d_k 64; a padded batch (varlen); decoding against a 4 Ki cache; DeepSeek's absorbed MLA; and, so that a
first GPU run reaches them (PATHS), FP8 Q/K/V and an FP8 KV-cache decode, sinks in a window, softcap, ALiBi, a paged
MLA decode, and the train suite's packed-documents backward with its deterministic twin. A backend's estimate counts
only the cases it does not refuse by declaration (`declared_refusal`): those are answered in no time.
Backends that compile each case (flex, naive-compiled) run COMPILING_CASES, 3 of them, first, so
that every backend's estimate fits the budget (gpu_plan). Every output and gradient is
checked against the float64 reference. Each child also measures the clock's fixed overhead per
sample (an almost empty kernel), which single-kernel pairs are judged with. A backend the 345 s
budget could not hold is a `skipped` row, which fails the check. The table and the exit status
are harness/cli/gpu_check.py's; `--cpu` runs the same on the CPU with tiny shapes, for testing the command itself.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from harness.checks.gpu_plan import MIN_CHILD_S, Schedule, compiles, estimate_s, plan_schedule
from harness.errors import UserError
from harness.measure.cuda_clock import FixedOverhead
from harness.measure.timing import Budget
from harness.process import forkserver
from harness.process.children import emit
from harness.process.jobs import job_parser
from harness.results.record import NOT_FAILURES, Record, Status
from harness.suite.batch_axes import ragged_cases
from harness.suite.cases import Case

if TYPE_CHECKING:  # the backends import torch: the parent process of gpu-check's children does not need them
    from harness.backends.base import Backend

# -- the grid: the cases every backend's child runs, and what a backend declares it cannot serve ----------------------

#: The train suite's packed documents (suites/train.py DOCUMENTS): 16 on a heavy tail from 256 to 8 Ki tokens.
TRAIN_DOCUMENTS = "longtail(256,8192,1.1)"


def check_cases(device: str) -> list[Case]:
    """The grid: realistic but small on CUDA, tiny on the CPU (--cpu); `PATHS` names the cases past the first eight."""
    if device == "cuda":
        B, S, H, H_kv, d, dtype, L, mla, window = 2, 1024, 16, 4, 128, "bf16", 4096, (128, 576, 512), 128
        mla_paged, documents, train = (16, 576, 512, "2x1@uniform(1024,4096)"), TRAIN_DOCUMENTS, {"B": 16, "H": 32, "H_kv": 8, "d_k": 128}
    else:
        B, S, H, H_kv, d, dtype, L, mla, window = 2, 64, 4, 2, 32, "bf16", 256, (8, 72, 64), 32
        mla_paged, documents, train = (8, 72, 64, "2x1@uniform(32,200)"), "longtail(8,128)", {"B": 6, "H": 4, "H_kv": 2, "d_k": 32}
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
    gqa = {"B": B, "S_q": S, "S_kv": S, "H": H, "H_kv": H_kv, "d_k": d, "d_v": d, "device": device}
    cases += [
        # FP8: all-FP8 Q, K, V (FA3's FP8 kernel, eager-fp8) and bf16 queries over an FP8 KV cache (FlashInfer's decode).
        Case(**gqa, dtype="fp8_e4m3", causal=True),
        Case(B=B, S_q=1, S_kv=L, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, kv_dtype="fp8_e4m3"),
        # Score variants, gpt-oss's sinks in a sliding window, Gemma's softcap, ALiBi.
        Case(**gqa, dtype=dtype, causal=True, sinks=True, window=window),
        Case(**gqa, dtype=dtype, causal=True, softcap=50.0),
        Case(**gqa, dtype=dtype, causal=True, alibi=True),
    ]
    # MLA decode over a paged latent cache (FlashMLA's 64-token pages; DeepSeek-V3's heads at TP 8): flashmla, flashinfer-mla, mla.
    cases += ragged_cases([mla_paged[3]], ("paged",), page_sizes=(64,), H=mla_paged[0], H_kv=1, d_k=mla_paged[1], d_v=mla_paged[2],
                          mla=True, causal=True, dtype=dtype, device=device)
    # The train suite's packed-documents backward, and its deterministic twin.
    (packed,) = ragged_cases([documents], ("packed",), dtype=dtype, causal=True, device=device, **train)
    cases += [packed.replace(mode="bwd"), packed.replace(mode="bwd", deterministic=True)]
    return cases


#: What each case past the first eight reaches: its index in check_cases and the backends whose path it is (a test holds each
#: of those exists and serves the case, by its own `supports`, on the CUDA grid).
PATHS = {
    "fp8 q/k/v": (8, ("flash-attn3", "eager-fp8")),
    "fp8 kv cache decode": (9, ("flashinfer", "naive")),
    "sinks + window": (10, ("flash-attn4", "naive")),
    "softcap": (11, ("flash-attn2", "flash-attn3", "flash-attn4", "flashinfer", "naive")),
    "alibi": (12, ("sdpa", "flash-attn2", "flashinfer", "naive")),
    "paged mla decode": (13, ("flashmla", "flashinfer-mla", "mla")),
    "packed backward": (14, ("flash-attn2", "flash-attn3", "flash-attn4", "sdpa")),
    "deterministic packed backward": (15, ("flash-attn2", "flash-attn3", "flash-attn4")),
}


def declared_refusal(backend, case: Case) -> str | None:
    """Why `backend` declares it cannot serve `case` (every feature of harness.backends.features it lacks: no import), or None.

    Such a pair is answered unsupported in well under a second, so gpu-check's cost model counts only the others.
    """
    from harness.backends.features import feature_refusals, joined

    return joined(feature_refusals(backend, case))


# -- the check ------------------------------------------------------------------------------------------------------

#: Short measurements: this is a check that kernels run and agree, with a rough time beside it.
CHECK_BUDGET = Budget(warmup_s=0.01, measure_s=0.03, min_sample_s=0.0, min_rounds=3, max_rounds=50)
#: The whole check's budget: `make gpu-check` must finish within 6 minutes (19 backends × 16 cases, each backend's
#: estimate counting only the cases it does not refuse by declaration: 331 s at most, a child with no library ~6 s). A backend the budget
#: cannot hold is reported `skipped` (counted as a failure: it was not checked), never silently passed.
TOTAL_BUDGET_S = 345.0
#: How far a single-kernel pair's harness median, less the fixed overhead, may be from the profiler's kernel time (3 %).
TIMER_TOLERANCE = 0.03
#: Which of check_cases a compiling backend runs: a forward (MHA), a backward (GQA), a padded batch (GQA).
COMPILING_CASES = (4, 3, 5)
#: Profiled calls of the empty kernel whose kernel time is subtracted from its between-readings time.
OVERHEAD_PROFILE_STEPS = 20
#: The key of the object a child prints when its fixed overhead could not be measured.
OVERHEAD_ERROR = "fixed_overhead_error"


def cases_for(family: str, device: str) -> list[Case]:
    """The cases a backend of `family` runs: all of check_cases, or COMPILING_CASES when each case compiles for seconds."""
    cases = check_cases(device)
    return [cases[i] for i in COMPILING_CASES] if compiles(family) else cases


def run_backend(backend: Backend, device: str, after_pair: Callable[[], None] = lambda: None) -> list[Record]:
    """Run a backend's check cases in this process, through one runner (the cases share nothing but its budget).

    `after_pair` runs once before the first pair and again after each pair (a child job passes `gc.freeze`)."""
    from harness.execution.execute import PairRunner, Phases, execute

    # The profiled pass gives each pair's kernel time, the reference the harness's median is held to; no energy
    # phase (up to 1 s a pair), which the cost model (CASE_S, gpu_plan.py) was not fitted with.
    runner = PairRunner(budget=CHECK_BUDGET, phases=Phases(profile=True, profile_steps=10, energy=False))
    records = []
    after_pair()
    for case in cases_for(backend.family, device):
        records.append(execute(case, backend, runner, run_id="gpu-check"))
        after_pair()
    return records


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
    """One backend in a child process (on a CPU forked from a worker template, as a CPU run's workers are); a crash or a
    hang becomes a row that says so."""
    done = forkserver.run_job(["gpu-check", name, "--device", device], os.environ, timeout_s, fork=device == "cpu")
    if done.timed_out:
        return [_whole_backend(name, Status.TIMEOUT, f"over {timeout_s:.0f} s")]
    if not done.ok:
        return [_whole_backend(name, Status.CRASHED, done.describe())]
    return rows_of(name, done.objects)


def rows_of(name: str, objects: Sequence[dict]) -> list[Row]:
    """A child's printed objects as rows: its records, each carrying the fixed overhead the child measured (or why it could not)."""
    errors = [obj[OVERHEAD_ERROR] for obj in objects if OVERHEAD_ERROR in obj]
    overheads = [FixedOverhead.from_dict(obj["fixed_overhead"]) for obj in objects if "fixed_overhead" in obj]
    records = [Record.from_dict(obj, where=f"gpu-check child of {name}") for obj in objects
               if "fixed_overhead" not in obj and OVERHEAD_ERROR not in obj]
    rows = [Row.of(record) for record in records]
    if errors:
        rows = [dataclasses.replace(row, overhead_error=errors[-1]) for row in rows]
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
    #: Why the child could not measure that overhead (its pairs' timers then go unjudged).
    overhead_error: str | None = None

    @classmethod
    def of(cls, record: Record) -> "Row":
        """The row of one pair's record."""
        return cls(record.backend, record.case_id, record.status, record.agree, record.latency_ms_median, record.reason,
                   record.profile_kernel_ms_per_step, record.profile_kernels_per_step, record.case.device)

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


def backend_job(argv: Sequence[str]) -> int:
    """The `gpu-check` child job: one backend's records, then the fixed overhead its pairs are judged with (CUDA, when one ran).

    Not on the CPU: there the profiler's operator time carries the profiler's own cost per operator,
    more than a one-element add takes, so the difference says nothing (and CPU pairs are not judged).
    """
    parser = job_parser("gpu-check", "one backend's gpu-check cases, for `attnbench gpu-check`")
    parser.add_argument("backend")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        require_cuda()
    from harness.backends.determinism import cublas_workspace_for
    from harness.backends.registry import load_registry

    backend = load_registry().get(args.backend)
    # The packed backward's deterministic twin needs cuBLAS's workspace setting before this process's first cuBLAS call.
    for name, value in cublas_workspace_for(cases_for(backend.family, args.device)).items():
        os.environ.setdefault(name, value)
    # Each pair ends in two full collections (execute._release_memory, the memory phase): with torch's imports frozen
    # they walk only what the pair made, not 0.17 s of modules each (4.9 of a CPU child's 11.7 CPU-s).
    records = run_backend(backend, args.device, after_pair=gc.freeze)
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


@dataclass(frozen=True)
class GpuCheckPlan:
    """The backends gpu-check will run on `device`, their families, and the schedule of their children."""

    device: str
    names: tuple[str, ...]
    families: dict[str, str]
    schedule: Schedule

    @property
    def compiling(self) -> list[str]:
        """The backends whose every case compiles (run first, on COMPILING_CASES only)."""
        return [n for n in self.names if compiles(self.families[n])]


@dataclass(frozen=True)
class BackendTurn:
    """One backend's turn, as it ends: its rows, its child's seconds, and why it was skipped (None when it ran)."""

    name: str
    rows: tuple[Row, ...]
    seconds: float = 0.0
    skipped: str | None = None


@dataclass(frozen=True)
class GpuCheckResult:
    """Every row of a gpu-check, in the order the table shows them, and the seconds it took."""

    rows: tuple[Row, ...]
    seconds: float

    @property
    def failed(self) -> bool:
        """Some pair failed, disagreed, was off its kernel time, or was not run."""
        return any(r.failed for r in self.rows)


def plan_gpu_check(device: str, backends: Sequence[str] | None) -> GpuCheckPlan:
    """The backends (default: every registered one) and their schedule in TOTAL_BUDGET_S; UserError on cuda without CUDA."""
    if device == "cuda":
        require_cuda()
    from harness.backends.registry import load_registry

    registry = load_registry()
    names = tuple(backends) if backends else tuple(registry.names())
    families = {name: registry.get(name).family for name in names}
    served = {n: [c for c in cases_for(families[n], device) if declared_refusal(registry.get(n), c) is None] for n in names}
    schedule = plan_schedule([(n, families[n], estimate_s(families[n], served[n])) for n in names], TOTAL_BUDGET_S)
    return GpuCheckPlan(device, names, families, schedule)


def run_gpu_check(plan: GpuCheckPlan, on_turn: Callable[[BackendTurn], None] | None = None) -> GpuCheckResult:
    """Run the plan's children one after another, each bounded by what the budget has left; `on_turn` hears of each as it ends."""
    def turn(done: BackendTurn) -> tuple[Row, ...]:
        if on_turn is not None:
            on_turn(done)
        return done.rows

    def skip(name: str, reason: str) -> tuple[Row, ...]:
        return turn(BackendTurn(name, (_whole_backend(name, Status.SKIPPED, reason),), skipped=reason))

    started = time.monotonic()
    left_out = [row for name, reason in plan.schedule.skipped for row in skip(name, reason)]
    rows: list[Row] = []
    for index, slot in enumerate(plan.schedule.slots):
        t0 = time.monotonic()
        timeout_s = plan.schedule.timeout_s(index, t0 - started)
        if timeout_s < MIN_CHILD_S:
            rows += skip(slot.name, f"not run: {timeout_s:.0f} s was left for it, under the {MIN_CHILD_S:.0f} s a child needs; "
                                    f"check it alone with --backends {slot.name}")
            continue
        mine = _child(slot.name, plan.device, timeout_s)
        rows += turn(BackendTurn(slot.name, tuple(mine), time.monotonic() - t0))
    return GpuCheckResult(tuple(rows + left_out), time.monotonic() - started)
