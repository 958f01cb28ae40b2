"""The GPU-only adapters' argument translation, as plain functions on CPU tensors.

FlashAttention and xFormers cannot run here, so their translations are fed to small emulators of
the kernels' documented contracts (FlashAttention: BSHD or packed varlen rows with cu_seqlens,
causal aligned bottom-right per sequence, window (left, right), query head h reading K/V head
h // (H/H_kv)); translation + contract must reproduce the float64 reference exactly as a real
kernel would. xFormers' own attention biases materialise on the CPU and are checked the same way.
"""

import math

import numpy as np
import pytest
import torch

from harness.backends.flashattention.adapter import flash_call
from harness.backends.pytorch.flex import mask_mod_for
from harness.backends.layouts import cu_seqlens, from_bmghk, kv_to_bmghk, pack, to_bmghk, unpack, window_size
from harness.suite.cases import Case
from harness.suite.inputs import kv_lengths, make_inputs, visible_mask
from harness.attention.numerics import check_backward, check_forward


def flash_contract(q, k, v, *, softmax_scale, causal, window_size, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """FlashAttention's documented semantics in eager torch (dense `[B, S, H, d]` or varlen `[Σ, H, d]`)."""
    if cu_seqlens_q is None:
        return torch.stack([_one(q[b], k[b], v[b], softmax_scale, causal, window_size) for b in range(q.shape[0])])
    outs = []
    for b in range(len(cu_seqlens_q) - 1):
        qs, ks = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])), slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
        outs.append(_one(q[qs], k[ks], v[ks], softmax_scale, causal, window_size))
    return torch.cat(outs)


def _one(q, k, v, scale, causal, window):
    """One sequence: q `[Sq, H, d]`, k/v `[Sk, Hkv, d]`."""
    Sq, H, _ = q.shape
    Sk, Hkv, _ = k.shape
    kv_head = torch.arange(H) // (H // Hkv)
    kk, vv = k[:, kv_head], v[:, kv_head]
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if right is not None and right >= 0:
        keep &= j <= i + right
    if left is not None and left >= 0:
        keep &= j >= i - left
    scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vv)


def test_flash_contract_dense_wrapper_is_the_per_sequence_one():
    # The emulator's dense path is the varlen path with equal lengths (self-consistency of the test tool).
    q, k = torch.randn(2, 5, 4, 8), torch.randn(2, 7, 2, 8)
    dense = flash_contract(q, k, k, softmax_scale=0.3, causal=True, window_size=(-1, -1))
    packed = flash_contract(q.reshape(10, 4, 8), k.reshape(14, 2, 8), k.reshape(14, 2, 8), softmax_scale=0.3, causal=True,
                            window_size=(-1, -1), cu_seqlens_q=torch.tensor([0, 5, 10]), cu_seqlens_k=torch.tensor([0, 7, 14]))
    assert torch.allclose(dense.reshape(10, 4, 8), packed)


def test_cu_seqlens_are_int32_cumulative_from_zero():
    cu = cu_seqlens(np.array([3, 1, 4]))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 4, 8]


def test_pack_keeps_real_rows_in_order_and_unpack_zero_fills():
    t = torch.arange(2 * 4 * 1 * 1, dtype=torch.float32).view(2, 4, 1, 1)
    lens = np.array([3, 1])
    packed = pack(t, lens)
    assert packed.flatten().tolist() == [0, 1, 2, 4]
    back = unpack(packed, lens, 4)
    assert back.flatten().tolist() == [0, 1, 2, 0, 4, 0, 0, 0]


def test_window_size_is_w_minus_one_left_zero_right():
    c = Case(B=1, S_q=4, S_kv=4, H=1, H_kv=1, d_k=8, d_v=8, window=3)
    assert window_size(c) == (2, 0)
    assert window_size(c.replace(window=None)) == (-1, -1)
    assert window_size(c.replace(window=None), none=None) == (None, None)


CASES = [
    Case(B=2, S_q=6, S_kv=6, H=4, H_kv=2, d_k=16, d_v=16),
    Case(B=2, S_q=3, S_kv=9, H=4, H_kv=1, d_k=16, d_v=16, causal=True),
    Case(B=2, S_q=8, S_kv=8, H=4, H_kv=4, d_k=16, d_v=16, window=3),
    Case(B=3, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, causal=True, padding=True, seed=3),
    Case(B=3, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, padding=True, seed=5),
    Case(B=3, S_q=1, S_kv=20, H=4, H_kv=2, d_k=16, d_v=16, padding=True, seed=1),
    Case(B=3, S_q=3, S_kv=20, H=4, H_kv=1, d_k=16, d_v=16, causal=True, padding=True, seed=2),
    Case(B=2, S_q=10, S_kv=10, H=2, H_kv=2, d_k=16, d_v=16, causal=True, window=4, padding=True, seed=6),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_flash_translation_meets_the_reference_through_the_contract(case):
    inputs = make_inputs(case)
    call = flash_call(case, inputs)
    assert call.is_varlen == case.padding
    out = flash_contract(call.q, call.k, call.v, **call.kwargs)
    assert check_forward(case, inputs, call.q_to_bhsd(out)).agree


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[6]], ids=lambda c: c.id)
def test_flash_translation_gradients_map_back(case):
    case = case.replace(mode="bwd")
    inputs = make_inputs(case)
    call = flash_call(case, inputs, requires_grad=True)
    out = flash_contract(call.q, call.k, call.v, **call.kwargs)
    dq, dk, dv = torch.autograd.grad(out, (call.q, call.k, call.v), call.grad_from_bhsd(inputs.grad_out))
    assert check_backward(case, inputs, [call.q_to_bhsd(dq), call.kv_to_bhsd(dk), call.kv_to_bhsd(dv)]).agree


def test_flash_translation_keeps_kv_heads_unexpanded():
    case = CASES[1]
    call = flash_call(case, make_inputs(case))
    assert call.q.shape == (2, 3, 4, 16) and call.k.shape == (2, 9, 1, 16)
    assert call.kwargs["causal"] is True and call.kwargs["softmax_scale"] == pytest.approx(1 / math.sqrt(16))


def test_xformers_5d_layout_groups_heads_like_repeat_interleave_without_copying_kv():
    q = torch.randn(2, 6, 5, 8)  # H = 6, H_kv = 2, g = 3
    k = torch.randn(2, 5, 2, 8)  # BSHD
    qg = to_bmghk(q, 2)
    assert qg.shape == (2, 5, 2, 3, 8)
    assert torch.equal(qg[:, :, 1, 2], q[:, 5])  # head 5 = group 1, member 2
    kg = kv_to_bmghk(k, 3)
    assert kg.stride(3) == 0 and kg.data_ptr() == k.data_ptr()
    assert torch.equal(kg[:, :, 1, 2], k[:, :, 1])
    assert torch.equal(from_bmghk(qg), q)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_xformers_biases_and_layout_meet_the_reference(case):
    from harness.backends.xformers.adapter import attention_bias, xformers_call
    from tests.xformers_real import real_fmha

    fmha = real_fmha()

    inputs = make_inputs(case)
    bias = attention_bias(case, fmha.attn_bias)
    call = xformers_call(case, inputs, bias)
    q, k, v = call.view(call.q, call.k, call.v)
    if q.dim() == 4:
        q, k, v = q.unsqueeze(2), k.unsqueeze(2), v.unsqueeze(2)
    shape = (q.shape[1], k.shape[1])
    additive = bias.materialize(shape) if bias is not None else torch.zeros(shape)
    p = torch.softmax(torch.einsum("bmghk,bnghk->bghmn", q, k) * call.scale + additive, -1).nan_to_num(0.0)
    out = torch.einsum("bghmn,bnghk->bmghk", p, v).reshape(q.shape[0], q.shape[1], case.H, case.d_v)
    assert check_forward(case, inputs, call.out_to_bhsd(out)).agree


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_flex_mask_mod_is_the_visible_mask(case):
    mod = mask_mod_for(case)
    expected = visible_mask(case)
    if expected is None:
        assert mod is None
        return
    b = torch.arange(case.B)[:, None, None]
    i = torch.arange(case.S_q)[None, :, None]
    j = torch.arange(case.S_kv)[None, None, :]
    got = mod(b, torch.zeros_like(b), i, j)
    assert torch.equal(got.expand(case.B, case.S_q, case.S_kv), expected[:, 0])


def test_padding_lengths_are_seeded():
    c = CASES[3]
    assert kv_lengths(c).tolist() == kv_lengths(c).tolist()
    assert kv_lengths(c).tolist() != kv_lengths(c.replace(seed=99)).tolist() or c.B == 1
