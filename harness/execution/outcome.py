"""What one pair's run gave (`PairOutcome`) and how it becomes the run's `Record` (`case_record`, `to_record`).

The executor (harness.execution.execute) fills an outcome phase by phase; this module is the one place
that maps an outcome onto a record's columns, so every caller of the executor writes the same row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.backends.base import Backend
from harness.attention import theory
from harness.telemetry import gpu_state
from harness.telemetry.energy import EnergyResult
from harness.measure.memory import MemoryPeak
from harness.measure.contention import with_gpu_processes
from harness.attention.numerics import Agreement
from harness.profiling.profile import ProfileSummary
from harness.measure.timing import Measurement
from harness.results.record import Record, Status
from harness.results.vocabulary import PHASE_NAMES
from harness.suite.cases import Case


@dataclass
class PairOutcome:
    """What running one pair gave: its status and whatever the phases that ran measured."""

    status: Status
    reason: str | None = None
    agreement: Agreement | None = None
    measurement: Measurement | None = None
    peak: MemoryPeak | None = None
    profile: ProfileSummary | None = None
    timer: str | None = None
    compile_s: float | None = None
    #: Seconds of the backend's untimed per-batch set-up (Prepared.plan_s).
    plan_s: float | None = None
    #: The GPU's clocks, power and throttling over the timed samples, and the energy phase's result.
    state: gpu_state.StateSummary | None = None
    energy: EnergyResult | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    #: Whether the check's two consecutive calls gave bitwise-equal results (None: no two checked calls).
    bitwise_repeatable: bool | None = None
    #: What one untimed profiled call ran, for a backend that claims a kernel for the case (harness.execution.kernel_proof):
    #: the `kernels` column, and why the trace does not meet the claim (None: met, or nothing claimed).
    kernels: str | None = None
    kernel_mismatch: str | None = None
    #: Host seconds of each phase that ran (PHASE_NAMES), and of the whole pair ("pair", clean-up included).
    seconds: dict[str, float] = field(default_factory=dict)




def case_record(case: Case, backend: Backend, run_id: str = "", worker: str = "0") -> Record:
    """A record of the pair with the case's fields, the backend and the analytic costs filled in, nothing measured."""
    try:
        version = backend.version()
    except Exception:  # noqa: BLE001 - a version probe must not cost the row
        version = None
    flops, nbytes = backend.costs(case) or (theory.flops(case), theory.min_bytes(case))
    counts = theory.mask_counts(case)
    return Record(
        case=case, backend=backend.name, family=backend.family,
        tokens_q=counts.q_rows, tokens_kv=counts.kv_tokens,
        backend_version=version, flops=flops, bytes=nbytes, kv_cache_bytes=theory.kv_cache_bytes(case),
        arithmetic_intensity=flops / nbytes, run_id=run_id, worker=worker,
    )


def to_record(case: Case, backend: Backend, outcome: PairOutcome, run_id: str = "", worker: str = "0") -> Record:
    """The run's record of one pair's outcome."""
    record = case_record(case, backend, run_id, worker)
    record.status, record.reason = outcome.status, outcome.reason
    for phase in (*PHASE_NAMES, "pair"):
        setattr(record, f"time_{phase}_s", outcome.seconds.get(phase))
    if outcome.status is not Status.OK:
        return record
    record.timer, record.compile_s = outcome.timer, outcome.compile_s
    record.plan_ms = outcome.plan_s * 1e3 if outcome.plan_s is not None else None
    record.kv_expanded = bool(outcome.notes.get("kv_expanded", False))
    record.notes = outcome.notes or None
    if outcome.agreement is not None:
        a = outcome.agreement
        record.max_abs_err, record.err_bound, record.rel_err, record.agree = a.max_abs_err, a.err_bound, a.rel_err, a.agree
        record.masked_rows_max_abs = a.masked_rows_max_abs
    record.bitwise_repeatable = outcome.bitwise_repeatable
    if outcome.measurement is not None:
        m, stats = outcome.measurement, outcome.measurement.stats
        record.latency_ms_median, record.latency_ms_p20, record.latency_ms_p80 = stats.median * 1e3, stats.p20 * 1e3, stats.p80 * 1e3
        record.latency_ms_min, record.latency_ms_mean, record.latency_ms_max = stats.min * 1e3, stats.mean * 1e3, stats.max * 1e3
        record.latency_ms_stdev, record.iqr_ratio = stats.stdev * 1e3, stats.iqr_ratio
        interval = stats.median_interval()
        if interval is not None:
            record.latency_ms_ci95_low, record.latency_ms_ci95_high = interval[0] * 1e3, interval[1] * 1e3
        record.samples, record.iterations, record.noisy, record.suspect = stats.n, stats.iterations, stats.noisy, stats.suspect
        record.stopped_by = m.stopped_by
        if m.drift is not None:
            record.drift_pct, record.drifted = m.drift.pct, m.drift.flagged
        record.too_short, record.warmup_s, record.clock_resolution_s = m.too_short, m.plan.warmup_s, m.clock_resolution_s
        record.launch_leaked, record.contended, record.cpu_wall_ratio = m.launch_leaked, m.contended, m.cpu_wall_ratio
        record.run_queue_wait_ratio, record.involuntary_switches = m.run_queue_wait_ratio, m.involuntary_switches
        record.sample_ms = [s * 1e3 for s in stats.samples]
        record.tflops, record.gbps = record.flops / stats.median / 1e12, record.bytes / stats.median / 1e9
    for name, value in {**(outcome.state.columns() if outcome.state else {}),
                        **(outcome.energy.columns(record.flops) if outcome.energy else {})}.items():
        setattr(record, name, value)
    record.contended = with_gpu_processes(record.contended, record.gpu_other_processes)
    if outcome.profile is not None:
        median_s = record.latency_ms_median / 1e3 if record.latency_ms_median is not None else None
        for name, value in outcome.profile.record_columns(median_s).items():
            setattr(record, name, value)
        record.profile_trace = outcome.profile.trace_path
    if outcome.kernels is not None:  # the claim was proved or refuted: a flag either way (None: no claim, or no proof)
        record.kernels, record.kernel_mismatch_reason = outcome.kernels, outcome.kernel_mismatch
        record.kernel_mismatch = outcome.kernel_mismatch is not None
    if outcome.peak is not None:
        record.peak_mem_bytes, record.peak_reserved_bytes, record.memory_method = outcome.peak.peak_bytes, outcome.peak.reserved_bytes, outcome.peak.method
    return record
