"""The serving layouts' library translations (FlashAttention, xFormers, FlashInfer), checked on the CPU.

The kernels need a GPU, so each translation is fed to an emulation of its library's DOCUMENTED
contract in plain torch, reading cu_seqlens, block tables, CSR page indices and last-page lengths
exactly as the library defines them and refusing what the library would misread (a -1 page, a
last_page_len outside [1, page_size]); the result must match each sequence's own float64 reference.
Mutation checks show the emulations are strict enough to catch the usual translation bugs.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from harness.backends.flashattention.adapter import FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend, flash_ragged_call
from harness.backends.flashinfer.adapter import (
    PAGED_DECODE, PAGED_PREFILL, RAGGED_PREFILL, FlashinferBackend, flashinfer_call, flashinfer_dense_call,
)
from harness.attention.numerics import check_forward
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from tests.library_contracts import flash_emulator, flashinfer_emulator, flashinfer_window_emulator, xformers_emulator
from tests.ragged_fixtures import agrees, ragged_batch, serving_case

#: (seq_lens_q, seq_lens_kv): a prefill batch, chunked prefill over a longer cache, decode, speculative decoding.
BATCHES = {
    "prefill": ([5, 3, 7], [5, 3, 7]),
    "chunked": ([4, 2, 6], [9, 13, 6]),
    "decode": ([1, 1, 1, 1], [7, 16, 3, 11]),
    "spec": ([3, 3, 3], [10, 5, 17]),
}
PAGE_SIZES = (1, 4, 16)


def batches(paged: bool):
    """(id, RaggedInputs) for every batch shape, causal and not, over several page sizes when paged."""
    out = []
    for name, (lq, lkv) in BATCHES.items():
        for causal in (False, True):
            for ps in (PAGE_SIZES if paged else (None,)):
                out.append(pytest.param(ragged_batch(lq, lkv, causal=causal, page_size=ps, seed=len(out)),
                                        id=f"{name}-{'causal' if causal else 'full'}" + (f"-ps{ps}" if ps else "")))
    return out


# -- FlashAttention: varlen (cu_seqlens), kvcache (cache_seqlens + block_table/page_table), FA4's seqused_k --


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("inputs", batches(paged=False))
def test_flash_packed_translation_meets_the_reference(inputs, generation):
    call = flash_ragged_call(inputs, generation)
    assert call.function == "flash_attn_varlen_func"
    assert agrees(call.to_packed(flash_emulator(call.function, call.args, call.kwargs)), inputs)


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("inputs", batches(paged=True))
def test_flash_paged_translation_meets_the_reference(inputs, generation):
    call = flash_ragged_call(inputs, generation)
    uniform = len(set(inputs.seq_lens_q)) == 1
    expected = "flash_attn_with_kvcache" if (generation != 4 and (uniform or generation == 3)) else "flash_attn_varlen_func"
    assert call.function == expected
    assert ("block_table" if generation == 2 else "page_table") in call.kwargs
    assert call.args[1] is not inputs.k and call.args[1].shape == inputs.k_pages.shape  # the pool as it lies, never gathered
    assert agrees(call.to_packed(flash_emulator(call.function, call.args, call.kwargs)), inputs)


def test_flash_emulator_catches_pages_assumed_in_order_and_unused_entries_left_at_minus_one():
    inputs = ragged_batch([1, 1, 1], [7, 2, 9], page_size=4, seed=3)
    call = flash_ragged_call(inputs, 2)
    in_order = torch.arange(call.kwargs["block_table"].numel(), dtype=torch.int32).view_as(call.kwargs["block_table"])
    assert not agrees(call.to_packed(flash_emulator(call.function, call.args, {**call.kwargs, "block_table": in_order})), inputs)
    with pytest.raises(AssertionError, match="outside the pool"):
        flash_emulator(call.function, call.args, {**call.kwargs, "block_table": inputs.block_table.clone()})
    assert (inputs.block_table == -1).any()  # the batch really has unused entries to get wrong


def test_flash_paged_limits_are_the_libraries_own():
    cuda = serving_case(device="cuda", dtype="bf16", layout="paged", causal=True)
    fa2 = FlashAttn2Backend().supports(cuda.replace(page_size=16))
    assert fa2 and "multiple of 256" in fa2 and "page_size=16" in fa2
    assert FlashAttn2Backend().supports(cuda.replace(page_size=512)) is None
    for backend in (FlashAttn3Backend(), FlashAttn4Backend()):
        assert backend.supports(cuda.replace(page_size=1)) is None  # FA3: "page_block_size can be arbitrary"
    assert "paged KV cache" in FlashAttn2Backend().supports(cuda.replace(page_size=256, mode="bwd"))
    assert "padded" in FlashAttn2Backend().supports(cuda.replace(layout="padded", page_size=None))


# -- xFormers: block-diagonal biases on one packed sequence; paged biases over the flattened page pool --


def _xformers_bias():
    from tests.xformers_real import real_fmha  # imports xformers.ops even beside flash-attn-4 alone

    return real_fmha().attn_bias


@pytest.mark.parametrize("inputs", batches(paged=False) + batches(paged=True))
def test_xformers_translation_meets_the_reference(inputs):
    from harness.backends.xformers.adapter import xformers_ragged_call

    call = xformers_ragged_call(inputs, _xformers_bias())
    expected = ("Paged" if inputs.block_table is not None else "") + ("BlockDiagonalCausal" if inputs.causal else "BlockDiagonal")
    assert type(call.attn_bias).__name__.startswith(expected)
    assert agrees(call.out_to_bhsd(xformers_emulator(call)), inputs)


def test_xformers_paged_bias_reads_the_block_table_it_is_given():
    from harness.backends.xformers.adapter import xformers_ragged_call

    inputs = ragged_batch([1, 1], [9, 6], page_size=4, seed=5)
    good = xformers_ragged_call(inputs, _xformers_bias())
    in_order = dataclasses.replace(inputs, block_table=torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32))
    wrong = xformers_ragged_call(in_order, _xformers_bias())
    wrong.k, wrong.v = good.k, good.v
    assert agrees(good.out_to_bhsd(xformers_emulator(good)), inputs)
    assert not agrees(wrong.out_to_bhsd(xformers_emulator(wrong)), inputs)
    assert int(good.attn_bias.block_tables.min()) >= 0  # no -1 reaches xFormers


def test_xformers_causal_block_with_more_queries_than_keys_is_unsupported_with_xformers_reason():
    from harness.backends.xformers.adapter import xformers_ragged_call

    with pytest.raises(Unsupported, match="num_keys >= num_queries"):
        xformers_ragged_call(ragged_batch([4, 2], [2, 5], causal=True), _xformers_bias())


# -- FlashInfer: ragged prefill (qo_indptr, kv_indptr); paged decode and prefill (CSR pages, last_page_len) --


@pytest.mark.parametrize("inputs", batches(paged=False) + batches(paged=True))
def test_flashinfer_translation_meets_the_reference(inputs):
    call = flashinfer_call(inputs, torch.float32)
    decode = set(inputs.seq_lens_q) == {1}
    expected = RAGGED_PREFILL if inputs.block_table is None else (PAGED_DECODE if decode else PAGED_PREFILL)
    assert call.wrapper == expected
    assert agrees(call.to_checked(flashinfer_emulator(call)), inputs)


@pytest.mark.parametrize("wrapper_batch", [([1, 1, 1], [9, 4, 12]), ([3, 2, 4], [9, 4, 12])], ids=["decode", "prefill"])
def test_flashinfer_emulator_catches_last_page_len_off_by_one_and_pages_assumed_in_order(wrapper_batch):
    inputs = ragged_batch(*wrapper_batch, page_size=4, causal=True, seed=11)
    call = flashinfer_call(inputs, torch.float32)
    last_key = "last_page_len" if call.wrapper == PAGED_DECODE else "paged_kv_last_page_len"
    index_key = "indices" if call.wrapper == PAGED_DECODE else "paged_kv_indices"
    assert agrees(flashinfer_emulator(call), inputs)

    def mutated(**changes):
        return dataclasses.replace(call, plan_args={**call.plan_args, **changes})

    last = call.plan_args[last_key]
    assert last.tolist() == [1, 4, 4]
    # One token too many where the last page has room: a slot the sequence never wrote is read.
    assert not agrees(flashinfer_emulator(mutated(**{last_key: last + (last < 4).int()})), inputs)
    # One too few where the last page holds more than one token: a real key is dropped.
    assert not agrees(flashinfer_emulator(mutated(**{last_key: last - (last > 1).int()})), inputs)
    # kv_len % page_size gives 0 for a full last page, which FlashInfer's layout forbids.
    with pytest.raises(AssertionError, match="last_page_len 0"):
        flashinfer_emulator(mutated(**{last_key: last % 4}))
    in_order = torch.arange(len(call.plan_args[index_key]), dtype=torch.int32)
    assert not agrees(flashinfer_emulator(mutated(**{index_key: in_order})), inputs)


def test_flashinfer_dense_prefill_decode_and_window_meet_the_dense_reference():
    for case in (Case(B=2, S_q=6, S_kv=6, H=4, H_kv=2, d_k=16, d_v=16, causal=True),
                 Case(B=3, S_q=1, S_kv=9, H=4, H_kv=1, d_k=16, d_v=16),
                 Case(B=2, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, window=3)):
        inputs = make_inputs(case)
        call = flashinfer_dense_call(case, inputs)
        assert call.wrapper == (PAGED_DECODE if case.S_q == 1 else RAGGED_PREFILL)
        emulated = flashinfer_window_emulator(call) if case.window else flashinfer_emulator(call)
        assert check_forward(case, inputs, call.to_checked(emulated)).agree, case.id


def test_flashinfer_is_unavailable_here_with_a_reason_and_refuses_what_it_cannot_serve():
    backend = FlashinferBackend()
    reason = backend.available()
    if not torch.cuda.is_available():
        assert reason and ("not installed" in reason or "needs CUDA" in reason)
    cuda = serving_case(device="cuda", dtype="bf16", layout="paged", page_size=16)
    assert backend.supports(cuda) is None
    assert "no fp32 kernel (it computes in bf16, fp16)" in backend.supports(cuda.replace(dtype="fp32"))
    assert "no backward" in backend.supports(cuda.replace(mode="fwd_bwd"))
    assert "no CPU kernel" in backend.supports(cuda.replace(device="cpu"))
    assert "padded" in backend.supports(cuda.replace(layout="padded", page_size=None))
    with pytest.raises(Unsupported, match="at least one KV token"):
        flashinfer_call(dataclasses.replace(ragged_batch([1, 1], [3, 1], page_size=2), seq_lens_kv=(3, 0)), torch.float32)


def test_flashinfer_is_registered():
    from harness.backends.registry import load_registry

    registry = load_registry(plugins=False)
    assert "flashinfer" in registry.names()
    assert registry.get("flashinfer").layouts == {"dense", "packed", "paged"}


def test_fixture_pages_are_scattered_with_spares_and_minus_one_for_unused_entries():
    inputs = ragged_batch([1, 1], [9, 2], page_size=4, seed=1)
    table = inputs.block_table
    assert table.tolist()[1][1:] == [-1, -1] and inputs.k_pages.shape[0] == 3 + 1 + 3
    used = table[table >= 0]
    assert len(set(used.tolist())) == len(used) and used.tolist() != sorted(used.tolist())
    assert math.isclose(float(inputs.k_pages[int(table[0, 2]), 0, 0, 0]), float(inputs.k[8, 0, 0]))


# -- each adapter's prepare(), wired to a stand-in library that runs the emulation above --


def _module(name, **attrs):
    import types

    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


@pytest.mark.parametrize("backend_cls", [FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend])
@pytest.mark.parametrize("page_size", [None, 4], ids=["packed", "paged"])
def test_flash_prepare_calls_the_named_function_and_returns_packed_rows(monkeypatch, backend_cls, page_size):
    import sys

    called = []

    def kernel(name):
        def call(*args, **kwargs):
            called.append(name)
            return flash_emulator(name, args, kwargs), None  # (out, lse), as some versions return
        return call

    fake = _module(backend_cls.module, flash_attn_varlen_func=kernel("flash_attn_varlen_func"),
                   flash_attn_with_kvcache=kernel("flash_attn_with_kvcache"))
    monkeypatch.setitem(sys.modules, backend_cls.module, fake)
    inputs = ragged_batch([1, 1, 1], [9, 4, 12], page_size=page_size, causal=True, seed=2)
    case = serving_case(device="cuda", dtype="bf16", layout="packed" if page_size is None else "paged", page_size=page_size)
    prepared = backend_cls().prepare(case, inputs)
    assert len(called) == 1 and prepared.notes["layout"] == case.layout  # the untimed probe call
    assert agrees(prepared.to_bhsd(prepared.fn()), inputs)
    assert called == called[:1] * 2 and prepared.notes["kernel"].endswith(called[0])


def test_flashinfer_prepare_plans_once_untimed_and_runs_the_planned_wrapper(monkeypatch):
    import sys

    from harness.backends.flashinfer.adapter import FlashinferCall

    log = []

    def wrapper_class(name):
        class Wrapper:
            def __init__(self, workspace, kv_layout):
                assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
                log.append(("init", name))

            def plan(self, **plan_args):
                log.append(("plan", name))
                self.plan_args = plan_args

            def run(self, *run_args):
                log.append(("run", name))
                return flashinfer_emulator(FlashinferCall(name, self.plan_args, run_args))
        return Wrapper

    monkeypatch.setitem(sys.modules, "flashinfer", _module("flashinfer", **{n: wrapper_class(n) for n in (RAGGED_PREFILL, PAGED_PREFILL, PAGED_DECODE)}))
    backend = FlashinferBackend()
    for lens, page_size, wrapper in ((([3, 2], [8, 5]), None, RAGGED_PREFILL), (([1, 1], [8, 5]), 4, PAGED_DECODE),
                                     (([3, 2], [8, 5]), 4, PAGED_PREFILL)):
        log.clear()
        inputs = ragged_batch(*lens, page_size=page_size, causal=True, seed=6)
        prepared = backend.prepare(serving_case(dtype="fp32"), inputs)
        # plan() twice: the first loads (JIT-compiles) the kernels, the second is the per-step plan in plan_s.
        assert log == [("init", wrapper), ("plan", wrapper), ("plan", wrapper)]
        assert prepared.plan_s is not None and prepared.plan_s >= 0 and prepared.compile_s is not None
        assert agrees(prepared.to_bhsd(prepared.fn()), inputs) and log[-1] == ("run", wrapper)
    dense = Case(B=2, S_q=5, S_kv=7, H=4, H_kv=2, d_k=16, d_v=16, causal=True)
    dense_inputs = make_inputs(dense)
    prepared = backend.prepare(dense, dense_inputs)
    assert check_forward(dense, dense_inputs, prepared.to_bhsd(prepared.fn())).agree


@pytest.mark.parametrize("page_size", [None, 4], ids=["packed", "paged"])
def test_xformers_prepare_passes_the_ragged_bias_and_returns_packed_rows(monkeypatch, page_size):
    from types import SimpleNamespace

    import harness.backends.xformers.adapter as xf

    _xformers_bias()
    from xformers.ops import fmha

    class FakeOp:
        NAME = "fake_fw"

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None, op=None):
        if q.dim() == 5 and hasattr(attn_bias, "block_tables"):  # the paged emulation reads [1, M, H_kv, d] pools
            q, k, v = q.flatten(2, 3), k[:, :, :, 0], v[:, :, :, 0]
        call = SimpleNamespace(q=q, k=k, v=v, attn_bias=attn_bias, scale=scale, view=lambda *t: t)
        return xformers_emulator(call).to(q.dtype)

    monkeypatch.setattr(xf, "import_xformers", lambda: (SimpleNamespace(memory_efficient_attention=memory_efficient_attention), None))
    monkeypatch.setattr(fmha.dispatch, "_dispatch_fw", lambda inp, needs_gradient: FakeOp)
    inputs = ragged_batch([3, 1, 4], [6, 9, 4], page_size=page_size, causal=True, seed=8)
    case = serving_case(device="cuda", dtype="bf16", layout="packed" if page_size is None else "paged", page_size=page_size)
    prepared = xf.XformersBackend().prepare(case, inputs)
    assert prepared.notes["op_fw"] == "fake_fw" and prepared.notes["layout"] == case.layout
    assert agrees(prepared.to_bhsd(prepared.fn()), inputs)


def test_serving_layouts_refuse_what_their_translations_do_not_carry():
    from harness.backends.pytorch.flex import FlexBackend
    from harness.backends.xformers.adapter import XformersBackend

    paged = serving_case(device="cuda", dtype="bf16", layout="paged", page_size=256, causal=True)
    for backend in (FlashAttn2Backend(), FlashAttn3Backend(), XformersBackend(), FlashinferBackend(), FlexBackend()):
        assert backend.supports(paged) is None, backend.name
        assert "sliding window" in backend.supports(paged.replace(window=8)), backend.name
        assert "padded" in backend.supports(paged.replace(layout="padded", page_size=None)), backend.name


def test_a_flash_build_that_refuses_paged_kv_is_unsupported_with_its_words(monkeypatch):
    import sys

    def refusing(*args, **kwargs):
        raise RuntimeError("This flash attention build does not support paged KV.")

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    inputs = ragged_batch([1, 1], [5, 9], page_size=4, seed=9)
    case = serving_case(device="cuda", dtype="bf16", layout="paged", page_size=4)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _module("flash_attn_interface", flash_attn_with_kvcache=refusing))
    with pytest.raises(Unsupported, match="flash-attn3 flash_attn_with_kvcache: This flash attention build does not support paged KV"):
        FlashAttn3Backend().prepare(case, inputs)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _module("flash_attn_interface", flash_attn_with_kvcache=broken))
    with pytest.raises(RuntimeError, match="illegal memory access"):  # a failure stays a failure
        FlashAttn3Backend().prepare(case, inputs)
