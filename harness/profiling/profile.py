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
  use one stream. Kineto's GPU-side copies of the step markers are neither steps nor work.
* Each step follows the between-sample setup its timed samples had (the L2 flush on CUDA), run
  in its own annotation before the step's marker opens: its work is in no step.

Which event is what: `harness.profiling.profiler_events` (the same on torch 2.11 and 2.13).

Nsight Compute (`ncu`) is a separate path: `harness.profiling.ncu`.
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from harness.profiling.categories import categorize
from harness.results.vocabulary import CATEGORIES, column_name
from harness.profiling.kineto_log import quiet_kineto
from harness.profiling.profiler_events import DEVICE_WORK, HOST_OPERATOR, SETUP, STEP, SETUP_MARKER, STEP_MARKER, Windows, event_kind


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
        elif gap < 0:  # the profiled pass ran slower than the timed one: no share of the median is left to call overhead
            hint = ": on a CPU, fewer --threads or a quieter machine" if unit == "operator" else ""
            lines.append(f"{total}; harness median {median_s * 1e3:.3f} ms: {unit}s took {1 - gap:.1%} of it, so launch overhead and gaps "
                         f"are not measurable here (the profiled steps ran slower than the timed ones: contention from other work, or the "
                         f"profiler's own cost{hint})")
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
    setup: Callable[[], object] | None = None,
    memory: bool = True,
) -> ProfileSummary:
    """Run `warmup` calls under the profiler (discarded: its own start-up is slow), then profile `steps` calls and summarise them.

    `setup` runs before every call, as before every timed sample (the L2 flush on CUDA), inside its
    own annotation and synchronized before the step's marker opens, so its work is never a step's.
    `memory=False` leaves allocations unrecorded (no peak in the summary; the profiler costs less).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    cuda = _is_cuda(device)
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def prepare() -> None:
        if setup is not None:
            with record_function(SETUP_MARKER):
                setup()
                sync()

    prepare()
    step()  # outside the profiler: a first call's compilation or allocation is not what a profile is asked about
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # The first steps under a freshly started profiler run several times slower (its own start-up, measured:
    # 2-4x on CPU in a new process), so `warmup` steps run profiled and are discarded by the schedule.
    plan = schedule(wait=0, warmup=warmup, active=steps, repeat=1) if warmup else schedule(wait=0, warmup=0, active=steps, repeat=1)
    with quiet_kineto(), profile(activities=activities, profile_memory=memory, record_shapes=False, schedule=plan) as prof:
        for i in range(warmup + steps):
            prepare()
            marker = f"{STEP_MARKER}{i - warmup}" if i >= warmup else "attnbench::profile_warmup"
            with record_function(marker):
                step()  # the result is dropped inside the marker, so its free is inside the step too
                sync()  # a step's kernels end before its marker closes: the marker bounds them
            prof.step()
    written = None
    if trace_path is not None:
        written = _trace_file(trace_path)
        prof.export_chrome_trace(written)  # torch gzips when the name ends with .gz
    return summarize(prof, device, steps, trace_path=written, memory=memory)


def summarize(prof: Any, device: str, steps: int, *, trace_path: str | None = None, memory: bool = True) -> ProfileSummary:
    """Summarise a finished `torch.profiler.profile` whose steps were marked with STEP_MARKER (reads `prof.events()`).

    `memory=False`: the profile recorded no allocations on purpose, so no peak is looked for.
    """
    cuda = _is_cuda(device)
    events = list(prof.events())
    kinds = [event_kind(e) for e in events]
    markers = sorted((e for e, kind in zip(events, kinds) if kind == STEP), key=lambda e: e.time_range.start)
    if len(markers) != steps:
        raise RuntimeError(f"the profile holds {len(markers)} step markers for {steps} steps")
    windows = [(m.time_range.start, m.time_range.end) for m in markers]
    step_windows = Windows(windows)
    setup_windows = Windows([(e.time_range.start, e.time_range.end) for e, kind in zip(events, kinds) if kind == SETUP])
    notes: list[str] = []

    cpu_ops = [e for e, kind in zip(events, kinds) if kind == HOST_OPERATOR]
    per_step = [0.0] * steps
    totals: dict[str, list[float]] = {}  # name -> [calls, seconds] over all steps
    outside = 0
    if cuda:
        counted = [(e, (e.time_range.end - e.time_range.start) / 1e6) for e, kind in zip(events, kinds) if kind == DEVICE_WORK]
    else:
        counted = [(e, e.self_cpu_time_total / 1e6) for e in cpu_ops]
    for e, seconds in counted:
        i = step_windows.index(e.time_range.start)
        if i is None:
            if setup_windows.index(e.time_range.start) is None:
                outside += 1  # the setup's own work (the flush) is expected outside the steps
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
    peak, peak_op, why = _memory_peak(prof, step_windows, cpu_ops, cuda) if memory else (None, None, None)
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
    prof: Any, windows: Windows, cpu_ops: Sequence[Any], cuda: bool,
) -> tuple[int | None, str | None, str | None]:
    """(peak bytes above a step's start, the operator whose allocation reached it, why either is None).

    From the profiler's raw allocation records: a running total per step, starting at zero at the
    step's start (so memory held before it, the inputs, is not counted), and the innermost operator
    on the allocating thread whose time span holds the allocation that set the highest total. One
    pass over the records sorted by time, each step's own found by binary search: a thousand steps
    of ten thousand records cost their sum, not their product.
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
    times = [t for t, _, _ in records]
    best: tuple[int, float, int] | None = None  # (bytes, time, thread)
    for start, end in windows.spans:
        running = 0
        for t, nbytes, thread in records[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
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
