"""Run one (case, backend) pair end to end and turn whatever happens into a record.

prepare (untimed) → one checked call → timed samples → peak memory. Every outcome is a record:
`ok`, `unsupported` with the backend's reason, `oom`, or `error` with the exception.
"""

from __future__ import annotations

import functools
import gc
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.measure import theory
from harness.backends.base import Backend, Prepared
from harness.suite.cases import Case
from harness.errors import Unsupported
from harness.suite.inputs import AttentionInputs, make_inputs
from harness.measure.memory import measure_peak
from harness.measure.numerics import Agreement, check_backward, check_forward
from harness.results.store import COLUMNS, SCHEMA_VERSION
from harness.measure.timing import QUICK_BUDGET, Budget, Clock, CudaEventClock, L2Flusher, Loop, Measurement, measure


@dataclass(frozen=True)
class Options:
    """How pairs are run: the time budget, whether to check agreement, and who ran them."""

    budget: Budget = QUICK_BUDGET
    check: bool = True
    run_id: str = ""
    worker: str = "0"


def case_columns(case: Case) -> dict[str, Any]:
    """The record columns that depend on the case alone (its fields and its analytic costs)."""
    flops, nbytes = theory.flops(case), theory.min_bytes(case)
    return {
        "case_id": case.id, **case.fields(), "attention_kind": case.attention_kind,
        "flops": flops, "bytes": nbytes, "kv_cache_bytes": theory.kv_cache_bytes(case),
        "arithmetic_intensity": flops / nbytes,
    }


def base_record(case: Case, backend: Backend, options: Options) -> dict[str, Any]:
    """A record with every schema column, the case's and the backend's filled in and nothing measured (None)."""
    try:
        version = backend.version()
    except Exception:
        version = None
    record = {
        **dict.fromkeys(COLUMNS), **case_columns(case), "backend": backend.name, "family": backend.family, "backend_version": version,
        "run_id": options.run_id, "worker": options.worker, "schema_version": SCHEMA_VERSION,
        "timestamp": time.time(),
    }
    costs = backend.costs(case)
    if costs is not None:  # a backend that times something other than attention (the projections)
        record.update(flops=costs[0], bytes=costs[1], arithmetic_intensity=costs[0] / costs[1])
    return record


@functools.lru_cache(maxsize=1)
def _l2_flusher() -> L2Flusher:
    """One flush buffer per worker process (hundreds of MB: allocated once, not per pair)."""
    return L2Flusher()


def device_clock(device: str) -> tuple[Clock, Callable[[], None] | None, str]:
    """The clock, the between-sample setup (L2 flush on CUDA) and the timer's name for a device."""
    if device.startswith("cuda"):
        return CudaEventClock(), _l2_flusher(), "cuda-event"
    return time.perf_counter, None, "perf_counter"


def build_step(case: Case, prepared: Prepared, inputs: AttentionInputs) -> Callable[[], Any]:
    """The callable to time for the case's mode.

    fwd: the backend's call. bwd: backward alone from one saved forward, each iteration a fresh
    `autograd.grad` (nothing accumulates between iterations). fwd_bwd: both, per iteration.
    """
    if case.mode == "fwd":
        return prepared.fn
    wanted = 3 if prepared.check is None else len(prepared.leaves)  # a backend with its own check names its own leaves
    if not prepared.leaves or len(prepared.leaves) != wanted or not all(t.requires_grad for t in prepared.leaves):
        raise Unsupported("backend did not return differentiable q, k, v leaves")
    leaves = prepared.leaves
    if case.mode == "bwd":
        with torch.enable_grad():
            out = prepared.fn()
        grad_out = prepared.from_bhsd(inputs.grad_out)
        return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    def forward_backward():
        with torch.enable_grad():
            out = prepared.fn()
        return torch.autograd.grad(out, leaves, grad_out)

    grad_out = prepared.from_bhsd(inputs.grad_out)
    return forward_backward


def check(case: Case, prepared: Prepared, inputs: AttentionInputs, result: Any) -> Agreement:
    """Agreement of one step's result (output, or gradients in backward modes) with the float64 reference."""
    if prepared.check is not None:
        return prepared.check(result)
    if case.mode == "fwd":
        return check_forward(case, inputs, prepared.to_bhsd(result))
    return check_backward(case, inputs, [prepared.to_bhsd(g) for g in result])


def is_oom(exc: BaseException) -> bool:
    """True for torch's and the allocator's out-of-memory errors (CUDA and CPU)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower())


#: Messages of CUDA errors after which the process's CUDA context is unusable for good (cudaErrorIllegalAddress & co).
STICKY_CUDA_ERRORS = (
    "illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
    "illegal instruction", "an illegal address",
)
#: How the reason of a pair that hit a sticky CUDA error begins; the worker exits after writing it.
STICKY_PREFIX = "sticky CUDA error (this process's CUDA context is lost; worker restarted): "


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """True for an error after which no later CUDA call in this process can succeed (the worker must exit)."""
    text = str(exc).lower()
    return "cuda" in text and any(marker in text for marker in STICKY_CUDA_ERRORS)


def poisons_process(record: dict[str, Any]) -> bool:
    """True when the record's pair left the process unusable, so the worker must exit after writing it."""
    return record.get("status") == "crashed" and str(record.get("reason") or "").startswith(STICKY_PREFIX)


def _release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def execute(case: Case, backend: Backend, options: Options = Options(), *, loop_factory: Callable[[Clock], Loop] | None = None) -> dict[str, Any]:
    """Run one pair and return its record; never raises for a backend's failure."""
    record = base_record(case, backend, options)
    outcome: dict[str, Any]
    failed: BaseException | None = None
    try:
        reason = backend.available() or backend.supports(case)
        if reason:
            return {**record, "status": "unsupported", "reason": reason}
        outcome = _measure_pair(case, backend, options, loop_factory)
    except Unsupported as exc:
        outcome = {"status": "unsupported", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - every failure becomes data
        failed = exc
        outcome = {}
    if failed is not None:
        # Built outside the except block: the exception's frames hold the case's tensors.
        if is_oom(failed):
            outcome = {"status": "oom", "reason": " ".join(str(failed).split())[:300]}
        elif is_sticky_cuda_error(failed):
            outcome = {"status": "crashed", "reason": STICKY_PREFIX + " ".join(str(failed).split())[:300]}
        else:
            where = traceback.extract_tb(failed.__traceback__)[-1]
            outcome = {"status": "error", "reason": f"{type(failed).__name__}: {' '.join(str(failed).split())[:300]} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"}
        failed = None
    _release_memory(case.device)
    return {**record, **outcome}


def input_fingerprints(inputs: AttentionInputs) -> list[tuple[float, float]]:
    """Float64 sum and absolute sum of q, k, v: notices a backend writing into its inputs without keeping a copy."""
    with torch.no_grad():
        return [(float(t.detach().sum(dtype=torch.float64)), float(t.detach().abs().sum(dtype=torch.float64)))
                for t in (inputs.q, inputs.k, inputs.v)]


def flag_modified_inputs(agreement: Agreement, drawn: list[tuple[float, float]], inputs: AttentionInputs) -> Agreement:
    """Fail the agreement when q, k or v changed since `drawn`: the check (and every timed call) then ran on inputs nobody drew."""
    changed = [name for name, before, now in zip("qkv", drawn, input_fingerprints(inputs)) if before != now]
    return agreement.disagreeing(f"backend modified its inputs in place ({', '.join(changed)})") if changed else agreement


def _measure_pair(case: Case, backend: Backend, options: Options, loop_factory: Callable[[Clock], Loop] | None) -> dict[str, Any]:
    inputs = make_inputs(case)
    if case.mode != "fwd":
        for t in (inputs.q, inputs.k, inputs.v):
            t.requires_grad_(True)
    drawn = input_fingerprints(inputs)
    with torch.set_grad_enabled(case.mode != "fwd"):
        prepared = backend.prepare(case, inputs)
        step = build_step(case, prepared, inputs)
        if not backend.computes_attention:
            step()  # the first call, as a checked backend's; there is no attention output to compare
            agreement = Agreement(None, None, None, None, f"not checked: {backend.name} does not compute attention")
        else:
            agreement = check(case, prepared, inputs, step()) if options.check else Agreement(None, None, None, None, "not checked")
        clock, setup, timer_name = device_clock(case.device)
        loop = loop_factory(clock) if loop_factory else None
        measured: Measurement = measure(step, clock, options.budget, setup=setup, loop=loop)
        peak = measure_peak(step, case.device)
    agreement = flag_modified_inputs(agreement, drawn, inputs)
    stats = measured.stats
    flops, nbytes = backend.costs(case) or (theory.flops(case), theory.min_bytes(case))
    return {
        "status": "ok", "reason": agreement.check_note,
        "latency_ms_median": stats.median * 1e3, "latency_ms_p20": stats.p20 * 1e3, "latency_ms_p80": stats.p80 * 1e3,
        "latency_ms_min": stats.min * 1e3, "latency_ms_mean": stats.mean * 1e3, "latency_ms_max": stats.max * 1e3,
        "latency_ms_stdev": stats.stdev * 1e3, "iqr_ratio": stats.iqr_ratio,
        "samples": stats.n, "iterations": stats.iterations, "noisy": stats.noisy, "suspect": stats.suspect,
        "too_short": measured.too_short, "warmup_s": measured.plan.warmup_s,
        "clock_resolution_s": measured.clock_resolution_s, "timer": timer_name, "compile_s": prepared.compile_s,
        "sample_ms": [s * 1e3 for s in stats.samples],
        "peak_mem_bytes": peak.peak_bytes, "peak_reserved_bytes": peak.reserved_bytes, "memory_method": peak.method,
        "tflops": flops / stats.median / 1e12, "gbps": nbytes / stats.median / 1e9,
        "kv_expanded": bool(prepared.notes.get("kv_expanded", False)), "notes": prepared.notes or None,
        **{k: v for k, v in agreement.columns().items() if k != "check_note"},
    }
