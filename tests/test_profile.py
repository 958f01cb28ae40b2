"""The profiling core: categories, the ncu helpers, and real torch.profiler output of real pairs on the CPU."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from harness.backends.registry import load_registry
from harness.measure.timing import Budget
from harness.profiling.categories import CATEGORIES, categorize, column_name
from harness.profiling.ncu import NCU_METRICS, ncu_available, ncu_command, parse_ncu_csv
from harness.profiling.profile import RECORD_COLUMNS, STEP_MARKER, KernelStat, ProfileSummary, profile_step
from harness.suite.cases import parse_case_id

CASE_ID = "B1-Sq512-Skv512-H8-Hkv8-dk64-fp32"
REGISTRY = load_registry(plugins=False)
MiB = 2**20


from scripts.profile_overhead import pair_step  # the step as the executor builds it, shared with the benchmark


#: The events each profile read (by the name it was taken under): a summary is judged against them, not against a time ratio.
PROFILE_EVENTS: dict[str, list] = {}


def profile_keeping_events(name: str, step, **kwargs):
    """`profile_step(step, "cpu", **kwargs)`, keeping the events its summary read in PROFILE_EVENTS[name]."""
    from harness.profiling import profile as profile_module

    real = profile_module.summarize

    def keep(prof, *args, **kw):
        PROFILE_EVENTS[name] = list(prof.events())
        return real(prof, *args, **kw)

    profile_module.summarize = keep
    try:
        return profile_step(step, "cpu", **kwargs)
    finally:
        profile_module.summarize = real


def own_and_total_s(name: str, operator: str, steps: int) -> tuple[float, float]:
    """An operator's self time and its time with children, per step, from the events profile `name` read."""
    events = [e for e in PROFILE_EVENTS[name] if e.name == operator or (operator.endswith("*") and e.name.startswith(operator[:-1]))]
    return (sum(e.self_cpu_time_total for e in events) / 1e6 / steps, sum(e.cpu_time_total for e in events) / 1e6 / steps)


@pytest.fixture(scope="module")
def naive(one_thread, tmp_path_factory):
    """The naive pair at CASE_ID, its step, and one profiled pass with a trace (its events in PROFILE_EVENTS["naive"])."""
    step = pair_step("naive", CASE_ID)
    trace = tmp_path_factory.mktemp("trace") / "naive.json"
    return step, profile_keeping_events("naive", step, steps=5, warmup=2, trace_path=trace)


# --- categorize -----------------------------------------------------------------------------------

CPU_NAMES = [
    ("aten::bmm", "matmul"), ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::baddbmm", "matmul"),
    ("aten::matmul", "matmul"), ("aten::linear", "matmul"),
    ("aten::_softmax", "softmax"), ("aten::softmax", "softmax"), ("aten::_softmax_backward_data", "softmax"),
    ("aten::_safe_softmax", "softmax"),
    ("aten::masked_fill_", "elementwise"), ("aten::masked_fill", "elementwise"), ("aten::mul", "elementwise"),
    ("aten::nan_to_num_", "elementwise"), ("aten::where", "elementwise"), ("aten::bitwise_not", "elementwise"),
    ("aten::copy_", "copy/expand"), ("aten::_to_copy", "copy/expand"), ("aten::expand", "copy/expand"),
    ("aten::repeat_interleave", "copy/expand"), ("aten::contiguous", "copy/expand"), ("aten::clone", "copy/expand"),
    ("aten::index_select", "copy/expand"), ("aten::view", "copy/expand"), ("aten::transpose", "copy/expand"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "fused attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "fused attention"),
    ("aten::_scaled_dot_product_efficient_attention", "fused attention"),
    ("aten::_flash_attention_forward", "fused attention"),
    # The dispatcher and the math path only dispatch: their own time is not a fused kernel's.
    ("aten::scaled_dot_product_attention", "other"), ("aten::_scaled_dot_product_attention_math", "other"),
    ("aten::empty", "other"), ("aten::sum", "other"),
    ("autograd::engine::evaluate_function: BmmBackward0", "other"), ("BmmBackward0", "other"),
    ("SoftmaxBackward0", "other"),
]

CUDA_NAMES = [
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)", "matmul"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matmul"),
    # Flash kernels are templated on cutlass types: fused attention must win over the matmul pattern.
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, false, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", "fused attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "fused attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0", "fused attention"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, false, false>(float*, float const*, int, int, int, bool const*, int, bool)", "softmax"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "softmax"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul>, 4, TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1> >(int, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul>, TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1>)", "elementwise"),
    # torch's copy runs inside elementwise_kernel: copy must win over elementwise.
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})", "copy/expand"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>(float*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)", "copy/expand"),
    ("Memcpy DtoD (Device -> Device)", "copy/expand"),
    ("Memset (Device)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)", "other"),
]


@pytest.mark.parametrize("name,category", CPU_NAMES + CUDA_NAMES, ids=lambda v: v[:48] if isinstance(v, str) else v)
def test_categorize(name, category):
    assert categorize(name) == category


def test_every_category_has_a_column_safe_name():
    columns = [column_name(c) for c in CATEGORIES]
    assert columns == ["profile_ms_matmul", "profile_ms_softmax", "profile_ms_elementwise", "profile_ms_copy_expand",
                       "profile_ms_fused_attention", "profile_ms_other"]
    assert all(c.isidentifier() for c in RECORD_COLUMNS) and len(set(RECORD_COLUMNS)) == len(RECORD_COLUMNS)


# --- the summary's arithmetic -----------------------------------------------------------------------

def summary_of(kernel_time_s: float) -> ProfileSummary:
    return ProfileSummary(
        device="cpu", steps=2, kernels=(KernelStat("aten::bmm", "matmul", 2.0, kernel_time_s, 1.0),),
        kernel_time_s=kernel_time_s, kernels_per_step=2.0, category_time_s={"matmul": kernel_time_s},
        top_kernel="aten::bmm", peak_memory_bytes=None, peak_memory_op=None, notes=("memory peak: not recorded",),
    )


def test_gap_share_is_the_median_not_covered_by_kernels():
    s = summary_of(8e-3)
    assert s.gap_share(10e-3) == pytest.approx(0.2)
    assert s.gap_share(4e-3) == pytest.approx(-1.0)  # reported as measured, not clamped
    assert s.gap_share(None) is None and s.gap_share(0.0) is None and s.gap_share(float("nan")) is None


def test_record_columns_are_stable_without_a_median_or_a_peak():
    columns = summary_of(8e-3).record_columns(None)
    assert tuple(columns) == RECORD_COLUMNS
    assert columns["profile_gap_share"] is None and columns["profile_ms_softmax"] == 0.0
    assert columns["profile_kernel_ms_per_step"] == pytest.approx(8.0)
    json.dumps(columns)
    table = summary_of(8e-3).format_table()
    assert "no harness median given" in table and "memory peak: not measured" in table and "note: memory peak: not recorded" in table


# --- real profiler output -------------------------------------------------------------------------

def test_naive_lists_the_matmuls_and_the_softmax(naive):
    _, s = naive
    by_name = {k.name: k for k in s.kernels}
    assert by_name["aten::bmm"].calls_per_step == 2 and by_name["aten::bmm"].category == "matmul"
    assert by_name["aten::_softmax"].calls_per_step == 1 and by_name["aten::_softmax"].category == "softmax"
    # The two matmuls, the softmax and the scale are the work; every other operator is a view, a copy or an allocation.
    work = {"aten::bmm", "aten::matmul", "aten::_softmax", "aten::softmax", "aten::mul"}
    assert {k.category for k in s.kernels if k.name not in work} <= {"copy/expand", "other"}, [(k.name, k.category) for k in s.kernels]
    # The top operator is the one with the most self time in the profile's own events (on a quiet machine a bmm or the
    # softmax; a preemption inside another operator's dispatch can make that one the top, and the summary must say so).
    own_time = {k.name: own_and_total_s("naive", k.name, s.steps)[0] for k in s.kernels}
    assert s.top_kernel == max(own_time, key=own_time.get), own_time
    assert sum(k.share for k in s.kernels) == pytest.approx(1.0)
    assert sum(s.category_time_s.values()) == pytest.approx(s.kernel_time_s)
    assert sum(s.step_kernel_time_s) / s.steps == pytest.approx(s.kernel_time_s)
    # aten::matmul counts its own time only (its dispatch), so the bmm inside is not counted twice: judged on the events.
    own, with_children = own_and_total_s("naive", "aten::matmul", s.steps)
    assert by_name["aten::matmul"].time_s_per_step <= own * (1 + 1e-9) and own < with_children
    assert s.steps == 5 and len(s.step_wall_s) == 5 and s.notes == ()


def test_naive_memory_peak_is_the_scores_and_weights(naive):
    _, s = naive
    # The scaled q copy (1 MiB) plus scores and weights (8 MiB each) are alive when softmax allocates.
    assert 16 * MiB <= s.peak_memory_bytes <= 18 * MiB
    assert s.peak_memory_op == "aten::_softmax"


def test_operators_self_time_lies_within_each_profiled_step(naive):
    _, s = naive
    # One thread: operators never overlap, so their self times fit inside the step the profiler timed around them, on
    # a busy machine too (a preemption lengthens the step at least as much). How close the sum comes to the harness's
    # median is a figure of the machine, measured by scripts/profile_overhead.py, not a test.
    assert len(s.step_kernel_time_s) == len(s.step_wall_s) == s.steps
    assert all(0 < k <= w * (1 + 1e-6) for k, w in zip(s.step_kernel_time_s, s.step_wall_s)), (s.step_kernel_time_s, s.step_wall_s)


def test_trace_is_gzip_chrome_json_with_aten_events(naive):
    _, s = naive
    assert s.trace_path is not None and s.trace_path.endswith(".json.gz")
    with gzip.open(s.trace_path, "rt") as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::bmm" in names and "aten::_softmax" in names
    assert {f"{STEP_MARKER}{i}" for i in range(s.steps)} <= names
    assert s.trace_path in s.format_table()


def test_record_columns_and_table_from_real_output(naive):
    _, s = naive
    median = s.kernel_time_s / 0.9
    columns = s.record_columns(median)
    assert tuple(columns) == RECORD_COLUMNS
    assert json.loads(json.dumps(columns)) == columns
    assert columns["profile_gap_share"] == pytest.approx(0.1)
    assert columns["profile_top_kernel"] == s.top_kernel
    assert columns["profile_ms_matmul"] > 0 and columns["profile_ms_softmax"] > 0
    assert columns["profile_kernels_per_step"] == pytest.approx(s.kernels_per_step)
    table = s.format_table(median)
    assert "aten::bmm" in table and "aten::_softmax" in table
    assert "launch overhead and gaps 10.0%" in table and "reached in aten::_softmax" in table


def test_sdpa_shows_the_fused_cpu_flash_kernel(one_thread):
    step = pair_step("sdpa", CASE_ID)
    s = profile_step(step, "cpu", steps=5)
    assert s.top_kernel == "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert s.category_time_s["fused attention"] > 0.8 * s.kernel_time_s
    assert s.category_time_s["matmul"] == 0 and s.category_time_s["softmax"] == 0


def test_backward_counts_autograd_once(one_thread):
    s = profile_keeping_events("backward", pair_step("naive", "B1-Sq128-Skv128-H4-Hkv4-dk32-fp32-causal-fwd_bwd"), steps=3)
    by_name = {k.name: k for k in s.kernels}
    assert by_name["aten::_softmax_backward_data"].category == "softmax"
    assert by_name["aten::bmm"].calls_per_step == 6  # two forward, four backward
    # Autograd's engine frames are bookkeeping: listed, but as "other" and with only their own time, never the time of
    # the backward operators inside them (which are counted as themselves). Judged on the profile's own events, so that
    # a preemption landing in a frame (a busy machine) changes both sides alike.
    engine = [k for k in s.kernels if k.name.startswith("autograd::engine")]
    assert engine and all(k.category == "other" for k in engine)
    own, with_children = own_and_total_s("backward", "autograd::engine*", s.steps)
    counted = sum(k.time_s_per_step for k in engine)
    assert counted <= own * (1 + 1e-9) and own < with_children, (counted, own, with_children)


def test_profile_step_refuses_what_it_cannot_do():
    with pytest.raises(ValueError):
        profile_step(lambda: None, "cpu", steps=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            profile_step(lambda: None, "cuda")


# --- Nsight Compute helpers (no ncu here: the command is built and its CSV parsed, never run) -----

def test_ncu_available_says_why_not_without_ncu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = ncu_available()
    assert reason is not None and "ncu" in reason and "\n" not in reason
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert ncu_available() is None


def test_ncu_command_runs_the_argv_with_the_metric_set():
    argv = ["python", "-m", "harness", "profile", CASE_ID, "--backend", "sdpa", "--device", "cuda"]
    cmd = ncu_command(argv, launch_count=20, profile_from_start=False)
    assert cmd[0] == "ncu" and cmd[-len(argv):] == argv
    assert "--csv" in cmd
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(NCU_METRICS)
    assert cmd[cmd.index("--launch-count") + 1] == "20"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    with pytest.raises(ValueError):
        ncu_command([])


# ncu's details page (`ncu --csv --metrics …`): one row per (launch, metric), after ncu's own lines.
NCU_DETAILS = '''==PROF== Connected to process 4242 (/usr/bin/python3.11)
==PROF== Profiling "flash_fwd_kernel" - 0: 0%....50%....100% - 4 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.11","127.0.0.1","void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>(pytorch_flash::Flash_fwd_params)","1","7","(128, 1, 1)","(4, 16, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","31.52"
"0","4242","python3.11","127.0.0.1","void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>(pytorch_flash::Flash_fwd_params)","1","7","(128, 1, 1)","(4, 16, 1)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","%","n/a"
"0","4242","python3.11","127.0.0.1","void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>(pytorch_flash::Flash_fwd_params)","1","7","(128, 1, 1)","(4, 16, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","62.08"
"0","4242","python3.11","127.0.0.1","void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>(pytorch_flash::Flash_fwd_params)","1","7","(128, 1, 1)","(4, 16, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","12.40"
"1","4242","python3.11","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)","1","7","(128, 1, 1)","(1,024, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","1,234.5"
the program's own last line
'''

# ncu's raw page (`--page raw --csv`): one row per launch, a column per metric, units in the second row.
NCU_RAW = '''"ID","Process ID","Process Name","Host Name","Kernel Name","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","%","%"
"0","4242","python3.11","127.0.0.1","ampere_sgemm_128x64_tn","71.5","45.25"
'''


def test_parse_ncu_details_csv():
    launches = parse_ncu_csv(NCU_DETAILS)
    assert [(k.launch_id, categorize(k.kernel)) for k in launches] == [(0, "fused attention"), (1, "elementwise")]
    flash = launches[0]
    assert flash.metrics == {
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 31.52,
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": None,  # n/a: not a number
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": 62.08,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 12.40,
    }
    assert flash.units["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
    assert launches[1].metrics["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 1234.5  # thousands separator


# A Hopper kernel that issues wgmma (cuDNN's fused attention): the HMMA pipe reads ~0, the gmma pipe is the busy one.
NCU_HOPPER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",'
    '"Section Name","Metric Name","Metric Unit","Metric Value"\n'
    + "".join(f'"0","4242","python3.12","127.0.0.1","cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg_128x128x128_4x1x1_kernel0",'
              f'"1","7","(384, 1, 1)","(32, 32, 1)","0","9.0","Command line profiler metrics","{name}","%","{value}"\n'
              for name, value in [("dram__throughput.avg.pct_of_peak_sustained_elapsed", "22.10"),
                                  ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "61.73"),
                                  ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "0.02"),
                                  ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "58.40"),
                                  ("sm__warps_active.avg.pct_of_peak_sustained_active", "18.75")])
)


def test_ncu_on_hopper_asks_for_the_wgmma_pipe_and_reads_the_busier_tensor_pipe():
    from harness.profiling.ncu import GMMA_TENSOR_METRIC, HMMA_TENSOR_METRIC, ncu_metrics, ncu_readings

    assert GMMA_TENSOR_METRIC in ncu_metrics((9, 0)) and HMMA_TENSOR_METRIC in ncu_metrics((9, 0))
    assert GMMA_TENSOR_METRIC not in ncu_metrics((8, 0)) and GMMA_TENSOR_METRIC not in ncu_metrics(None)  # ncu refuses unknown metrics
    hopper = ncu_command(["python"], metrics=ncu_metrics((9, 0)))
    assert GMMA_TENSOR_METRIC in hopper[hopper.index("--metrics") + 1].split(",")
    [kernel] = parse_ncu_csv(NCU_HOPPER)
    assert ncu_readings(kernel) == {"SM throughput": 58.40, "DRAM throughput": 22.10, "tensor pipes": 61.73, "achieved occupancy": 18.75}
    [ampere] = parse_ncu_csv(NCU_DETAILS)[:1]
    assert ncu_readings(ampere)["tensor pipes"] is None  # n/a, and no wgmma metric asked: nothing to report, not 0


def test_parse_ncu_raw_csv_and_nothing():
    [launch] = parse_ncu_csv(NCU_RAW)
    assert launch.launch_id == 0 and launch.kernel == "ampere_sgemm_128x64_tn"
    assert launch.metrics == {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 71.5,
                              "sm__warps_active.avg.pct_of_peak_sustained_active": 45.25}
    assert launch.units["sm__warps_active.avg.pct_of_peak_sustained_active"] == "%"
    assert parse_ncu_csv("==PROF== No kernels were profiled.\n") == []


def test_a_failing_profiler_costs_the_profile_columns_not_the_rows_timing(monkeypatch):
    """Issue 18: a profiler that raises (a torch whose events moved) left every `run --profile` row an error, its timing lost."""
    import pandas as pd

    from harness.execution import execute
    from harness.execution.execute import Phases, run_pair
    from harness.execution.outcome import to_record
    from harness.report.profiling import profiling_section
    from harness.report.writer import Table

    def broken_profiler(*args, **kwargs):
        raise AttributeError("'FunctionEvent' object has no attribute 'activity_type'")

    monkeypatch.setattr(execute, "profile_step", broken_profiler)
    case = parse_case_id("B1-Sq64-Skv64-H2-Hkv2-dk16-fp32")
    backend = load_registry().get("naive")
    outcome = run_pair(case, backend, Phases(profile=True), budget=Budget(warmup_s=0.001, measure_s=0.005, min_sample_s=0.0))
    record = to_record(case, backend, outcome)
    assert record.status == "ok" and record.latency_ms_median > 0 and record.agree is True
    assert record.profile_kernel_ms_per_step is None
    assert "activity_type" in record.notes["profile_failed"] and "AttributeError" in record.notes["profile_failed"]
    section = profiling_section(pd.DataFrame([record.to_dict()]))
    tables = [part for part in section.blocks if isinstance(part, Table)]
    assert tables and "activity_type" in tables[-1].frame["profile_failed"].iloc[0]
