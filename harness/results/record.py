"""The record of one (case, backend) pair: a typed row holding its Case, and the schema derived from them.

Everything that writes a row (the pair executor, the supervisor's failure rows) builds a `Record`;
everything that reads one (gpu-check, stability, the analysis) goes through `Record.from_dict`, which
checks each field's type, so a reader never guesses whether `agree` is a bool, a 1 or "true".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from harness.errors import UserError
from harness.results.column_types import admitted, typed
from harness.results.record_checks import LATENCY_FIELDS, check_latencies, check_ranges  # noqa: F401 (LATENCY_FIELDS: its old home)
from harness.results.vocabulary import Status
from harness.suite.cases import CASE_FIELDS, Case, case_from_fields

SCHEMA_VERSION = 1


#: Statuses that are not a failure of the backend: it ran, or it said honestly that it cannot.
NOT_FAILURES = (Status.OK, Status.UNSUPPORTED)


def verdict(status: Status, agree: bool | None) -> str:
    """The one word for a pair's outcome in tables: agree / disagree / not checked, or the status when it did not run."""
    if status is not Status.OK:
        return status.value
    return "not checked" if agree is None else ("agree" if agree else "disagree")


@dataclass
class Record:
    """One row of `records.jsonl`: the pair's Case, its backend, the outcome and every measured number.

    The case is held whole (as torch.utils.benchmark's `Measurement` holds its `TaskSpec`); it is flattened into
    columns only where a record is written or read (`to_dict`, `from_dict`, the CSV and the DataFrame).
    After the case's columns, field order is the CSV's column order. None means "not measured" (a pair that did not run, or a
    phase that was switched off); numbers are stored at full precision, only reports round.
    """

    #: The problem the pair measured, whole: its flat columns (case_id, the fields, attention_kind) exist only in files and frames.
    case: Case
    #: The backend's registry name (what `--backends` takes, e.g. naive, sdpa); never empty.
    backend: str
    #: The real query and KV tokens of the case (a dense case's too): what its FLOPs and bytes count.
    #: `tokens_q`: the real query rows summed over the batch (B·S_q unless padded or ragged; theory.mask_counts); set on every row.
    tokens_q: int | None = None
    #: The real key/value tokens summed over the batch (B·S_kv unless padded or ragged: then the per-sequence lengths); set on every row.
    tokens_kv: int | None = None
    #: The backend's family (its class's `family`: eager, compiled, flash-attn, flashinfer, flex, mla, layer, plugin, ...); empty if it declares none.
    family: str = ""
    #: The backend library's version as its `version()` reports it; None when the probe failed or there is none.
    backend_version: str | None = None
    #: How the pair ended: ok, unsupported (an answer, with its reason) or a failure; `skipped` only in gpu-check.
    status: Status = Status.OK
    #: Why the row is not ok (unsupported: the backend's reason; error, oom, crashed, timeout: what happened), or on an ok
    #: row the agreement check's note (a sampled or skipped check, a failed one's cause); None when there is nothing to say.
    reason: str | None = None
    #: Median of the timed samples, ms per call (each sample is the mean of `iterations` calls); None when nothing was timed.
    latency_ms_median: float | None = None
    #: 20th percentile of the samples (linear interpolation), ms per call; None when nothing was timed.
    latency_ms_p20: float | None = None
    #: 80th percentile of the samples (linear interpolation), ms per call; None when nothing was timed.
    latency_ms_p80: float | None = None
    #: Fastest sample, ms per call; None when nothing was timed.
    latency_ms_min: float | None = None
    #: Mean of the samples, ms per call; None when nothing was timed.
    latency_ms_mean: float | None = None
    #: Slowest sample, ms per call; None when nothing was timed.
    latency_ms_max: float | None = None
    #: Sample standard deviation (ddof=1; 0 with one sample), ms per call; None when nothing was timed.
    latency_ms_stdev: float | None = None
    #: A distribution-free 95 % confidence interval of the median (order statistics); None under 6 samples.
    #: `latency_ms_ci95_low`: its lower end, ms per call (widened to the medians of 8 consecutive blocks from 16 samples).
    latency_ms_ci95_low: float | None = None
    #: The interval's upper end, ms per call; None under 6 samples (or when nothing was timed).
    latency_ms_ci95_high: float | None = None
    #: Interquartile range over median, (p75 − p25) / median, a fraction: what `noisy` and `suspect` test; None when nothing was timed.
    iqr_ratio: float | None = None
    #: Number of timed samples (harness.measure.stopping decides it: `stopped_by`); None when nothing was timed.
    samples: int | None = None
    #: Calls per timed sample (batched on a CPU so a sample lasts about 1 ms); None when nothing was timed.
    iterations: int | None = None
    #: What set the number of samples (harness.measure.stopping): precision (the median's 95 % interval came
    #: within ±1 % on a steady run before the time budget was spent), budget, max_rounds, min_rounds (taken
    #: whatever they cost), call_exceeds_budget (one call costs more than the budget holds: fewer samples) or
    #: first_call (the first call cost five budgets or more: it is the one sample, no warm-up call before it).
    stopped_by: str | None = None
    #: The last third of the samples' median against the first third's, in %; None under 18 samples.
    drift_pct: float | None = None
    #: The thirds' 95 % intervals are disjoint and they differ by at least 1 %: the median depends on when it was taken.
    drifted: bool | None = None
    #: IQR/median ≥ 10 % (harness.measure.stats.NOISY_IQR): the samples spread widely; None when nothing was timed.
    noisy: bool | None = None
    #: IQR/median ≥ 25 % (SUSPECT_IQR): the median should not be trusted (harness.run.remeasure may re-measure it); None when nothing was timed.
    suspect: bool | None = None
    #: The shortest sample lasts under 100 clock ticks: quantisation alone may move it by more than 1 %.
    too_short: bool | None = None
    #: Host seconds the time-based warm-up took before the samples (0 when the first call was the one sample); None when nothing was timed.
    warmup_s: float | None = None
    #: The clock's tick as far as it is known: its resolution, or the samples' own grid where that is finer.
    #: In seconds; None when nothing was timed.
    clock_resolution_s: float | None = None
    #: Timed samples whose interval may hold host launch time (CUDA: the host outran the spin); None on host clocks.
    launch_leaked: int | None = None
    #: Another process took the CPU (run-queue waits or preemptions) or ran on the GPU during the timed samples; the evidence follows.
    #: `contended`: run_queue_wait_ratio ≥ 0.10, else ≥ 100 preemptions/s, or gpu_other_processes > 0; None when nothing could be read.
    contended: bool | None = None
    #: Thread-seconds the process spent runnable but not running, per wall second of the timed phase; None where the kernel does not report run-queue waits.
    run_queue_wait_ratio: float | None = None
    #: Involuntary context switches (preemptions) of the process during the timed phase, a count; None where unreadable.
    involuntary_switches: int | None = None
    #: Process CPU seconds over wall seconds × intra-op threads during the timed phase, a fraction; None when nothing was timed.
    cpu_wall_ratio: float | None = None
    #: torch's intra-op CPU threads the pair was timed with (`run --threads`, else torch's default, the core count).
    #: None on an unsupported row (it ran nothing) and where no timing process stamped it (a row not ok).
    threads: int | None = None
    #: What the latency is: perf_counter or cuda-event (`run --timer events`), cpu-operators/cuda-kernels (profiler), cuda-graph-replay; None when not ok.
    timer: str | None = None
    #: Seconds the backend's untimed `prepare` spent compiling (torch.compile's first calls: flex, naive-compiled), never in latency; None for the others.
    compile_s: float | None = None
    #: Milliseconds of the backend's untimed per-batch set-up (FlashInfer's plan(), a BlockMask), timed on its own.
    #: None where the backend has none, or the row is not ok.
    plan_ms: float | None = None
    #: Bytes a call needed above what its inputs held: CUDA allocator peak, or the CPU process's resident high-water mark; None when not measured.
    peak_mem_bytes: int | None = None
    #: Bytes the CUDA caching allocator reserved at its peak above what it held before the call; None on a CPU or when not measured.
    peak_reserved_bytes: int | None = None
    #: How the peak was measured: cuda-allocator, or rss-hwm-trimmed (CPU VmHWM after malloc_trim); None when not measured.
    memory_method: str | None = None
    #: Floating-point operations of one call: the backend's own count, else theory.flops (visible pairs × 2·H·(d_k + d_v) forward); set on every row.
    flops: float | None = None
    #: Bytes one call must move at least: Q, K, V read once, O written once (theory.min_bytes, or the backend's count); set on every row.
    bytes: float | None = None
    #: Bytes of the KV cache the case's real tokens hold (MLA: one latent per token; theory.kv_cache_bytes); set on every row.
    kv_cache_bytes: float | None = None
    #: flops / median latency, in 10¹² FLOP/s; None when nothing was timed.
    tflops: float | None = None
    #: bytes / median latency, in 10⁹ bytes/s; None when nothing was timed.
    gbps: float | None = None
    #: flops / bytes, FLOP per byte; set on every row.
    arithmetic_intensity: float | None = None
    #: The harness copied K/V to H heads for a backend without native GQA (that copy is timed); None when the row is not ok.
    kv_expanded: bool | None = None
    #: The backend's notes on the call (the operator a library dispatched to, kv_expanded) and a cool-down's problem; None when none.
    notes: dict[str, Any] | None = None
    #: Largest |output − float64 reference| over the checked elements (backward: the worst of dQ, dK, dV); None when not
    #: checked or the shapes differ; infinite (written as null) when the output holds NaN or Inf.
    max_abs_err: float | None = None
    #: The bound max_abs_err must stay within: 2·max|eager low-precision − reference| + atol; None when not checked.
    err_bound: float | None = None
    #: ‖output − reference‖ / ‖reference‖ (backward: the largest of the gradients'); None when not checked.
    rel_err: float | None = None
    #: max_abs_err ≤ err_bound and no NaN/Inf (every gradient in backward modes); None when not checked (`reason` says why).
    agree: bool | None = None
    #: Whether the check's two consecutive calls returned bitwise-equal results (the output in fwd, the gradients in
    #: bwd/fwd_bwd): measured, not assumed; None when the pair made no two checked calls. A deterministic case needs True.
    bitwise_repeatable: bool | None = None
    #: Largest |value| written into query rows that see no key (the reference writes 0); not part of `agree`.
    #: None when the case has no such rows or was not checked.
    masked_rows_max_abs: float | None = None
    #: From one profiled pass after the timed samples (`run --profile`), per step: kernels (CUDA) or operators
    #: (CPU), their summed time, the share of the median they leave to launch overhead and gaps, the top one,
    #: and the time per category (harness.profiling.categories). Every profile_* column is None without `--profile`.
    #: `profile_kernels_per_step`: kernels or operators launched per step.
    profile_kernels_per_step: float | None = None
    #: Their summed time per step, ms.
    profile_kernel_ms_per_step: float | None = None
    #: 1 − that time / the median, a fraction: launch overhead and gaps; negative when the profile exceeds the median (not clamped).
    profile_gap_share: float | None = None
    #: The kernel or operator with the most time per step, by name.
    profile_top_kernel: str | None = None
    #: Time per step in matrix products, ms.
    profile_ms_matmul: float | None = None
    #: Time per step in softmax, ms.
    profile_ms_softmax: float | None = None
    #: Time per step in elementwise kernels or operators, ms.
    profile_ms_elementwise: float | None = None
    #: Time per step in copies and K/V expansion, ms.
    profile_ms_copy_expand: float | None = None
    #: Time per step in fused attention kernels, ms.
    profile_ms_fused_attention: float | None = None
    #: Time per step in everything no other category takes, ms.
    profile_ms_other: float | None = None
    #: Path of the pair's Chrome trace (gzip JSON, traces/) with `run --profile --traces`; None without it.
    profile_trace: str | None = None
    #: For a backend that claims a kernel for the case (FP8, MLA: harness.backends.kernel_claims), from one untimed
    #: profiled call after the check: the distinct kernels (CUDA) or operators (CPU) that ran, the claimed ones first,
    #: ';'-joined and capped; `kernel_mismatch`, whether the trace failed the claim (the row then decides nothing: it
    #: measured another path than it claims), and why, in one line. None: no claim, or no proof.
    kernels: str | None = None
    #: True when the trace failed the claim, False when it met it; None: no claim, or no proof.
    kernel_mismatch: bool | None = None
    #: Why the trace failed the claim, one line; None when it met it, or nothing was claimed or proved.
    kernel_mismatch_reason: str | None = None
    #: Host seconds the pair spent in each phase of the executor, and in all of it (clean-up included):
    #: what the sweep's wall time went to, beside the timed samples themselves. Each is None when its phase did not run.
    #: `time_inputs_s`: drawing the inputs.
    time_inputs_s: float | None = None
    #: Host seconds in the backend's untimed `prepare` (compiling and planning included).
    time_prepare_s: float | None = None
    #: Host seconds in the agreement check (the reference, or the backend's own check).
    time_check_s: float | None = None
    #: Host seconds in the warm-up.
    time_warmup_s: float | None = None
    #: Host seconds of the timed samples' phase.
    time_timed_s: float | None = None
    #: Host seconds of the memory phase.
    time_memory_s: float | None = None
    #: Host seconds of the profiled pass (`run --profile`).
    time_profile_s: float | None = None
    #: Host seconds of the whole pair, clean-up included.
    time_pair_s: float | None = None
    #: -- The machine's state and energy (harness.telemetry.gpu_state, harness.telemetry.energy). --
    #: Host seconds of the energy phase (after the check; none where there is no energy counter).
    time_energy_s: float | None = None
    #: NVML readings over the timed samples (start, end, every 20 ms between): SM clock MHz (lowest, median),
    #: memory clock MHz (median), temperature °C (highest), board power W (mean), throttle reason bits OR-ed,
    #: how many readings, and the SM clock MHz the device is meant to sustain. None on a CPU row.
    #: `gpu_sm_clock_mhz_min`: the lowest SM clock read, MHz.
    gpu_sm_clock_mhz_min: float | None = None
    #: The median SM clock read, MHz; None on a CPU row.
    gpu_sm_clock_mhz_median: float | None = None
    #: The median memory clock read, MHz; None on a CPU row.
    gpu_mem_clock_mhz_median: float | None = None
    #: The highest GPU temperature read, °C; None on a CPU row.
    gpu_temperature_c_max: float | None = None
    #: The mean board power read, W; None on a CPU row.
    gpu_power_w_mean: float | None = None
    #: NVML's clock-throttle reason bits of every reading, OR-ed (0x1, idle, alone is not throttling); None on a CPU row.
    gpu_throttle_reasons: int | None = None
    #: How many NVML readings the figures above summarise; None on a CPU row or when none was taken.
    gpu_state_readings: int | None = None
    #: The SM clock the device is meant to sustain (its maximum, or the application clock set below it), MHz; None on a CPU row.
    gpu_sustained_sm_clock_mhz: float | None = None
    #: A power/thermal/hardware slowdown reason was set, or the SM clock fell below the sustained one, while the
    #: samples ran (the row's latency is the slowed GPU's); `throttle_reason` says which. None: not read.
    throttled: bool | None = None
    #: The slowdown reasons and low-clock readings found, '; '-joined; None when none was found or nothing was read.
    throttle_reason: str | None = None
    #: Why the GPU state columns are empty (a CPU row, NVML missing).
    #: None when they were read.
    gpu_state_reason: str | None = None
    #: Compute processes other than the timing one that NVML listed on the device as the samples started or ended (above 0
    #: makes the row `contended`), and the GPU's utilisation % then (the higher); None where NVML cannot tell (a CPU row, MIG).
    #: `gpu_other_processes`: their count.
    gpu_other_processes: int | None = None
    #: The GPU's utilisation then, % (the higher of the two readings); None where NVML cannot tell.
    gpu_utilization_pct: float | None = None
    #: The energy phase: mJ per call, mean W and GFLOP per joule between two changes of the counter, over
    #: `energy_window_s` seconds and `energy_calls` back-to-back calls in which it changed `energy_counter_updates`
    #: times; `energy_counter` names it (nvml-total-energy, rapl:…), `energy_reason` says why there is no figure.
    #: The figures are None without `run --energy` or when the counter moved too few times.
    #: `energy_mj_per_call`: millijoules per call (the whole board or CPU package, static power included).
    energy_mj_per_call: float | None = None
    #: Mean power over the energy window, W.
    avg_power_w: float | None = None
    #: flops per call over joules per call, in GFLOP/J.
    gflop_per_joule: float | None = None
    #: Seconds between the two counter changes the figures span.
    energy_window_s: float | None = None
    #: Calls made in that window, a count.
    energy_calls: int | None = None
    #: Times the counter changed in that window, a count.
    energy_counter_updates: int | None = None
    #: The counter read (nvml-total-energy, rapl:…); None when none was read.
    energy_counter: str | None = None
    #: Why there is no energy figure (no `--energy`, no readable counter, too few updates); None when there is one.
    energy_reason: str | None = None
    #: The run's id (`<UTC time>-<suite>-<supervisor pid>`, the folder's name; gpu-check writes gpu-check); empty when none was given.
    run_id: str = ""
    #: The worker slot that ran the pair (its log is worker-<worker>.log), or "supervisor" on a row it wrote for a pair that never ran; "0" by default.
    worker: str = "0"
    #: Where the pair ran when that is not this machine (`--executor ray`): the node's address and its device's model.
    #: `node`: the Ray node's address; None on a local run.
    node: str | None = None
    #: The model of the device on that Ray node; None on a local run.
    device_name: str | None = None
    #: Where the pair ran in its case's backend order (0 = first; harness.run.order), how long the GPU was
    #: let cool before it (`--cooldown`), and the one shell command that re-runs this pair alone (harness.run.repro).
    #: `order_in_case`: the position, 0-based; None where the run's writer did not stamp one.
    order_in_case: int | None = None
    #: Seconds waited for the GPU to cool before the pair (`run --cooldown`); None without it.
    cooldown_s: float | None = None
    #: The shell command that re-runs this pair alone; None where the run's writer did not stamp one.
    repro: str | None = None
    #: What measured the row (harness.env.harness_identity, stamped by the run's writer): attnbench's version, its git
    #: commit and whether the checkout's tracked files differed from it; None where unknown (not a git checkout, git
    #: missing, a row written before these columns existed). The measurement rules change between versions.
    #: `harness_version`: attnbench's version.
    harness_version: str | None = None
    #: The git commit attnbench ran from; None outside a git checkout or without git.
    harness_commit: str | None = None
    #: True when the checkout's tracked files differed from that commit; None outside a git checkout or without git.
    harness_dirty: bool | None = None
    #: Set on a row measured again at the end of its sweep because its first measurement was contended, suspect or
    #: throttled (harness.run.remeasure): that first measurement's evidence (median, interval, flags, contention, when).
    #: The first row stays in records.jsonl; readers see this one in its place (harness.results.store.read_records).
    #: None on a row measured once.
    remeasured_from: dict[str, Any] | None = None
    #: When the record was made, Unix seconds (time.time()).
    timestamp: float = field(default_factory=time.time)
    #: The version of the row's layout (SCHEMA_VERSION, 1 now).
    schema_version: int = SCHEMA_VERSION
    #: Per-call seconds ×1e3 of every timed sample: kept in the JSONL, left out of the flat CSV.
    #: In ms, in the order taken; None when nothing was timed.
    sample_ms: list[float] | None = None
    #: Columns this version does not know (a newer writer, a plugin): carried through untouched.
    #: An empty dict when there are none.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def case_id(self) -> str:
        """The case's id (`Case.id`)."""
        return self.case.id

    @property
    def pair_key(self) -> str:
        """`<case id>-<backend>`: the pair's identity in a run (`pair_key`)."""
        return pair_key(self.case, self.backend)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record (NaN and infinities as null; raw samples only when there are some)."""
        out = case_columns(self.case)
        out.update((name, _clean(getattr(self, name))) for name in _OWN_COLUMNS)
        if self.sample_ms is not None:
            out["sample_ms"] = [_clean(v) for v in self.sample_ms]
        out.update({k: _clean(v) for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "record") -> "Record":
        """A record from its JSON object, each known field type-checked; UserError naming `where` and the field."""
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise UserError(f"{where}: field {missing[0]!r} is missing")
        case = _case_of(data, where)
        values = {name: _typed(name, value, where) for name, value in data.items() if name in _OPTIONS}
        record = cls(case=case, **values, extra={k: v for k, v in data.items() if k not in _OPTIONS and k not in CASE_COLUMNS})
        check_latencies(record, where)
        check_ranges(record, where)
        return record


def pair_key(case: Case, backend: str) -> str:
    """`<case id>-<backend>`: the one spelling of a pair's identity, in a manifest, a claim, a record and a repro."""
    return f"{case.id}-{backend}"


def case_columns(case: Case) -> dict[str, Any]:
    """A case as the flat columns a record is written with: its id, its fields (lengths as lists) and its kind of attention."""
    return {"case_id": case.id, **{name: _clean(value) for name, value in case.fields().items()}, "attention_kind": case.attention_kind}


def _case_of(data: dict[str, Any], where: str) -> Case:
    """The Case a row's case columns make, each column type-checked; UserError when they make none or contradict its id."""
    values = tuple(_typed(name, data.get(name), where) if name in data else _ABSENT for name in CASE_FIELDS)
    case = _case_from_values(tuple(tuple(v) if isinstance(v, list) else v for v in values))
    if isinstance(case, str):
        raise UserError(f"{where}: not a valid case ({case})")
    if case.id != data["case_id"]:
        raise UserError(f"{where}: case_id {data['case_id']!r} contradicts the row's own fields, which make {case.id!r}")
    kind = data.get("attention_kind")
    if kind not in (None, "", case.attention_kind):
        raise UserError(f"{where}: attention_kind {kind!r} contradicts the row's own fields, which make {case.attention_kind!r}")
    return case


#: A case column the row does not carry (the field's default applies), told apart from a null.
_ABSENT = object()


@functools.lru_cache(maxsize=4096)
def _case_from_values(values: tuple[Any, ...]) -> Case | str:
    """The Case of these typed case-column values (CASE_FIELDS order), or why they make none.

    Cached: a run's rows repeat each case once per backend, and a Case is frozen, so its rows may share it."""
    try:
        return case_from_fields({name: value for name, value in zip(CASE_FIELDS, values) if value is not _ABSENT})
    except UserError as exc:
        return str(exc)


def _clean(value: Any) -> Any:
    """JSON has no NaN or Infinity: store them as null; numpy scalars as the Python numbers they are; tuples as lists."""
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


_HINTS = {**{name: hint for name, hint in get_type_hints(Case).items()}, **get_type_hints(Record)}
#: Columns every stored record has (the pair's identity: its case's id and required fields, its backend); everything else may be null.
_REQUIRED = ("case_id", *(f.name for f in dataclasses.fields(Case) if f.default is dataclasses.MISSING), "backend")


def _typed(name: str, value: Any, where: str) -> Any:
    """`value` as column `name`'s declared type, or UserError naming the field and the value."""
    return typed(name, value, _OPTIONS[name] if name in _OPTIONS else _CASE_OPTIONS[name], _HINTS[name], where)


#: Each column's admitted types, read once: records are checked by the thousand.
_OPTIONS = {f.name: admitted(_HINTS[f.name]) for f in dataclasses.fields(Record) if f.name not in ("case", "extra")}
_CASE_OPTIONS = {name: admitted(_HINTS[name]) for name in CASE_FIELDS}


#: The columns a record's case is written as, first in every file and frame.
CASE_COLUMNS: tuple[str, ...] = ("case_id", *CASE_FIELDS, "attention_kind")
#: The record's own columns, in CSV order after the case's.
_OWN_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record) if f.name not in ("case", "sample_ms", "extra"))
#: Columns every record has, in CSV order (the case's first); the raw samples stay in the JSONL only.
COLUMNS: tuple[str, ...] = CASE_COLUMNS + _OWN_COLUMNS
RAW_COLUMNS = ("sample_ms",)
