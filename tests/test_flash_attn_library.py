"""The FlashAttention adapter against the libraries' real code: every call bound to the real signature, every limit to the real source.

Sources: FA2 and FA3 from flash-attn 2.8.3's sdist (flash_attn/flash_attn_interface.py,
hopper/flash_attn_interface.py, hopper/setup.py, csrc/flash_attn/flash_api.cpp), at
$ATTNBENCH_FLASH_ATTN_SDIST or <venv>/share/attnbench/flash_attn-2.8.3.tar.gz; FA4 from flash-attn-4
4.0.0b36 as installed, else its wheel ($ATTNBENCH_FLASH_ATTN4_WHEEL or beside the sdist). Its
interface.py does not import without the CUTLASS DSL, so its signatures are built from the source
with `ast` and its `_validate_head_dims` is run alone. A library that is
importable (on a GPU box) is bound through `inspect.signature` instead. FA3's hopper/flash_api.cpp
is not in the sdist: its d_v rule is quoted below (v2.8.3, :747-752). Only the kernels' math is
emulated (tests/library_contracts.flash_emulator): no real kernel runs without a GPU.
"""

from __future__ import annotations

import ast
import re
import types

import pytest

import harness.backends.flashattention.adapter as fa
from harness.backends.flashattention.adapter import FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend, flash_call, flash_ragged_call
from harness.backends.flashattention.rules import head_dim_refusal
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from tests.library_contracts import flash_emulator
from tests.ragged_fixtures import agrees, ragged_batch, serving_case
from tests.flash_attn_sources import BACKENDS, fa4_text, real_signature, sdist_text
from tests.real_signatures import function_from_source

#: hopper/flash_api.cpp (v2.8.3) :748-749, the condition FA3 checks when d_v ≠ d_k (its :745 bounds d_k by 256).
FA3_CPP_DV_CONDITION = ("(head_size > 128 && head_size <= 192 && head_size_v > 96 && head_size_v <= 128) || "
                        "(head_size <= 64 && head_size_v <= 512)")
FA3_DV_MESSAGE = ("If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] and V headdim in (96, 128], "
                  "or (Q/K <= 64 and V <= 512).")


def body(text: str, function: str) -> str:
    """The source of one top-level function."""
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function)
    return ast.get_source_segment(text, node)


def cuda_case(**fields) -> Case:
    """A dense bf16 CUDA case (what `supports` is asked), with `fields` changed."""
    return Case(**{**dict(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=64, d_v=64, dtype="bf16", device="cuda"), **fields})


DENSE = [Case(B=2, S_q=5, S_kv=9, H=4, H_kv=2, d_k=16, d_v=16, causal=True),
         Case(B=3, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, causal=True, padding=True, seed=3),
         Case(B=3, S_q=3, S_kv=20, H=4, H_kv=1, d_k=16, d_v=16, padding=True, seed=2)]
RAGGED = {"packed": ([3, 1, 4], [6, 9, 4], None), "paged-decode": ([1, 1, 1], [9, 4, 12], 4), "paged-mixed": ([3, 1, 2], [8, 5, 7], 4)}


# -- every call the adapter makes, bound to the library's real signature --


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("case", DENSE + [DENSE[0].replace(window=3)], ids=lambda c: c.id)
def test_dense_calls_bind_to_the_real_signature(generation, case):
    call = flash_call(case, make_inputs(case), none_window=BACKENDS[generation].none_window)
    assert call.function == ("flash_attn_varlen_func" if case.padding else "flash_attn_func")
    bound = real_signature(generation, call.function).bind(call.q, call.k, call.v, **call.kwargs)
    assert bound.arguments["q"] is call.q and bound.arguments["k"] is call.k and bound.arguments["v"] is call.v


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("shape", RAGGED)
def test_ragged_calls_bind_to_the_real_signature(generation, shape):
    lens_q, lens_kv, page_size = RAGGED[shape]
    call = flash_ragged_call(ragged_batch(lens_q, lens_kv, page_size=page_size, causal=True, seed=4), generation)
    bound = real_signature(generation, call.function).bind(*call.args, **call.kwargs)
    pool = "k_cache" if call.function == "flash_attn_with_kvcache" else "k"
    assert bound.arguments[pool] is call.args[1]
    if page_size:  # FA3 and FA4 refuse a page table with cu_seqlens_k ("page_table is not supported with cu_seqlens_k")
        assert generation == 2 or "cu_seqlens_k" not in call.kwargs


def test_a_call_the_library_does_not_take_fails_to_bind():
    with pytest.raises(TypeError):  # FA3's flash_attn_func has no dropout_p, FA2's has
        real_signature(3, "flash_attn_func").bind(1, 2, 3, dropout_p=0.0)
    real_signature(2, "flash_attn_func").bind(1, 2, 3, dropout_p=0.0)
    assert list(real_signature(4, "flash_attn_func").parameters)[3] == "qv"  # a 4th positional would be FA4's qv


def _library(generation, log, fail=None):
    """A stand-in module whose functions bind each call to the real signature, then run the emulated kernel math."""
    def function(name):
        signature = real_signature(generation, name)

        def call(*args, **kwargs):
            signature.bind(*args, **kwargs)  # a TypeError here is a call the library would not take
            log.append(name)
            if fail:
                raise fail(args, kwargs)
            return flash_emulator(name, args, kwargs), None
        return call
    names = ["flash_attn_func", "flash_attn_varlen_func"] + (["flash_attn_with_kvcache"] if generation != 4 else [])
    return types.SimpleNamespace(**{n: function(n) for n in names})


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("case", DENSE, ids=lambda c: c.id)
def test_dense_prepare_makes_one_untimed_trial_call_the_library_takes(monkeypatch, generation, case):
    log = []
    backend = BACKENDS[generation]()
    monkeypatch.setattr(backend, "_import", lambda: _library(generation, log))
    inputs = make_inputs(case)
    prepared = backend.prepare(case, inputs)
    name = "flash_attn_varlen_func" if case.padding else "flash_attn_func"
    assert log == [name] and prepared.notes["kernel"] == f"{backend.module}.{name}"  # the trial, untimed
    assert prepared.check(prepared.fn()).agree and log == [name, name]


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("shape", RAGGED)
def test_ragged_prepare_calls_what_the_library_takes(monkeypatch, generation, shape):
    lens_q, lens_kv, page_size = RAGGED[shape]
    log = []
    backend = BACKENDS[generation]()
    monkeypatch.setattr(backend, "_import", lambda: _library(generation, log))
    inputs = ragged_batch(lens_q, lens_kv, page_size=page_size, causal=True, seed=7)
    prepared = backend.prepare(serving_case(layout="paged" if page_size else "packed", page_size=page_size), inputs)
    assert len(log) == 1 and agrees(prepared.to_bhsd(prepared.fn()), inputs) and len(log) == 2


# -- a refusal met in the trial call is Unsupported in the library's words; a failure stays a failure --


def _raise(exc_type, message):
    return lambda args, kwargs: exc_type(message)


def test_fa4_dense_refusal_from_its_real_head_dim_check_is_unsupported(monkeypatch):
    validate = function_from_source(fa4_text(), "_validate_head_dims")

    def refuse(args, kwargs):
        try:  # FA4's own check, as on a B200 (sm100), for the call's head dims
            validate(args[0].shape[-1], args[2].shape[-1], 10, 8)
        except AssertionError as exc:
            return exc
        return RuntimeError("expected FA4 to refuse these head dims")

    case = Case(B=1, S_q=4, S_kv=4, H=2, H_kv=2, d_k=192, d_v=192)
    backend = FlashAttn4Backend()
    monkeypatch.setattr(backend, "_import", lambda: _library(4, [], fail=refuse))
    with pytest.raises(Unsupported, match=r"flash-attn4 flash_attn_func: .*\(192, 192\) is not supported on SM100"):
        backend.prepare(case, make_inputs(case))


@pytest.mark.parametrize("message", [FA3_DV_MESSAGE, "Only Hopper supports different V headdim"])
@pytest.mark.parametrize("layout", ["dense", "padded", "paged"])
def test_fa3_refusal_of_its_head_dims_is_unsupported_on_every_path(monkeypatch, message, layout):
    backend = FlashAttn3Backend()
    monkeypatch.setattr(backend, "_import", lambda: _library(3, [], fail=_raise(RuntimeError, message)))
    if layout == "paged":
        case, inputs = serving_case(layout="paged", page_size=4), ragged_batch([2, 1], [5, 9], page_size=4, seed=3)
    else:
        case = DENSE[layout == "padded"]
        inputs = make_inputs(case)
    with pytest.raises(Unsupported, match=re.escape(message.rstrip("."))):
        backend.prepare(case, inputs)


def test_fa2_paged_block_size_refusal_is_unsupported_and_failures_stay_failures(monkeypatch):
    words = re.search(r'"(Paged KV cache block size must be divisible by 256)"', sdist_text("csrc/flash_attn/flash_api.cpp")).group(1)
    inputs = ragged_batch([1, 1], [5, 9], page_size=4, seed=9)
    case = serving_case(layout="paged", page_size=4)
    backend = FlashAttn2Backend()
    monkeypatch.setattr(backend, "_import", lambda: _library(2, [], fail=_raise(RuntimeError, words)))
    with pytest.raises(Unsupported, match=f"flash-attn2 flash_attn_with_kvcache: {words}"):
        backend.prepare(case, inputs)
    for failure in ("CUDA error: an illegal memory access was encountered", "cu_seqlens_q must have dtype int32"):
        monkeypatch.setattr(backend, "_import", lambda: _library(2, [], fail=_raise(RuntimeError, failure)))
        with pytest.raises(RuntimeError, match=failure):
            backend.prepare(case, inputs)


# -- each generation's limits, against its source --


def test_fa2_head_dim_and_page_limits_are_flash_api_cpps_and_its_interface_pads():
    api, interface = sdist_text("csrc/flash_attn/flash_api.cpp"), sdist_text("flash_attn/flash_attn_interface.py")
    limit = int(re.search(r'TORCH_CHECK\(head_size <= (\d+), "FlashAttention forward only supports head dimension at most', api).group(1))
    page = int(re.search(r"TORCH_CHECK\(!paged_KV \|\| page_block_size % (\d+) == 0", api).group(1))
    assert "CHECK_SHAPE(v, batch_size, seqlen_k, num_heads_k, head_size);" in api  # one head_size for q, k and v
    assert "q_dtype == torch::kFloat16 || q_dtype == torch::kBFloat16" in api  # "FlashAttention only support fp16 and bf16 data type"
    pad = "q = torch.nn.functional.pad(q, [0, 8 - head_size_og % 8])"
    for cls in ("FlashAttnFunc", "FlashAttnVarlenFunc"):  # what flash_attn_func / flash_attn_varlen_func apply
        node = next(n for n in ast.parse(interface).body if isinstance(n, ast.ClassDef) and n.name == cls)
        assert pad in ast.get_source_segment(interface, node)
    fa2 = FlashAttn2Backend()
    assert fa2.supports(cuda_case(d_k=limit, d_v=limit)) is None
    assert fa2.supports(cuda_case(d_k=100, d_v=100)) is None  # padded to 104 by the interface itself
    assert str(limit) in fa2.supports(cuda_case(d_k=limit + 8, d_v=limit + 8))
    assert "d_v = d_k" in fa2.supports(cuda_case(d_k=192, d_v=128))
    assert "no fp32 kernel (it computes in bf16, fp16)" in fa2.supports(cuda_case(dtype="fp32"))
    paged = serving_case(device="cuda", dtype="bf16", layout="paged")
    assert f"multiple of {page}" in fa2.supports(paged.replace(page_size=page // 2))
    assert fa2.supports(paged.replace(page_size=2 * page)) is None


def _fa3_takes(d_k, d_v):
    """FA3's forward checks for fp16/bf16 (hopper/flash_api.cpp v2.8.3 :745, :747-751, :820-821)."""
    condition = FA3_CPP_DV_CONDITION.replace("&&", " and ").replace("||", " or ")
    same_or_allowed = d_v == d_k or eval(condition, {}, {"head_size": d_k, "head_size_v": d_v})
    return d_k <= 256 and d_k % 8 == 0 and d_v % 8 == 0 and same_or_allowed


def test_fa3_head_dim_rule_is_hopper_flash_api_cpps():
    fa3 = FlashAttn3Backend()
    assert "(128, 192]" in fa3.supports(cuda_case(d_k=128, d_v=64))
    for d_k, d_v in ((192, 128), (136, 104), (64, 32), (64, 512), (256, 256)):
        assert fa3.supports(cuda_case(d_k=d_k, d_v=d_v)) is None, (d_k, d_v)
    assert "256" in fa3.supports(cuda_case(d_k=64, d_v=512, mode="bwd"))  # mha_bwd: max(head_size, head_size_v) <= 256
    assert fa3.supports(serving_case(device="cuda", dtype="bf16", layout="paged", page_size=1)) is None
    dims = list(range(8, 584, 8)) + [4, 100, 132]
    for d_k in dims:  # the rule supports applies, over every head-dim pair up to 576
        for d_v in dims:
            refused = head_dim_refusal(3, d_k, d_v, backward=False, major=9)
            assert (refused is None) == _fa3_takes(d_k, d_v), (d_k, d_v, refused)


def test_fa3_runs_where_its_default_build_has_kernels_and_different_v_dims_on_hopper_only(monkeypatch):
    setup = sdist_text("hopper/setup.py")
    assert 'DISABLE_SM8x = os.getenv("FLASH_ATTENTION_DISABLE_SM80", "FALSE") == "TRUE"' in setup  # sm80 kernels by default
    assert '"arch=compute_90a,code=sm_90a"' in setup and "compute_100" not in setup.split("cc_flag = []")[1].split("\n\n")[0]
    assert FlashAttn3Backend.majors == (8, 9)
    monkeypatch.setattr(fa, "cuda_capability", lambda: (8, 0))
    assert "Only Hopper supports different V headdim" in FlashAttn3Backend().supports(cuda_case(d_k=192, d_v=128))
    assert FlashAttn3Backend().supports(cuda_case(d_k=128, d_v=128)) is None
    monkeypatch.setattr(fa, "cuda_capability", lambda: (9, 0))
    assert FlashAttn3Backend().supports(cuda_case(d_k=192, d_v=128)) is None


@pytest.mark.parametrize("major", [9, 10, 11, None])
def test_fa4_head_dims_are_its_real_validate_head_dims(monkeypatch, major):
    validate = function_from_source(fa4_text(), "_validate_head_dims")

    def takes(d_k, d_v, on):
        try:
            validate(d_k, d_v, on, 8)  # alignment 16 // element_size: 8 for fp16/bf16
        except AssertionError:
            return False
        return True

    monkeypatch.setattr(fa, "cuda_capability", lambda: None if major is None else (major, 0))
    backend = FlashAttn4Backend()
    for d_k in (4, 8, 64, 100, 128, 136, 192, 256, 264, 512):
        for d_v in (4, 8, 64, 96, 128, 136, 192, 256, 512, 520):
            real = takes(d_k, d_v, major) if major else takes(d_k, d_v, 9) or takes(d_k, d_v, 10)
            answer = backend.supports(cuda_case(d_k=d_k, d_v=d_v))
            assert (answer is None) == real, (major, d_k, d_v, answer)


def test_fa4_gpus_are_its_interfaces_and_it_refuses_what_sm80_and_sm120_lack(monkeypatch):
    text = fa4_text()
    supported = r'assert arch // 10 in \[([\d, ]+)\], "Unsupported compute capability'
    forward = [int(m) for m in re.search(supported, body(text, "_flash_attn_fwd")).group(1).split(",")]
    backward = [int(m) for m in re.search(supported, body(text, "_flash_attn_bwd")).group(1).split(",")]
    assert FlashAttn4Backend.majors == tuple(forward) and 8 not in backward
    assert 'assert page_table is None, "paged KV not supported on SM 8.0"' in text
    assert 'assert page_table is None, "Paged KV not supported on SM 12.0' in text
    paged = serving_case(device="cuda", dtype="bf16", layout="paged", page_size=16, causal=True)
    for major in (8, 12):
        monkeypatch.setattr(fa, "cuda_capability", lambda: (major, 0))
        assert "no paged KV" in FlashAttn4Backend().supports(paged)
    monkeypatch.setattr(fa, "cuda_capability", lambda: (8, 0))
    assert "no backward" in FlashAttn4Backend().supports(cuda_case(mode="bwd"))
    assert FlashAttn4Backend().supports(cuda_case()) is None
    monkeypatch.setattr(fa, "cuda_capability", lambda: (9, 0))
    assert FlashAttn4Backend().supports(paged) is None and FlashAttn4Backend().supports(cuda_case(mode="bwd")) is None


#: Dao-AILab/flash-attention hopper/flash_api.cpp (mha_fwd), as read for issue 45: FP8 e4m3 head dims align to 16, fp16/bf16 to 8.
FA3_CPP_ALIGNMENT = ("int const alignment = q_type == torch::kFloat8_e4m3fn ? 16 : 8;\n"
                     'TORCH_CHECK(head_size % alignment == 0, "head_size should be a multiple of " + std::to_string(alignment));\n'
                     'TORCH_CHECK(head_size_v % alignment == 0, "head_size_v should be a multiple of " + std::to_string(alignment));')


def test_fa3_fp8_head_dims_are_multiples_of_16_as_hopper_flash_api_cpp_checks():
    """hopper/flash_api.cpp's alignment (FA3_CPP_ALIGNMENT: that source is not in the 2.8.3 sdist, so its lines are quoted here)."""
    fa3 = FlashAttn3Backend()
    for d_k, d_v in ((72, 72), (64, 40), (24, 24), (136, 136)):  # multiples of 8, not of 16
        bf16, fp8 = cuda_case(d_k=d_k, d_v=d_v), cuda_case(d_k=d_k, d_v=d_v, dtype="fp8_e4m3")
        refused = fa3.supports(fp8)
        assert refused and "head_size should be a multiple of 16" in refused, (d_k, d_v, refused)
        if d_k == d_v:
            assert fa3.supports(bf16) is None, (d_k, d_v)
    for d in (64, 96, 128, 256):
        assert fa3.supports(cuda_case(d_k=d, d_v=d, dtype="fp8_e4m3")) is None, d
    for d_k in range(8, 264, 8):  # the rule, over every head dim up to 256: FP8 aligns to 16, bf16 to 8
        assert (head_dim_refusal(3, d_k, d_k, backward=False, major=9, fp8=True) is None) == (d_k % 16 == 0), d_k
        assert head_dim_refusal(3, d_k, d_k, backward=False, major=9) is None, d_k
