"""The xFormers adapter against the real xFormers library on the CPU: its signatures, its biases, its dispatcher.

Every call the adapter makes is bound to the real function's signature; every attention bias it builds
is the real xFormers object, whose `materialize()` must equal the harness's own masks position by
position. The timed call goes through the real `memory_efficient_attention` and the real dispatcher;
only the kernel, which has no CPU build, is a stand-in: an operator class declared as xFormers declares
its own (for the CPU, every bias type) whose `apply` is the float64 math of
`tests.library_contracts.xformers_emulator`.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types

import numpy as np
import pytest
import torch

from harness.errors import Unsupported
from harness.execution.execute import build_step
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs, q_lengths, visible_mask
from harness.suite.ragged import page_rows, sequence_mask
from tests.library_contracts import paged_bias_emulator
from tests.xformers_real import real_fmha
from tests.ragged_fixtures import agrees, ragged_batch, serving_case
from tests.xformers_fixtures import Bound, xf  # noqa: F401 - the fixture

BATCHES = {"prefill": ([5, 3, 7], [5, 3, 7]), "chunked": ([4, 2, 6], [9, 13, 6]), "decode": ([1, 1, 1, 1], [7, 16, 3, 11])}


def dense(**fields):
    """A small fp32 dense case: GQA, 3 sequences."""
    return Case(**{"B": 3, "S_q": 6, "S_kv": 9, "H": 4, "H_kv": 2, "d_k": 16, "d_v": 16, **fields})


_OFFSET = "BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens"
#: name: (case, the attn_bias constructor the adapter must call for it, None for no bias).
DENSE = {
    "full": (dense(S_q=9, H_kv=4), None), "causal-gqa": (dense(causal=True), "LowerTriangularFromBottomRightMask"),
    "window": (dense(window=3), "LowerTriangularFromBottomRightLocalAttentionMask"),
    "padded-full": (dense(S_q=9, padding=True), "BlockDiagonalPaddedKeysMask.from_seqlens"),
    "padded-causal": (dense(S_q=9, causal=True, padding=True), _OFFSET),
    "padded-decode": (dense(S_q=2, causal=True, padding=True), _OFFSET),
    "padded-window": (dense(window=4, padding=True, H_kv=4), "BlockDiagonalCausalLocalAttentionPaddedKeysMask.from_seqlens_local"),
    "bwd-causal": (dense(S_q=9, H_kv=4, causal=True, mode="bwd"), "LowerTriangularFromBottomRightMask"),
    "fwd_bwd-padded": (dense(H_kv=4, causal=True, padding=True, mode="fwd_bwd"), _OFFSET),
}
#: name: (page size, causal, the attn_bias constructor the adapter must call).
RAGGED = {"packed": (None, False, "BlockDiagonalMask.from_seqlens"),
          "packed-causal": (None, True, "BlockDiagonalCausalFromBottomRightMask.from_seqlens"),
          "paged": (4, False, "PagedBlockDiagonalPaddedKeysMask.from_seqlens"),
          "paged-causal": (4, True, "PagedBlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens")}


def _prepare(xf, monkeypatch, name):
    """prepare() for a named case with every xFormers call bound to its real signature: (case, inputs, prepared, calls)."""
    calls = {}
    xops = sys.modules["xformers.ops"]
    monkeypatch.setattr(xf.adapter, "import_xformers", lambda: (Bound(xops, "xops", calls), None))
    for attr in ("attn_bias", "Inputs", "dispatch"):
        monkeypatch.setattr(xf.fmha, attr, Bound(getattr(xf.fmha, attr), attr, calls))
    if name in RAGGED:
        page_size, causal, _ = RAGGED[name]
        inputs = ragged_batch([3, 1, 4], [6, 9, 4], page_size=page_size, causal=causal, seed=8)
        case = serving_case(layout="packed" if page_size is None else "paged", page_size=page_size, causal=causal)
    else:
        case = DENSE[name][0]
        inputs = make_inputs(case)
    prepared = xf.adapter.XformersBackend().prepare(case, inputs)
    return case, inputs, prepared, calls


@pytest.mark.parametrize("name", [*DENSE, *RAGGED])
def test_every_call_binds_to_the_real_signature_and_the_timed_call_names_its_operators(xf, monkeypatch, name):
    case, _, prepared, calls = _prepare(xf, monkeypatch, name)
    built = RAGGED[name][2] if name in RAGGED else DENSE[name][1]
    assert built is None or f"attn_bias.{built}" in calls, sorted(calls)
    backward = case.mode != "fwd"
    assert {"Inputs", "dispatch._dispatch_fw"} <= set(calls) and ("dispatch._dispatch_bw" in calls) == backward
    timed = calls["xops.memory_efficient_attention"].arguments
    assert timed["op"] == (xf.fw, xf.bw if backward else None) and timed["scale"] == pytest.approx(case.d_k ** -0.5)
    assert prepared.notes["op_fw"] == "cpuF" and prepared.notes.get("op_bw") == ("cpuB" if backward else None)


@pytest.mark.parametrize("name", [*DENSE, *RAGGED])
def test_the_timed_call_runs_no_dispatcher_and_meets_the_reference(xf, monkeypatch, name):
    case, inputs, prepared, _ = _prepare(xf, monkeypatch, name)
    if name in RAGGED:
        step = prepared.fn
    else:
        step = build_step(case, prepared, inputs)  # bwd: the forward it saves runs here, untimed
    xf.runs.clear()
    result = step()
    assert xf.runs == []  # no `_run_priority_list`: neither _dispatch_fw nor _dispatch_bw ran in the timed call
    assert agrees(prepared.to_bhsd(result), inputs) if name in RAGGED else prepared.check(result).agree


def test_a_kernel_that_refuses_only_when_called_is_unsupported_in_its_own_words(xf, monkeypatch):
    paged_bias = xf.fmha.attn_bias.PagedBlockDiagonalPaddedKeysMask

    class Fa2Like(xf.fw):
        """Refuses as FlashAttention 2's mha_varlen_fwd does (a TORCH_CHECK, after xFormers' dispatcher accepted it)."""

        @classmethod
        def apply(cls, inp, needs_gradient):
            if isinstance(inp.attn_bias, paged_bias) and inp.attn_bias.page_size % 256:
                raise RuntimeError("Paged KV cache block size must be divisible by 256")
            return super().apply(inp, needs_gradient)

    monkeypatch.setattr(xf.fmha.dispatch, "ck", types.SimpleNamespace(FwOp=Fa2Like, BwOp=xf.bw))
    backend = xf.adapter.XformersBackend()
    for page_size in (16, 256):
        inputs = ragged_batch([1, 2], [40, 300], page_size=page_size, causal=True, seed=4)
        case = serving_case(layout="paged", page_size=page_size, causal=True)
        if page_size % 256:
            with pytest.raises(Unsupported) as refused:
                backend.prepare(case, inputs)  # fwd mode: the refusal comes from the untimed trial call
            assert str(refused.value) == "xformers: Paged KV cache block size must be divisible by 256"
        else:
            prepared = backend.prepare(case, inputs)
            assert agrees(prepared.to_bhsd(prepared.fn()), inputs)

    for failure in ("CUDA error: an illegal memory access was encountered", "CUDA error: operation not supported"):
        def fails(cls, inp, needs_gradient, failure=failure):
            raise RuntimeError(failure)

        monkeypatch.setattr(Fa2Like, "apply", classmethod(fails))
        with pytest.raises(RuntimeError, match=failure):  # a failure stays a failure, even worded "not supported"
            backend.prepare(serving_case(layout="paged", page_size=256), ragged_batch([1], [5], page_size=256))


@contextlib.contextmanager
def fresh_import_of_xformers_ops():
    """`xformers.ops` and its submodules out of sys.modules for the block, then every one put back as it was."""
    real_fmha()
    saved = {k: m for k, m in sys.modules.items() if k == "xformers.ops" or k.startswith("xformers.ops.")}
    for k in saved:
        del sys.modules[k]
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == "xformers.ops" or k.startswith("xformers.ops.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def pretend_a_gpu(monkeypatch):
    """torch.cuda.is_available() says yes, so the adapter gets as far as importing xFormers' GPU operators.

    Only once the real xFormers was imported (fresh_import_of_xformers_ops does it): its import asks once, and caches,
    whether Triton can run (xformers._is_triton_available), and with a pretended GPU that asks this CPU build of torch
    for the device's capability and fails. A test that was the first in its process to import xFormers failed so.
    """
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_flash_attn_4_alone_is_named_as_why_xformers_does_not_import(monkeypatch, tmp_path):
    from harness.backends.xformers.adapter import XformersBackend

    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    # flash-attn-4 alone: a `flash_attn` namespace package (flash_attn/cute, no __init__.py, no flash_attn_interface).
    spec = importlib.machinery.ModuleSpec("flash_attn", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "flash_attn")]
    namespace = importlib.util.module_from_spec(spec)
    with fresh_import_of_xformers_ops():
        pretend_a_gpu(monkeypatch)
        monkeypatch.setitem(sys.modules, "flash_attn", namespace)
        monkeypatch.delitem(sys.modules, "flash_attn.flash_attn_interface", raising=False)
        reason = XformersBackend().available()
    assert "not installed" not in reason and "\n" not in reason
    assert "xformers.ops.fmha.flash" in reason and "flash_attn.flash_attn_interface" in reason and "flash-attn-4" in reason


def test_xformers_that_is_missing_is_still_reported_as_not_installed(monkeypatch):
    from harness.backends.xformers.adapter import XformersBackend

    with fresh_import_of_xformers_ops():
        pretend_a_gpu(monkeypatch)
        for k in [k for k in sys.modules if k == "xformers" or k.startswith("xformers.")]:
            monkeypatch.delitem(sys.modules, k)
        monkeypatch.setitem(sys.modules, "xformers", None)  # `import xformers` now raises ModuleNotFoundError
        reason = XformersBackend().available()
    assert reason.startswith("xformers is not installed") and "\n" not in reason


# -- the real biases' materialize() against the harness's own masks, position by position ---------------


def visible(bias, shape):
    """Where a real xFormers bias lets a query see a key: its materialize() is 0 there and -inf elsewhere."""
    additive = torch.zeros(shape) if bias is None else bias.materialize(shape)
    assert bool(((additive == 0) | (additive == float("-inf"))).all())
    return additive == 0


def ragged_expected(inputs, columns):
    """The harness's block-diagonal mask `[T_q, width]`: sequence b's own mask at `columns(b)`, nothing elsewhere."""
    expected = torch.zeros(sum(inputs.seq_lens_q), columns(None), dtype=torch.bool)
    cu_q = inputs.cu_seqlens_q.tolist()
    for b, (q_len, kv_len) in enumerate(zip(inputs.seq_lens_q, inputs.seq_lens_kv)):
        own = sequence_mask(q_len, kv_len, inputs.causal, None)
        expected[cu_q[b]:cu_q[b + 1], columns(b)] = True if own is None else own
    return expected


def ragged_batches(paged):
    """(id, inputs) for each batch, causal and not (paged: over page sizes 1, 4, 16)."""
    return [pytest.param(ragged_batch(lq, lkv, causal=c, page_size=ps, seed=i), id=f"{n}-{c}-{ps}")
            for i, (n, (lq, lkv)) in enumerate(BATCHES.items()) for c in (False, True) for ps in ((1, 4, 16) if paged else (None,))]


@pytest.mark.parametrize("inputs", ragged_batches(paged=False))
def test_packed_biases_materialize_the_harness_request_masks(inputs):
    from harness.backends.xformers.adapter import xformers_ragged_call

    bias = xformers_ragged_call(inputs, real_fmha().attn_bias).attn_bias
    cu_kv = inputs.cu_seqlens_kv.tolist()
    expected = ragged_expected(inputs, lambda b: cu_kv[-1] if b is None else slice(cu_kv[b], cu_kv[b + 1]))
    assert torch.equal(visible(bias, tuple(expected.shape)), expected)


@pytest.mark.parametrize("inputs", ragged_batches(paged=True))
def test_paged_biases_materialize_the_harness_masks_at_the_pages_the_block_table_names(inputs):
    from harness.backends.xformers.adapter import xformers_ragged_call

    call = xformers_ragged_call(inputs, real_fmha().attn_bias)
    pool_rows = inputs.k_pages.shape[0] * inputs.page_size
    assert call.k.shape[1] == pool_rows  # the pool flattened, read in place
    rows, cu_kv = page_rows(inputs).tolist(), inputs.cu_seqlens_kv.tolist()
    expected = ragged_expected(inputs, lambda b: pool_rows if b is None else rows[cu_kv[b]:cu_kv[b + 1]])
    # The adapter's own bias, its unused table entries pointed at a page no sequence owns (paged_bias_emulator).
    assert torch.equal(paged_bias_emulator(call.attn_bias, pool_rows) == 0, expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in DENSE if DENSE[n][0].mode == "fwd"])
def test_dense_and_padded_biases_materialize_the_harness_visible_mask(name):
    from harness.backends.xformers.adapter import attention_bias

    case = DENSE[name][0]
    bias = attention_bias(case, real_fmha().attn_bias)
    mask = visible_mask(case)
    mask = torch.ones(case.B, 1, case.S_q, case.S_kv, dtype=torch.bool) if mask is None else mask
    if not case.padding:
        assert all(torch.equal(visible(bias, (case.S_q, case.S_kv)), mask[b, 0]) for b in range(case.B))
        return
    q_lens = q_lengths(case)
    expected = torch.zeros(int(q_lens.sum()), case.B * case.S_kv, dtype=torch.bool)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    for b in range(case.B):
        expected[starts[b]:starts[b + 1], b * case.S_kv:(b + 1) * case.S_kv] = mask[b, 0, :q_lens[b]]
    assert torch.equal(visible(bias, tuple(expected.shape)), expected)
