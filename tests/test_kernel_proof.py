"""The kernel proof: a backend that claims a kernel for a case gets one untimed profiled call, and a trace without it is flagged.

Run through the real executor on the CPU with the stand-ins of tests/kernel_claim_backends.py: one claims
torch._scaled_mm and runs bf16 matmuls (its row is kernel_mismatch, with the operators torch's profiler named, and
decides nothing), one claims it and calls it on float8 tensors (no mismatch), and a backend that claims nothing gets no
profiled call. No timing is asserted.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from harness.analysis.frame import agreeing_rows
from harness.analysis.trust import flags_of, left_out
from harness.backends.kernel_claims import KernelClaim, claimed_kernels, is_fp8_case, mismatch
from harness.backends.registry import load_registry
from harness.execution import kernel_proof
from harness.execution.execute import PairRunner, execute
from harness.execution.kernel_proof import MAX_KERNELS, kernels_column
from harness.measure.timing import Budget
from harness.profiling.kernel_trace import read_trace
from harness.report import build_report
from harness.results.record import Record
from harness.suite.cases import Case
from tests.kernel_claim_backends import Bf16ClaimsFp8Backend, ScaledMmBackend
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, write_run

#: A dense bf16 case: the stand-ins claim their FP8 kernel for it through their own `kernel_claim`.
CASE = Case(B=1, S_q=32, S_kv=32, H=2, H_kv=2, d_k=32, d_v=32, dtype="bf16")


@pytest.fixture
def runner():
    """A runner with the smallest budget: one or two timed rounds (the proof is what is under test, not the latency)."""
    return PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.001, min_rounds=1, max_rounds=2))


@pytest.fixture
def traced(monkeypatch):
    """Counts the profiled calls the kernel proof makes (it still makes them)."""
    calls = []
    real = kernel_proof.trace_kernels

    def counting(step, device):
        calls.append(device)
        return real(step, device)

    monkeypatch.setattr(kernel_proof, "trace_kernels", counting)
    return calls


def test_a_backend_that_claims_fp8_and_runs_bf16_matmuls_is_flagged_and_decides_nothing(runner, traced):
    record = execute(CASE, Bf16ClaimsFp8Backend(), runner)
    assert record.status.value == "ok" and record.agree is True  # its numbers are right: only the trace tells the path
    assert traced == ["cpu"]  # one profiled call, after the check
    assert record.kernel_mismatch is True
    reason = record.kernel_mismatch_reason
    assert reason.startswith("claims an FP8 kernel (_scaled_mm) but the trace shows none: ") and "aten::bmm" in reason
    assert reason.endswith("and a bf16 GEMM ran: aten::bmm(bf16)"), reason
    assert "aten::bmm" in record.kernels.split(";") and "aten::_scaled_mm" not in record.kernels
    assert "kernel_mismatch" in flags_of(record.to_dict())  # beside contended or suspect, which a busy machine may add
    honest = synthetic_record(CASE, "sdpa", 5.0)  # slower, but it ran what it says
    fast = Record.from_dict(record.to_dict())
    fast.latency_ms_median, fast.contended, fast.suspect = 0.001, False, False  # the kernel flag alone leaves it out
    frame = frame_of([honest, fast])
    assert agreeing_rows(frame)["backend"].tolist() == ["sdpa"]
    gone = left_out(frame[frame["status"] == "ok"])
    assert dict(gone.counts) == {"contended": 0, "suspect": 0, "kernel_mismatch": 1} and "quiet machine" not in gone.sentence()
    assert "fix the path (or the claim)" in gone.sentence()


def test_a_backend_that_claims_scaled_mm_and_calls_it_on_float8_tensors_meets_its_claim(runner, traced):
    record = execute(CASE, ScaledMmBackend(), runner)
    assert record.status.value == "ok" and traced == ["cpu"]
    assert record.kernel_mismatch is False and record.kernel_mismatch_reason is None
    assert record.kernels.split(";")[0] == "aten::_scaled_mm"  # the claimed operator first


def test_a_wide_gemm_inside_the_claimed_operator_is_no_fallback_and_one_beside_it_is():
    # Some CPU builds of torch's _scaled_mm multiply in fp32 inside themselves (an aten::mm below it), others not:
    # what the claim promises is that work *under* the claimed operator never counts against it.
    from harness.profiling.kernel_trace import KernelTrace, TracedGemm

    inside = TracedGemm("aten::mm", ("fp32",), ("aten::_scaled_mm", "ScaledMm.forward"))
    beside = TracedGemm("aten::bmm", ("bf16",), ("naive.forward",))
    claimed = matches_scaled_mm
    trace = KernelTrace("cpu", ("aten::_scaled_mm", "aten::mm"), ("aten::_scaled_mm", "aten::mm"), (inside,), True)
    assert trace.wide_gemms(claimed) == ()
    claim = KernelClaim((("FP8", ("_scaled_mm",)),), no_wide_gemms=True)
    assert mismatch(claim, trace.shown, trace.searched, trace.wide_gemms(claimed)) is None
    both = KernelTrace("cpu", trace.shown + ("aten::bmm",), trace.operators + ("aten::bmm",), (inside, beside), True)
    assert both.wide_gemms(claimed) == ("aten::bmm(bf16)",)
    assert mismatch(claim, both.shown, both.searched, both.wide_gemms(claimed)).endswith("a bf16 GEMM ran: aten::bmm(bf16)")


def matches_scaled_mm(name: str) -> bool:
    """The claim's own matcher for the FP8 operator, as the executor applies it."""
    from harness.backends.kernel_claims import matches

    return matches(name, ("_scaled_mm",))


def test_a_backend_without_a_claim_gets_no_profiled_call(runner, traced):
    record = execute(CASE, load_registry().get("naive"), runner)
    assert record.status.value == "ok" and traced == []
    assert record.kernels is None and record.kernel_mismatch is None and record.kernel_mismatch_reason is None


def test_eager_fp8_shows_scaled_mm_on_an_fp8_case(runner):
    registry = load_registry()
    if "eager-fp8" not in registry.names():
        pytest.skip("eager-fp8 is not registered in this checkout")
    record = execute(Case(B=1, S_q=32, S_kv=32, H=2, H_kv=2, d_k=32, d_v=32, dtype="fp8_e4m3"), registry.get("eager-fp8"), runner)
    assert record.status.value == "ok", record.reason
    assert record.kernel_mismatch is False and record.kernels.startswith("aten::_scaled_mm")


def test_a_profiler_that_fails_costs_the_proof_not_the_row(runner, monkeypatch):
    def broken(step, device):
        raise RuntimeError("profiler moved")

    monkeypatch.setattr(kernel_proof, "trace_kernels", broken)
    record = execute(CASE, Bf16ClaimsFp8Backend(), runner)
    assert record.status.value == "ok" and record.latency_ms_median is not None
    assert record.kernels is None and record.kernel_mismatch is None
    assert record.notes["kernel_proof_failed"].startswith("RuntimeError: profiler moved")


def test_claims_come_from_the_class_vars_by_the_case_kind():
    class Declares:
        fp8_kernels = ("_scaled_mm",)
        mla_kernels = ("flash_fwd_splitkv_mla",)

    fp8 = SimpleNamespace(dtype="fp8_e4m3", mla=False)
    kv_fp8 = SimpleNamespace(dtype="bf16", kv_dtype="fp8_e5m2", mla=False)
    mla = SimpleNamespace(dtype="bf16", mla=True)
    dense = SimpleNamespace(dtype="bf16", mla=False)
    assert is_fp8_case(fp8) and is_fp8_case(kv_fp8) and not is_fp8_case(dense)
    assert claimed_kernels(Declares(), fp8) == KernelClaim((("FP8", ("_scaled_mm",)),), no_wide_gemms=True)
    assert claimed_kernels(Declares(), kv_fp8).needs == (("FP8", ("_scaled_mm",)),)
    assert claimed_kernels(Declares(), mla) == KernelClaim((("MLA", ("flash_fwd_splitkv_mla",)),))
    assert claimed_kernels(Declares(), dense) is None
    assert claimed_kernels(object(), fp8) is None  # a backend declaring nothing claims nothing
    flashmla, flashinfer = load_registry().get("flashmla"), load_registry().get("flashinfer-mla")
    assert claimed_kernels(flashmla, mla) is not None and claimed_kernels(flashinfer, mla) is not None


def test_a_mismatch_line_says_what_is_missing_or_what_ran_instead():
    claim = KernelClaim((("FP8", ("_scaled_mm",)),), forbidden=("dequant",), no_wide_gemms=True)
    assert mismatch(claim, ["aten::_scaled_mm"], ["aten::_scaled_mm"]) is None
    partial = mismatch(claim, ["aten::_scaled_mm", "aten::bmm"], ["aten::_scaled_mm", "aten::bmm"], ["aten::bmm(bf16)"])
    assert partial == "claims an FP8 kernel (_scaled_mm) but a bf16 GEMM ran: aten::bmm(bf16)"
    banned = mismatch(claim, ["dequant_kernel", "sm90_fp8_gemm"], ["dequant_kernel", "aten::_scaled_mm"])
    assert banned == "claims an FP8 kernel (_scaled_mm) but a forbidden kernel ran: dequant_kernel"
    many = [f"kernel_{i}" for i in range(8)]
    assert mismatch(claim, many, many).endswith("kernel_4, kernel_5, …")


def test_the_kernels_column_lists_the_claimed_names_first_and_is_capped():
    names = [f"aten::op{i}" for i in range(MAX_KERNELS + 5)] + ["aten::_scaled_mm"]
    column = kernels_column(names, lambda n: "_scaled_mm" in n).split(";")
    assert column[0] == "aten::_scaled_mm" and len(column) == MAX_KERNELS + 1 and column[-1] == "+6 more"


class _Without211:
    """A FunctionEvent as torch 2.11 gives it: no `input_dtypes` (everything else passed through)."""

    def __init__(self, event):
        self._event = event

    def __getattr__(self, name):
        if name == "input_dtypes":
            raise AttributeError(name)
        return getattr(self._event, name)


def test_operand_dtypes_come_from_the_raw_kineto_events_where_function_events_lack_them():
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(1, 8, 16, dtype=torch.bfloat16), torch.randn(1, 16, 8, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.matmul(a, b)
    direct = read_trace(prof, "cpu")
    older = read_trace(SimpleNamespace(events=lambda: [_Without211(e) for e in prof.events()], profiler=prof.profiler), "cpu")
    assert [g.label for g in direct.gemms] == [g.label for g in older.gemms] and direct.gemms[0].label.endswith("(bf16)")
    assert direct.wide_gemms(lambda n: False) == older.wide_gemms(lambda n: False) != ()


def test_the_report_lists_a_mismatched_row_with_its_reason(tmp_path):
    wrong = synthetic_record(CASE, "claims-fp8-runs-bf16", 1.0)
    wrong.kernels, wrong.kernel_mismatch = "aten::bmm;aten::softmax", True
    wrong.kernel_mismatch_reason = "claims an FP8 kernel (_scaled_mm) but the trace shows none: aten::bmm, aten::softmax"
    page = build_report([write_run(tmp_path / "results" / "proof", [wrong, synthetic_record(CASE, "sdpa", 2.0)], peaks=PEAKS)],
                        out_root=tmp_path / "reports")
    section = page.read_text().split('<section id="flags">')[1].split("</section>")[0]
    assert "<b>kernel_mismatch</b>" in section and "one untimed call runs under torch.profiler" in section
    assert "claims an FP8 kernel (_scaled_mm) but the trace shows none" in section
    flagged = pd.read_csv(page.parent / "sample_flags.csv")
    assert flagged[["backend", "kernel_mismatch"]].values.tolist() == [["claims-fp8-runs-bf16", True]]
    assert "1 not running the kernel they claim" in page.read_text()


def test_what_the_library_planned_is_searched_beside_the_trace_and_listed_in_the_kernels_column(monkeypatch):
    """A kernel whose traced name holds no dtype is proved by Prepared.planned_kernels; without them the same trace is a mismatch."""
    from harness.execution.outcome import PairOutcome
    from harness.profiling.kernel_trace import KernelTrace
    from harness.results.record import Status

    class DecodeClaimsFp8:
        fp8_kernels = ("e4m3",)

    decode = "BatchDecodeWithPagedKVCacheKernel<(PosEncodingMode)0, 2u, Params>"
    monkeypatch.setattr(kernel_proof, "trace_kernels", lambda step, device: KernelTrace(device, (decode,), (), (), True))
    case = Case(B=1, S_q=1, S_kv=32, H=2, H_kv=2, d_k=32, d_v=32, dtype="bf16", kv_dtype="fp8_e4m3")
    bare, planned = PairOutcome(Status.OK), PairOutcome(Status.OK)
    kernel_proof.prove_kernels(case, DecodeClaimsFp8(), lambda: None, bare)
    module = "planned module batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16"
    kernel_proof.prove_kernels(case, DecodeClaimsFp8(), lambda: None, planned, (module,))
    assert bare.kernel_mismatch and "claims an FP8 kernel (e4m3)" in bare.kernel_mismatch
    assert planned.kernel_mismatch is None and planned.kernels == f"{module};{decode}"
