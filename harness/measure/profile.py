"""Where one pair's time goes: torch.profiler over a few untimed steps, per operator (CPU) or kernel (CUDA).

This is diagnosis, not measurement: the profiler adds overhead to every operator, so nothing here
replaces the harness's median. It runs outside any timed sample. What it answers is which
operators or kernels the step spends its time in, how much of the median they cover (the rest is
Python, launch overhead and gaps), and which operator allocated the memory peak.

Counting rules, so that nothing is counted twice:

* CPU: each operator's *self* CPU time (its time minus its children's). The self times of all
  operators in a step partition the time covered by its top-level operators: `aten::matmul`
  contributes only its own dispatch time and `aten::bmm` the multiply. Counting leaf operators
  only would not do: `aten::bmm` has children (`aten::resolve_conj`), so it is not a leaf, and
  the multiply itself would be lost.
* CUDA: device time of every kernel, memcpy and memset the steps launched. Kernels on
  concurrent streams overlap, so their sum can exceed the wall time; the harness's backends
  use one stream.

Nsight Compute (`ncu`) is a separate path: `ncu_command` builds the command line that runs a pair
under it, `parse_ncu_csv` reads its `--csv` output.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

#: Categories every operator or kernel falls into, in the order tables and record columns list them.
CATEGORIES = ("matmul", "softmax", "elementwise", "copy/expand", "fused attention", "other")

#: Name of the user annotation around each profiled step (`record_function`), followed by its index.
STEP_MARKER = "attnbench::profile_step#"

# Exact aten base names (namespace and in-place `_` stripped). Checked before the substring
# patterns below, because the patterns are for names nobody listed (CUDA kernels, new ops).
_CPU_OPS: dict[str, str] = {}
for _category, _names in {
    "matmul": "mm bmm addmm baddbmm addbmm matmul linear einsum dot vdot mv addmv tensordot "
              "_addmm_activation mkldnn_linear mkldnn_matmul _mkldnn_matmul _int_mm",
    "softmax": "softmax _softmax log_softmax _log_softmax _safe_softmax _masked_softmax "
               "_softmax_backward_data _log_softmax_backward_data _masked_softmax_backward",
    "fused attention": "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
                       "_scaled_dot_product_flash_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward "
                       "_scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward "
                       "_scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward "
                       "_scaled_dot_product_fused_attention_overrideable _scaled_dot_product_fused_attention_overrideable_backward "
                       "_flash_attention_forward _flash_attention_backward _efficient_attention_forward _efficient_attention_backward",
    "copy/expand": "copy _copy_from _copy_from_and_resize _to_copy to contiguous clone expand expand_as repeat "
                   "repeat_interleave index_select index gather cat stack view view_as reshape _reshape_alias "
                   "as_strided transpose permute unsqueeze squeeze t _unsafe_view select slice narrow flatten "
                   "unflatten alias detach lift_fresh split chunk unbind movedim resolve_conj resolve_neg",
    "elementwise": "mul add sub rsub div masked_fill where nan_to_num exp exp2 log neg reciprocal fill zero zeros "
                   "zeros_like ones ones_like full full_like tanh gelu relu sigmoid silu logical_not logical_and "
                   "logical_or bitwise_not bitwise_and bitwise_or eq ne lt gt le ge isnan isinf clamp clamp_min "
                   "clamp_max rsqrt sqrt pow abs sign square maximum minimum addcmul addcdiv lerp triu tril "
                   "threshold_backward gelu_backward scalar_tensor",
    # The SDPA dispatcher and its composite math path: their self time is dispatch, not a fused kernel.
    "other": "scaled_dot_product_attention _scaled_dot_product_attention_math _fused_sdp_choice empty empty_like "
             "empty_strided resize sum mean amax amin max min logsumexp",
}.items():
    for _name in _names.split():
        _CPU_OPS[_name] = _category

# Substring patterns on the lowercased name, first match wins. Fused attention comes first because
# its kernels' names also contain "cutlass" or "gemm" (fmha_cutlassF…, cudnn sdpa); copy comes
# before elementwise because torch's copy kernels run inside `elementwise_kernel<…direct_copy…>`.
_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fused attention", ("flash", "fmha", "sdpa", "efficient_attention", "attention", "_attn")),
    ("softmax", ("softmax",)),
    ("matmul", ("gemm", "gemv", "cutlass", "xmma", "cublas", "nvjet", "matmul", "bmm", "dot_kernel")),
    ("copy/expand", ("copy", "memcpy", "index_select", "indexselect", "repeat", "expand", "contiguous", "transpose", "permute")),
    ("elementwise", ("elementwise", "memset", "fill", "where", "masked", "unrolled", "vectorized")),
)


def categorize(name: str) -> str:
    """The category of a CPU operator (`aten::bmm`) or CUDA kernel name, one of CATEGORIES."""
    if name.startswith("autograd::") or re.search(r"Backward\d*$", name):
        return "other"  # autograd's bookkeeping around a backward node, not the node's operators
    if "::" in name:
        base = name.rsplit("::", 1)[1]
        base = base[:-1] if base.endswith("_") and not base.endswith("__") else base
        if base in _CPU_OPS:
            return _CPU_OPS[base]
    lowered = name.lower()
    for category, needles in _PATTERNS:
        if any(n in lowered for n in needles):
            return category
    return "other"


def column_name(category: str) -> str:
    """The record column of a category's time per step: `profile_ms_copy_expand` for "copy/expand"."""
    return "profile_ms_" + re.sub(r"[^0-9a-z]+", "_", category.lower()).strip("_")


#: The record columns `ProfileSummary.record_columns` fills, always all of them, in this order.
RECORD_COLUMNS = (
    "profile_kernels_per_step", "profile_kernel_ms_per_step", "profile_gap_share", "profile_top_kernel",
    *(column_name(c) for c in CATEGORIES),
)


@dataclass(frozen=True)
class KernelStat:
    """One operator (CPU) or kernel (CUDA), summed over the profiled steps and divided by their number."""

    name: str
    category: str
    calls_per_step: float
    time_s_per_step: float
    #: Fraction of the step's summed kernel (operator) time.
    share: float


@dataclass(frozen=True)
class ProfileSummary:
    """What one profiled pass found: kernels by time, their per-step sum, and the memory peak.

    `kernel_time_s` is per step: on CPU the operators' self time, on CUDA the kernels' device time.
    A None field could not be measured; `notes` says why.
    """

    device: str
    steps: int
    kernels: tuple[KernelStat, ...]
    kernel_time_s: float
    kernels_per_step: float
    category_time_s: dict[str, float]
    top_kernel: str | None
    peak_memory_bytes: int | None
    peak_memory_op: str | None
    trace_path: str | None = None
    #: The summed kernel time of each profiled step, in order (their mean is `kernel_time_s`).
    step_kernel_time_s: tuple[float, ...] = ()
    #: Each step's host wall time as the profiler saw it (with its overhead; CUDA: up to the synchronize).
    step_wall_s: tuple[float, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def unit(self) -> str:
        """What a row is: "kernel" on CUDA, "operator" on CPU."""
        return "kernel" if self.device.startswith("cuda") else "operator"

    def gap_share(self, median_s: float | None) -> float | None:
        """1 − kernel time / median: the share of the harness's median that is launch overhead and gaps (None without a median).

        Negative when the profiled kernels took longer than the median (profiler overhead, noise,
        or overlapping streams); it is returned as measured, not clamped.
        """
        if median_s is None or not median_s > 0 or not math.isfinite(median_s):
            return None
        return 1.0 - self.kernel_time_s / median_s

    def record_columns(self, median_s: float | None) -> dict[str, Any]:
        """The flat record columns (RECORD_COLUMNS, milliseconds per step), plain floats, strings and None."""
        columns: dict[str, Any] = {
            "profile_kernels_per_step": float(self.kernels_per_step),
            "profile_kernel_ms_per_step": float(self.kernel_time_s * 1e3),
            "profile_gap_share": self.gap_share(median_s),
            "profile_top_kernel": self.top_kernel,
        }
        for category in CATEGORIES:
            columns[column_name(category)] = float(self.category_time_s.get(category, 0.0) * 1e3)
        return columns

    def format_table(self, median_s: float | None = None, *, limit: int = 25, name_width: int = 60) -> str:
        """The per-step table: one row per kernel/operator, then the sum against the median and the memory peak."""
        unit = self.unit
        lines = [f"{unit:<{name_width}}  {'category':<15}  {'calls/step':>10}  {'ms/step':>9}  {'share':>6}"]
        for k in self.kernels[:limit]:
            name = k.name if len(k.name) <= name_width else k.name[: name_width - 1] + "…"
            lines.append(f"{name:<{name_width}}  {k.category:<15}  {k.calls_per_step:>10.1f}  "
                         f"{k.time_s_per_step * 1e3:>9.3f}  {k.share:>6.1%}")
        if len(self.kernels) > limit:
            rest = self.kernels[limit:]
            lines.append(f"{f'({len(rest)} more)':<{name_width}}  {'':<15}  {sum(k.calls_per_step for k in rest):>10.1f}  "
                         f"{sum(k.time_s_per_step for k in rest) * 1e3:>9.3f}  {sum(k.share for k in rest):>6.1%}")
        total = f"{unit} time: {self.kernel_time_s * 1e3:.3f} ms/step over {self.kernels_per_step:.1f} {unit}s/step ({self.steps} steps)"
        gap = self.gap_share(median_s)
        if gap is None:
            lines.append(f"{total}; no harness median given")
        else:
            lines.append(f"{total}; harness median {median_s * 1e3:.3f} ms: {unit}s cover {1 - gap:.1%}, "
                         f"launch overhead and gaps {gap:.1%}")
        if self.peak_memory_bytes is None:
            lines.append("memory peak: not measured")
        else:
            where = self.peak_memory_op or "no operator identified"
            lines.append(f"memory peak: {self.peak_memory_bytes / 2**20:.2f} MiB above the step's start, reached in {where}")
        lines.extend(f"note: {n}" for n in self.notes)
        if self.trace_path:
            lines.append(f"trace: {self.trace_path}")
        return "\n".join(lines)


def _is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def _trace_file(trace_path: str | os.PathLike) -> str:
    """The path the gzip trace is written to: `.gz` appended unless already there."""
    path = os.fspath(trace_path)
    return path if path.endswith(".gz") else path + ".gz"


def profile_step(
    step: Callable[[], object],
    device: str,
    *,
    steps: int = 5,
    warmup: int = 2,
    trace_path: str | os.PathLike | None = None,
) -> ProfileSummary:
    """Run `warmup` untimed calls, then profile `steps` calls (each its own marked step) and summarise them."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    cuda = _is_cuda(device)
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        for i in range(steps):
            with record_function(f"{STEP_MARKER}{i}"):
                step()  # the result is dropped inside the marker, so its free is inside the step too
                sync()  # a step's kernels end before its marker closes: the marker bounds them
    written = None
    if trace_path is not None:
        written = _trace_file(trace_path)
        prof.export_chrome_trace(written)  # torch gzips when the name ends with .gz
    return summarize(prof, device, steps, trace_path=written)


#: Kineto activity types of device work: what the CUDA kernel time sums (not the GPU-side copies of annotations).
_DEVICE_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")
_NOT_OPERATORS = ("[memory]", "[OutOfMemory]")


def _is_cpu_op(e: Any) -> bool:
    """An operator on the host: not a step marker, annotation, allocation record or CUDA runtime call."""
    if e.activity_type is not None:
        return e.activity_type == "cpu_op" and not e.name.startswith(STEP_MARKER)
    from torch.autograd import DeviceType

    return (e.device_type == DeviceType.CPU and not e.is_user_annotation and not e.name.startswith(STEP_MARKER)
            and e.name not in _NOT_OPERATORS)


def _is_device_work(e: Any) -> bool:
    """A kernel, memcpy or memset on the device (not a user annotation mirrored onto the GPU timeline)."""
    if e.activity_type is not None:
        return e.activity_type in _DEVICE_ACTIVITIES
    from torch.autograd import DeviceType

    return e.device_type == DeviceType.CUDA and not e.is_user_annotation and not e.name.startswith(STEP_MARKER)


def summarize(prof: Any, device: str, steps: int, *, trace_path: str | None = None) -> ProfileSummary:
    """Summarise a finished `torch.profiler.profile` whose steps were marked with STEP_MARKER."""
    cuda = _is_cuda(device)
    events = list(prof.events())
    markers = sorted((e for e in events if e.name.startswith(STEP_MARKER)), key=lambda e: e.time_range.start)
    if len(markers) != steps:
        raise RuntimeError(f"the profile holds {len(markers)} step markers for {steps} steps")
    windows = [(m.time_range.start, m.time_range.end) for m in markers]
    notes: list[str] = []

    def step_of(t_us: float) -> int | None:
        for i, (start, end) in enumerate(windows):
            if start <= t_us <= end:
                return i
        return None

    cpu_ops = [e for e in events if _is_cpu_op(e)]
    per_step = [0.0] * steps
    totals: dict[str, list[float]] = {}  # name -> [calls, seconds] over all steps
    outside = 0
    if cuda:
        counted = [(e, (e.time_range.end - e.time_range.start) / 1e6) for e in events if _is_device_work(e)]
    else:
        counted = [(e, e.self_cpu_time_total / 1e6) for e in cpu_ops]
    for e, seconds in counted:
        i = step_of(e.time_range.start)
        if i is None:
            outside += 1
            continue
        per_step[i] += seconds
        entry = totals.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
    if outside and cuda:
        notes.append(f"{outside} device events started outside every step's window and were not counted")
    kernel_time = sum(per_step) / steps
    kernels = tuple(sorted(
        (KernelStat(name, categorize(name), calls / steps, seconds / steps, (seconds / steps) / kernel_time if kernel_time > 0 else 0.0)
         for name, (calls, seconds) in totals.items()),
        key=lambda k: (-k.time_s_per_step, k.name),
    ))
    category_time = {c: 0.0 for c in CATEGORIES}
    for k in kernels:
        category_time[k.category] += k.time_s_per_step
    if not kernels:
        notes.append(f"no {'kernels' if cuda else 'operators'} were recorded inside the profiled steps")
    peak, peak_op, why = _memory_peak(prof, windows, cpu_ops, cuda)
    if why:
        notes.append(why)
    return ProfileSummary(
        device=device, steps=steps, kernels=kernels, kernel_time_s=kernel_time,
        kernels_per_step=sum(k.calls_per_step for k in kernels), category_time_s=category_time,
        top_kernel=kernels[0].name if kernels else None, peak_memory_bytes=peak, peak_memory_op=peak_op,
        trace_path=trace_path, step_kernel_time_s=tuple(per_step),
        step_wall_s=tuple((end - start) / 1e6 for start, end in windows), notes=tuple(notes),
    )


def _memory_peak(
    prof: Any, windows: Sequence[tuple[float, float]], cpu_ops: Sequence[Any], cuda: bool,
) -> tuple[int | None, str | None, str | None]:
    """(peak bytes above a step's start, the operator whose allocation reached it, why either is None).

    From the profiler's raw allocation records: a running total per step, starting at zero at the
    step's start (so memory held before it, the inputs, is not counted), and the innermost operator
    on the allocating thread whose time span holds the allocation that set the highest total.
    """
    from torch.autograd import DeviceType

    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        return None, None, "memory peak: this torch's profiler exposes no raw allocation records (profiler.kineto_results)"
    origin = results.trace_start_ns()
    wanted = (DeviceType.CUDA,) if cuda else (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
    records = sorted(
        ((r.start_ns() - origin) / 1e3, r.nbytes(), r.start_thread_id())
        for r in results.events() if r.name() == "[memory]" and r.device_type() in wanted
    )
    if not records:
        return None, None, "memory peak: the profiler recorded no allocations in the profiled steps"
    best: tuple[int, float, int] | None = None  # (bytes, time, thread)
    for start, end in windows:
        running = 0
        for t, nbytes, thread in records:
            if start <= t <= end:
                running += nbytes
                if best is None or running > best[0]:
                    best = (running, t, thread)
    if best is None:
        return None, None, "memory peak: no allocation fell inside a profiled step"
    peak, t, thread = best
    holders = [e for e in cpu_ops if e.thread == thread and e.time_range.start <= t <= e.time_range.end]
    if not holders:
        return peak, None, "memory peak: the allocation that reached it was made outside any operator"
    innermost = max(holders, key=lambda e: (e.time_range.start, -e.time_range.end))
    return peak, innermost.name, None


# --- Nsight Compute -------------------------------------------------------------------------------

#: The small metric set `--ncu` collects: SM and DRAM throughput, tensor-pipe utilisation, achieved occupancy.
NCU_METRICS = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)


def ncu_available() -> str | None:
    """None if Nsight Compute's `ncu` is on PATH, else the one-line reason it cannot run."""
    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not on PATH: no per-kernel hardware metrics"
    return None


def ncu_command(
    argv: Sequence[str],
    metrics: Sequence[str] = NCU_METRICS,
    *,
    ncu: str = "ncu",
    kernel_regex: str | None = None,
    launch_skip: int = 0,
    launch_count: int | None = None,
    profile_from_start: bool = True,
) -> list[str]:
    """The command line that runs `argv` (a python command) under ncu with `metrics`, CSV on stdout.

    ncu replays every kernel once per metric pass, so a whole run is slow: limit it with
    `launch_skip`/`launch_count`, a kernel-name regex, or `profile_from_start=False`, which profiles
    only between `torch.cuda.profiler.start()` and `stop()` in the child.
    """
    if not argv:
        raise ValueError("ncu_command needs the command to profile")
    cmd = [ncu, "--csv", "--page", "details", "--target-processes", "all", "--metrics", ",".join(metrics)]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    if not profile_from_start:
        cmd += ["--profile-from-start", "off"]
    return cmd + list(argv)


@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel launch from ncu's CSV: its launch id, name, and metric values (None if unreadable)."""

    launch_id: int | None
    kernel: str
    metrics: dict[str, float | None]
    units: dict[str, str]


def _ncu_number(text: str) -> float | None:
    """A metric value as ncu prints it (thousands separators, "n/a"), or None when it is not a number.

    Commas are read as thousands separators, ncu's default; a decimal-comma locale would be misread
    (unverified whether ncu follows the locale: run it with LC_ALL=C).
    """
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Per-launch metric dicts from `ncu --csv` output (the long details page or the wide raw page).

    Lines before the header (ncu's `==PROF==` lines, the program's own output) are skipped. Details
    page: one row per (launch, metric) with "ID", "Kernel Name", "Metric Name", "Metric Unit",
    "Metric Value". Raw page: one row per launch, a column per metric, and a row of units under the
    header.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and '"Kernel Name"' in line), None)
    if start is None:
        return []
    # The program's and ncu's own lines can come after the table too; a CSV row starts with a quote.
    rows = list(csv.reader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"')))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}

    def launch_id(row: list[str]) -> int | None:
        value = row[col["ID"]].strip() if "ID" in col and col["ID"] < len(row) else ""
        return int(value) if value.isdigit() else None

    launches: dict[tuple[int | None, str], NcuKernel] = {}
    if "Metric Name" in col and "Metric Value" in col:
        for row in body:
            if len(row) < len(header):
                continue
            key = (launch_id(row), row[col["Kernel Name"]])
            entry = launches.setdefault(key, NcuKernel(key[0], key[1], {}, {}))
            metric = row[col["Metric Name"]]
            entry.metrics[metric] = _ncu_number(row[col["Metric Value"]])
            if "Metric Unit" in col:
                entry.units[metric] = row[col["Metric Unit"]]
        return list(launches.values())
    metric_cols = [name for name in header if "__" in name]  # ncu metric names are unit__counter.rollup
    units: dict[str, str] = {}
    if body and (not body[0][col["Kernel Name"]].strip()):  # the units row has no kernel name
        units = {name: body[0][col[name]] for name in metric_cols if col[name] < len(body[0])}
        body = body[1:]
    result = []
    for row in body:
        if len(row) < len(header):
            continue
        result.append(NcuKernel(launch_id(row), row[col["Kernel Name"]],
                                {m: _ncu_number(row[col[m]]) for m in metric_cols}, dict(units)))
    return result

