"""The profiler's events as each supported torch builds them: 2.11 (no `activity_type`) and 2.13, CPU and CUDA.

The GPU box runs torch 2.11, whose `torch.autograd.profiler_util.FunctionEvent` has no `activity_type`
(2.13 added it), and on CUDA Kineto mirrors every `record_function` range onto the GPU timeline as a
`gpu_user_annotation` event of the same name (device type CUDA, `is_user_annotation` true: torch's
`is_user_annotation()` binding is true for USER_ANNOTATION and GPU_USER_ANNOTATION alike). The
doubles here carry exactly the attributes 2.11's FunctionEvent sets, so reading any other one fails
as it would there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from harness.measure import timers
from harness.profiling.profile import STEP_MARKER, profile_step, summarize
from harness.measure.stats import Stats
from harness.measure.timing import Measurement, Plan

REPO = Path(__file__).resolve().parents[1]

#: What torch 2.11's FunctionEvent.__init__ sets (torch/autograd/profiler_util.py), nothing more.
TORCH_2_11_ATTRIBUTES = (
    "id", "node_id", "name", "overload_name", "trace_name", "time_range", "thread", "fwd_thread", "kernels", "count",
    "cpu_children", "cpu_parent", "input_shapes", "concrete_inputs", "kwinputs", "stack", "scope", "use_device",
    "cpu_memory_usage", "device_memory_usage", "is_async", "is_remote", "sequence_nr", "device_type", "device_index",
    "device_resource_id", "is_legacy", "flops", "is_user_annotation", "self_cpu_percent", "total_cpu_percent",
    "total_device_percent", "metadata_json",
)


class Interval:
    """torch's Interval: start and end in microseconds."""

    def __init__(self, start, end):
        self.start, self.end = start, end


class Event211:
    """A FunctionEvent as torch 2.11 builds it: its attributes only (slots), self CPU time computed as 2.11 does."""

    __slots__ = TORCH_2_11_ATTRIBUTES

    def __init__(self, name, start, end, device_type=DeviceType.CPU, is_user_annotation=False, thread=1):
        for attribute in TORCH_2_11_ATTRIBUTES:
            setattr(self, attribute, None)
        self.name, self.time_range, self.thread, self.device_type = name, Interval(start, end), thread, device_type
        self.is_user_annotation, self.is_async, self.kernels, self.cpu_children = is_user_annotation, False, [], []
        self.device_resource_id = thread

    @property
    def self_cpu_time_total(self):
        """Its time less its children's, on the host only (2.11's property)."""
        if self.is_async or self.device_type != DeviceType.CPU:
            return 0
        return (self.time_range.end - self.time_range.start) - sum(
            c.time_range.end - c.time_range.start for c in self.cpu_children)


class Event213(Event211):
    """The same event as torch 2.13 builds it: with the Kineto activity type."""

    __slots__ = ("activity_type",)

    def __init__(self, *args, activity_type, **kwargs):
        super().__init__(*args, **kwargs)
        self.activity_type = activity_type


def nest(events):
    """Set cpu_children as torch does: each host event's direct children are the host events its span holds innermost."""
    host = sorted((e for e in events if e.device_type == DeviceType.CPU), key=lambda e: (e.time_range.start, -e.time_range.end))
    stack = []
    for e in host:
        while stack and not (e.time_range.start >= stack[-1].time_range.start and e.time_range.end <= stack[-1].time_range.end):
            stack.pop()
        if stack:
            stack[-1].cpu_children.append(e)
            e.cpu_parent = stack[-1]
        stack.append(e)
    return events


class FakeProfile:
    """What `summarize` reads of a finished torch.profiler.profile: its events (no raw allocation records)."""

    def __init__(self, events):
        self._events = events

    def events(self):
        return list(self._events)


CUDA = DeviceType.CUDA
GEMM = "ampere_sgemm_128x64_tn"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"


def cuda_profile(steps: int, shape: str, flush: bool = True):
    """A CUDA profile shaped as Kineto builds it: per step a host marker, its GPU mirror, an aten op, a launch, the kernel.

    With `flush`, each step is preceded by the between-step setup: its host annotation, the fill
    kernel it launches and that annotation's GPU mirror, all before the step's marker opens.
    """
    events = []

    def add(name, start, end, activity, device=DeviceType.CPU, annotation=False):
        if shape == "2.11":
            events.append(Event211(name, start, end, device, annotation))
        else:
            events.append(Event213(name, start, end, device, annotation, activity_type=activity))

    for i in range(steps):
        t = 1000.0 * (i + 1)
        if flush:
            add("attnbench::profile_setup", t - 300, t - 20, "user_annotation", annotation=True)
            add("aten::fill_", t - 290, t - 250, "cpu_op")
            add("cudaLaunchKernel", t - 280, t - 260, "cuda_runtime")
            add(FILL, t - 240, t - 60, "kernel", CUDA)
            add("attnbench::profile_setup", t - 240, t - 60, "gpu_user_annotation", CUDA, True)
            add("cudaDeviceSynchronize", t - 250, t - 30, "cuda_runtime")
        add(f"{STEP_MARKER}{i}", t, t + 400, "user_annotation", annotation=True)
        add("aten::bmm", t + 10, t + 60, "cpu_op")
        add("cudaLaunchKernel", t + 20, t + 40, "cuda_runtime")
        add(GEMM, t + 50, t + 250, "kernel", CUDA)
        add("Memset (Device)", t + 255, t + 265, "gpu_memset", CUDA)
        add(f"{STEP_MARKER}{i}", t + 50, t + 265, "gpu_user_annotation", CUDA, True)
        add("cudaDeviceSynchronize", t + 70, t + 390, "cuda_runtime")
    return FakeProfile(nest(events))


def cpu_profile(steps: int, shape: str):
    """A CPU profile: per step the marker, aten::matmul holding aten::bmm, and an unmatched allocation record."""
    events = []

    def add(name, start, end, activity, annotation=False):
        if shape == "2.11":
            events.append(Event211(name, start, end, is_user_annotation=annotation))
        else:
            events.append(Event213(name, start, end, is_user_annotation=annotation, activity_type=activity))

    for i in range(steps):
        t = 1000.0 * (i + 1)
        add(f"{STEP_MARKER}{i}", t, t + 500, "user_annotation", annotation=True)
        add("aten::matmul", t + 10, t + 410, "cpu_op")
        add("aten::bmm", t + 20, t + 400, "cpu_op")
        add("[memory]", t + 450, t + 450, None)  # torch passes no activity type for these
    return FakeProfile(nest(events))


# --- torch 2.11's events, and 2.13's: one answer -------------------------------------------------

@pytest.mark.parametrize("shape", ["2.11", "2.13"])
def test_cuda_profile_counts_each_step_marker_once_and_only_the_steps_kernels(shape):
    s = summarize(cuda_profile(5, shape), "cuda", 5)
    assert s.steps == 5 and len(s.step_wall_s) == 5
    by_name = {k.name: k for k in s.kernels}
    assert set(by_name) == {GEMM, "Memset (Device)"}  # not the flush's fill, not the annotations' GPU copies
    assert by_name[GEMM].calls_per_step == 1 and by_name[GEMM].time_s_per_step == pytest.approx(200e-6)
    assert s.kernel_time_s == pytest.approx(210e-6)
    assert s.top_kernel == GEMM and s.unit == "kernel"
    # The flush's kernel lies outside every step, inside the setup: expected, so no note about it.
    assert not any("outside" in n for n in s.notes), s.notes


@pytest.mark.parametrize("shape", ["2.11", "2.13"])
def test_cpu_profile_counts_self_time_of_operators_only(shape):
    s = summarize(cpu_profile(3, shape), "cpu", 3)
    by_name = {k.name: k for k in s.kernels}
    assert set(by_name) == {"aten::matmul", "aten::bmm"}
    assert by_name["aten::bmm"].time_s_per_step == pytest.approx(380e-6)
    assert by_name["aten::matmul"].time_s_per_step == pytest.approx(20e-6)
    assert s.step_wall_s == pytest.approx((500e-6,) * 3)


def test_both_torch_shapes_summarize_the_same():
    for device, build in (("cuda", cuda_profile), ("cpu", cpu_profile)):
        old, new = summarize(build(4, "2.11"), device, 4), summarize(build(4, "2.13"), device, 4)
        assert old == new


def test_a_device_event_outside_every_step_and_setup_is_still_noted():
    prof = cuda_profile(2, "2.11")
    prof._events.append(Event211(GEMM, 50.0, 60.0, CUDA))  # before the first setup: nobody's
    s = summarize(prof, "cuda", 2)
    assert any("1 device events started outside" in n for n in s.notes), s.notes


def hide_activity_type(monkeypatch):
    """Make the installed torch build its FunctionEvents without `activity_type`, as torch 2.11 does."""
    original = FunctionEvent.__init__

    def init_as_2_11(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self.activity_type

    monkeypatch.setattr(FunctionEvent, "__init__", init_as_2_11)


def test_a_real_cpu_profile_without_activity_type_summarizes(monkeypatch, one_thread):
    a = torch.randn(32, 64, 64)

    def step():
        return torch.softmax(a @ a, dim=-1)

    hide_activity_type(monkeypatch)
    s = profile_step(step, "cpu", steps=3, warmup=1)
    by_name = {k.name: k for k in s.kernels}
    assert by_name["aten::bmm"].calls_per_step == 1 and by_name["aten::_softmax"].calls_per_step == 1
    assert s.peak_memory_bytes is not None and s.peak_memory_op is not None


def test_real_events_classify_alike_with_and_without_activity_type(one_thread):
    from harness.profiling.profiler_events import event_kind
    from torch.profiler import ProfilerActivity, profile, record_function

    a = torch.randn(8, 32, 32)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(f"{STEP_MARKER}0"):
            torch.softmax(a @ a, dim=-1).sum()
    events = prof.events()
    kinds = [event_kind(e) for e in events]
    for e in events:
        del e.activity_type
    assert [event_kind(e) for e in events] == kinds
    assert kinds.count("step marker") == 1 and "host operator" in kinds


# --- the between-step setup (the L2 flush on CUDA) -----------------------------------------------

def test_profiled_steps_run_the_setup_before_each_step_and_never_count_it(one_thread):
    a = torch.randn(16, 32, 32)
    order = []

    def setup():
        order.append("setup")
        torch.ones(7).cumsum(0)  # an operator the step never runs: it must not appear in the profile

    def step():
        order.append("step")
        return a @ a

    s = profile_step(step, "cpu", steps=4, warmup=2, setup=setup)
    assert order == ["setup", "step"] * (1 + 2 + 4)  # the unprofiled first call, the warm-up, the steps
    names = {k.name for k in s.kernels}
    assert "aten::bmm" in names and "aten::cumsum" not in names


def test_the_pair_executor_profiles_with_the_between_sample_setup(monkeypatch):
    from harness.backends.registry import load_registry
    from harness.execution import execute
    from harness.execution.execute import Phases, run_pair
    from harness.measure.timing import Budget
    from harness.suite.cases import parse_case_id

    calls = []
    monkeypatch.setattr(execute, "between_sample_setup", lambda device, flush: lambda: calls.append(device))
    case = parse_case_id("B1-Sq32-Skv32-H2-Hkv2-dk16-fp32")
    phases = Phases(check=False, time=False, memory=False, profile=True, profile_steps=3)
    outcome = run_pair(case, load_registry(plugins=False).get("naive"), phases, budget=Budget(warmup_s=0.0, measure_s=0.001))
    assert outcome.profile is not None and outcome.profile.steps == 3
    assert calls == ["cpu"] * (1 + 2 + 3)


# --- --timer kernels ---------------------------------------------------------------------------------

def event_measurement(n: int) -> Measurement:
    """An events-timer measurement of n samples (what kernel_measurement replaces)."""
    plan = Plan(iterations=1, rounds=n, warmup_calls=1, warmup_s=0.0, call_s=1e-3)
    return Measurement(stats=Stats.from_samples([1e-3] * n, 1), plan=plan, clock_resolution_s=1e-9)


def test_kernel_timer_flushes_before_each_profiled_call_and_bounds_the_steps(one_thread):
    a = torch.randn(4, 16, 16)
    order = []

    def step():
        order.append("step")
        return a @ a

    measured = timers.kernel_measurement(event_measurement(1000), step, "cpu", setup=lambda: order.append("setup"))
    profiled = timers.KERNEL_TIMER_MAX_STEPS
    assert measured.stats.n == profiled < 1000  # the count profiled is the row's `samples`
    assert order == ["setup", "step"] * (order.count("step"))
    assert order.count("step") >= profiled


# --- the cost of summarising: no steps × records loop ----------------------------------------------

class CountedTime(float):
    """A step window's bound that counts the comparisons made against it."""

    compared = 0

    def _count(self, other, op):
        CountedTime.compared += 1
        return op(float(self), float(other))

    def __lt__(self, other): return self._count(other, float.__lt__)
    def __le__(self, other): return self._count(other, float.__le__)
    def __gt__(self, other): return self._count(other, float.__gt__)
    def __ge__(self, other): return self._count(other, float.__ge__)


class FakeRecord:
    """One raw allocation record of `kineto_results.events()`."""

    def __init__(self, t_ns, nbytes):
        self.t_ns, self.bytes = t_ns, nbytes

    def name(self): return "[memory]"
    def nbytes(self): return self.bytes
    def device_type(self): return DeviceType.CPU
    def start_ns(self): return self.t_ns
    def start_thread_id(self): return 1


class FakeResults:
    def __init__(self, records):
        self.records = records

    def trace_start_ns(self): return 0
    def events(self): return self.records


def test_the_memory_peak_and_step_windows_cost_records_plus_steps_not_their_product():
    steps, per_step = 200, 20
    prof = cpu_profile(steps, "2.13")
    for e in prof._events:
        if e.name.startswith(STEP_MARKER):
            e.time_range = Interval(CountedTime(e.time_range.start), CountedTime(e.time_range.end))
    records = []
    for i in range(steps):
        t_ns = 1000.0 * (i + 1) * 1e3
        # Inside aten::bmm: allocations rising to 3 MiB at the step's 10th record, then frees.
        records += [FakeRecord(t_ns + (30 + j) * 1e3, (2**20 if j < 3 else 0) if j < 10 else -(2**18)) for j in range(per_step)]
    prof.profiler = type("Profiler", (), {"kineto_results": FakeResults(records)})()
    CountedTime.compared = 0
    s = summarize(prof, "cpu", steps)
    assert s.peak_memory_bytes == 3 * 2**20 and s.peak_memory_op == "aten::bmm"
    n = len(records) + len(prof._events)
    # One pass with a binary search per window: a few comparisons per record and event at most,
    # where a loop over windows for every record makes steps × records (800,000 here).
    assert CountedTime.compared < 10 * (n + steps), CountedTime.compared


# --- Kineto's own log lines -------------------------------------------------------------------------

KINETO_LINE = re.compile(r"^(USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\]", re.M)


@pytest.mark.e2e
def test_attnbench_profile_prints_none_of_kinetos_log_lines(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "harness", "profile", "B1-Sq32-Skv32-H2-Hkv2-dk16-fp32", "--backend", "naive",
         "--steps", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "operator time:" in done.stdout
    assert not KINETO_LINE.search(done.stdout) and not KINETO_LINE.search(done.stderr), done.stderr


def test_what_else_reaches_stderr_during_profiling_still_does(capfd, one_thread):
    def step():
        os.write(2, b"a backend's own warning\n")
        return torch.ones(3) + 1

    profile_step(step, "cpu", steps=1, warmup=0)
    err = capfd.readouterr().err
    assert err.count("a backend's own warning\n") == 2  # the unprofiled first call and the profiled step
    assert not KINETO_LINE.search(err), err
