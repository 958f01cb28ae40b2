"""FP8 cases: quantized inputs with their descales, the reference over what the FP8 tensors hold, the FP8 eager bound,
bytes at one per element, and every FP8 row on the CPU either a real FP8 computation that agrees or unsupported with a reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.attention import theory
from harness.attention.fp8 import dequantized
from harness.suite.inputs import FP8_FORMATS, quantize
from harness.backends.pytorch.eager_fp8 import EagerFp8Backend
from harness.backends.flashattention.adapter import FlashAttn3Backend, flash_call
from harness.backends.registry import load_registry
from harness.checks.correctness import check_pair, plan_checks, run_checks
from harness.checks.gpu_plan import compiles
from harness.errors import UserError
from harness.suite.cases import Case, parse_case_id
from harness.suite.inputs import make_inputs
from tests.flash_attn_sources import real_signature
from tests.flashinfer_sources import needs_source


def _case(**fields) -> Case:
    return Case(**{"B": 2, "S_q": 48, "S_kv": 48, "H": 4, "H_kv": 2, "d_k": 32, "d_v": 32, "dtype": "fp8_e4m3", **fields})


@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_inputs_are_quantized_per_tensor_with_the_largest_element_on_the_formats_max(fmt):
    inputs = make_inputs(_case(dtype=fmt))
    top = torch.finfo(FP8_FORMATS[fmt]).max
    for name in ("q", "k", "v"):
        tensor, descale = getattr(inputs, name), inputs.descales[name]
        assert tensor.dtype == FP8_FORMATS[fmt] and descale.dtype == torch.float32
        assert float(tensor.float().abs().max()) == top  # nothing saturates, the range is used
    plain = make_inputs(_case(dtype="fp32"))  # the same seeded draw, unquantized
    error = (dequantized(inputs.q, inputs.descales["q"]) - plain.q).abs().max()
    assert 0 < float(error) <= float(plain.q.abs().max()) * 2.0 ** -(3 if fmt == "fp8_e4m3" else 2)


def test_an_fp8_kv_cache_quantizes_k_and_v_only():
    inputs = make_inputs(_case(dtype="bf16", kv_dtype="fp8_e5m2", S_q=1))
    assert inputs.q.dtype == torch.bfloat16 and inputs.k.dtype == inputs.v.dtype == torch.float8_e5m2
    assert set(inputs.descales) == {"k", "v"}


@pytest.mark.parametrize("fields, words", [
    ({"kv_dtype": "bf16", "dtype": "bf16"}, "not an FP8 format"),
    ({"kv_dtype": "fp8_e4m3", "dtype": "fp32"}, "beside fp16 or bf16 queries"),
    ({"softcap": 30.0}, "an FP8 case has no softcap"),
    ({"kv_dtype": "fp8_e4m3", "dtype": "bf16", "sinks": True}, "an FP8 case has no sinks"),
])
def test_fp8_fields_that_make_no_case_are_one_line(fields, words):
    with pytest.raises(UserError, match=words):
        _case(**fields)


def test_ids_name_the_formats_and_read_back():
    for case in (_case(), _case(dtype="fp8_e5m2", causal=True), _case(dtype="bf16", kv_dtype="fp8_e4m3", S_q=1, causal=True)):
        assert parse_case_id(case.id, "cpu") == case
    assert "-kvfp8_e4m3-" in _case(dtype="bf16", kv_dtype="fp8_e4m3", S_q=1, causal=True).id


def test_bytes_count_one_per_fp8_element_and_two_per_bf16_output():
    fp8, bf16 = _case(), _case(dtype="bf16")
    t8, t16 = theory.touched_bytes(fp8), theory.touched_bytes(bf16)
    assert {k: t8[k] * 2 for k in "qkv"} == {k: t16[k] for k in "qkv"} and t8["o"] == t16["o"]
    kv = _case(dtype="bf16", kv_dtype="fp8_e4m3", S_q=1)
    assert theory.kv_cache_bytes_per_token(kv) == 2 * (32 + 32) * 1 == theory.kv_cache_bytes_per_token(kv.replace(kv_dtype=None)) // 2
    assert theory.touched_bytes(kv)["q"] == 2 * 1 * 4 * 32 * 2  # bf16 queries stay two bytes


@pytest.mark.slow
def test_the_fp8_suite_on_the_cpu_agrees_or_says_why_never_errs(one_thread):
    plan = plan_checks(suite="fp8", backends=None, device="cpu")
    # A compiling backend meets every FP8 case (its refusal is the point here), not the bf16 baselines: a compile each
    # (about 10 s), and its bf16 agreement is tests/test_backends.py's compiled-backend test.
    pairs = [(case, backend) for case, backend in plan.pairs
             if not compiles(backend.family) or case.dtype in FP8_FORMATS or case.kv_dtype]
    assert any(compiles(backend.family) for _, backend in pairs), "no compiling backend meets an FP8 case"
    results = run_checks(pairs)
    verdicts = {(r.backend, r.verdict) for r in results}
    assert {v for _, v in verdicts} <= {"agree", "unsupported"}, [r for r in results if r.verdict not in ("agree", "unsupported")]
    fp8_rows = [r for r in results if r.case.dtype in FP8_FORMATS]
    assert {r.backend for r in fp8_rows if r.verdict == "agree"} == {"eager-fp8"}  # the CPU's one real FP8 path
    assert all(r.reason for r in fp8_rows if r.verdict == "unsupported")
    assert any(r.case.kv_dtype and r.verdict == "agree" for r in results)


class _ForgetsTheValueDescale(EagerFp8Backend):
    """An FP8 attention that scales P·V by K's descale instead of V's: the slip FP8 adapters make with three descales."""

    name = "fp8-wrong-descale"

    def prepare(self, case, inputs):
        """The honest FP8 call handed the wrong descale for V."""
        wrong = dataclasses.replace(inputs, descales={**inputs.descales, "v": inputs.descales["k"] * 1.05})
        return super().prepare(case, wrong)


class _WrongByFivePercent(EagerFp8Backend):
    """The honest FP8 attention with its output scaled by 0.95: wrong by 5 %, what the FP8 bound resolves (3 % it may not)."""

    name = "fp8-wrong-by-5pct"

    def prepare(self, case, inputs):
        """The honest call, its output scaled."""
        honest = super().prepare(case, inputs)
        return dataclasses.replace(honest, fn=lambda: (honest.fn().float() * 0.95).to(torch.bfloat16))


@pytest.mark.parametrize("wrong", [_ForgetsTheValueDescale, _WrongByFivePercent])
def test_the_fp8_bound_refuses_a_wrong_fp8_kernel_beside_the_honest_one(wrong, one_thread):
    case = _case(causal=True)
    assert check_pair(case, load_registry().get("eager-fp8")).verdict == "agree"
    assert check_pair(case, wrong()).verdict == "disagree"


def test_flash_attn3_fp8_call_binds_the_descales_to_the_real_signature():
    case = _case(S_q=64, S_kv=64, d_k=64, d_v=64, causal=True, device="cpu")
    call = flash_call(case, make_inputs(case))
    assert call.q.dtype == torch.float8_e4m3fn and call.kwargs["q_descale"].shape == (case.B, case.H_kv)
    bound = real_signature(3, "flash_attn_func").bind(call.q, call.k, call.v, **call.kwargs)
    assert {"q_descale", "k_descale", "v_descale"} <= set(bound.arguments)
    cuda = case.replace(device="cuda")
    assert FlashAttn3Backend().supports(cuda) is None  # e4m3 forward: FA3's FP8 path
    assert "has no FP8 kernel" in FlashAttn3Backend().supports(cuda.replace(dtype="fp8_e5m2"))  # FA3 takes e4m3 only
    assert "no bwd FP8" in FlashAttn3Backend().supports(cuda.replace(mode="bwd"))


@needs_source
def test_flashinfer_fp8_kv_decode_plans_the_cache_format_and_binds_its_scales_to_the_real_wrapper(monkeypatch):
    """FlashInfer's paged decode reads an FP8 cache: kv_data_type at plan(), k_scale and v_scale at run(), bound to its real source."""
    from harness.backends.flashinfer import adapter as fi
    from tests.flashinfer_sources import bind, prepared_calls

    case = _case(dtype="bf16", kv_dtype="fp8_e4m3", S_q=1, S_kv=32, causal=True)
    inputs = make_inputs(case)
    log, prepared = prepared_calls(monkeypatch, case, inputs)
    (_, _, _, plan), (_, _, run_args, run) = log[1], log[3]
    assert log[0][0] == fi.PAGED_DECODE and plan["kv_data_type"] == torch.float8_e4m3fn and plan["q_data_type"] == torch.bfloat16
    assert run == {"k_scale": float(inputs.descales["k"]), "v_scale": float(inputs.descales["v"])}
    assert run_args[1][0].dtype == torch.float8_e4m3fn  # the pages handed over are the FP8 cache itself
    for wrapper, method, args, kwargs in log:
        bind(wrapper, method, args, kwargs)
    assert "k_scale" in prepared.notes["kv_cache"]
    prefill = _case(dtype="bf16", kv_dtype="fp8_e4m3", S_q=4, S_kv=32, causal=True)
    with pytest.raises(Exception, match="paged decode only"):
        prepared_calls(monkeypatch, prefill, make_inputs(prefill))


def _replayed_on_cuda_rules(monkeypatch) -> list[tuple]:
    """Record every `torch._scaled_mm` call's operands; each is later replayed on meta tensors, where torch applies its CUDA checks."""
    calls, real = [], torch._scaled_mm

    def recording(a, b, **kwargs):
        calls.append((a.shape, a.stride(), a.dtype, b.shape, b.stride(), b.dtype))
        return real(a, b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    return calls


@pytest.mark.parametrize("shape", [dict(d_k=24, d_v=40, S_q=5, S_kv=37, causal=True), dict(d_k=8, d_v=8, S_q=1, S_kv=1),
                                   dict(d_k=72, d_v=56, S_q=48, S_kv=48)])
def test_every_scaled_mm_call_passes_torchs_cuda_checks_and_the_result_agrees(shape, monkeypatch, one_thread):
    """K and N multiples of 16, A row-major and B column-major: torch's own meta kernel (`_check_scaled_mm_sizes`, which applies
    the CUDA rules to meta tensors) accepts every call eager-fp8 makes, and the padded computation still agrees with the reference."""
    case = _case(**shape)
    calls = _replayed_on_cuda_rules(monkeypatch)
    assert check_pair(case, EagerFp8Backend()).verdict == "agree"
    assert calls
    monkeypatch.undo()  # the real operator again: on meta tensors, its meta kernel's (CUDA) checks
    one = torch.ones((), device="meta")
    for a_shape, a_stride, a_dtype, b_shape, b_stride, b_dtype in calls:
        a = torch.empty_strided(a_shape, a_stride, dtype=a_dtype, device="meta")
        b = torch.empty_strided(b_shape, b_stride, dtype=b_dtype, device="meta")
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)


def test_an_e5m2_case_is_refused_on_cuda_with_torchs_reason_and_still_computed_on_the_cpu(one_thread):
    """CUDA's `_scaled_mm` refuses two e5m2 operands (Blas.cpp): unsupported there, with the reason; the CPU's kernel takes them."""
    case = _case(dtype="fp8_e5m2")
    reason = EagerFp8Backend().supports(case.replace(device="cuda"))
    assert reason and "Multiplication of two Float8_e5m2 matrices is not supported" in reason
    assert EagerFp8Backend().supports(case.replace(device="cuda", dtype="fp8_e4m3")) is None
    assert check_pair(case, EagerFp8Backend()).verdict == "agree"


def test_a_scaled_mm_refusal_is_unsupported_in_prepare_never_in_the_timed_call(monkeypatch):
    """prepare makes one trial call: torch's refusal becomes `unsupported` with its words before anything is timed; another error stays one."""
    from harness.errors import Unsupported

    case = _case()
    inputs = make_inputs(case)

    def refusing(a, b, **kwargs):
        raise ValueError("Multiplication of two Float8_e5m2 matrices is not supported")

    monkeypatch.setattr(torch, "_scaled_mm", refusing)
    with pytest.raises(Unsupported, match="torch._scaled_mm refused this case: Multiplication of two Float8_e5m2"):
        EagerFp8Backend().prepare(case, inputs)

    def broken(a, b, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(torch, "_scaled_mm", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        EagerFp8Backend().prepare(case, inputs)
