"""The backward check of a ragged (packed or padded) training batch: each request's dQ, dK and dV against its own float64 reference.

A request's gradients depend on that request alone, and within it on one K/V head and the g query heads that read
it, so the check works in (request, K/V head) slices: all of them where their scores fit the reference budget, else
a seeded sample that gives every request a slice before any request gets a second. Each request is judged on its
own (its own bound, from its own eager error), so a backend wrong on one short document beside long ones is caught:
one tensor-wide bound would let the long requests' larger errors cover it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from harness.attention.numerics import GRADIENT_NAMES, Agreement, compare, expected
from harness.attention.reference import (
    MAX_REFERENCE_SCORES, ReferenceCache, Terms, cached, eager_kernel, reference_device, reference_kernel, slice_terms,
)
from harness.suite.cases import Case
from harness.suite.inputs import torch_dtype
from harness.suite.ragged import RaggedInputs, sequence_mask

#: One checked slice: (request index, K/V head).
Slice = tuple[int, int]


def ragged_gradient_slices(case: Case) -> list[Slice]:
    """The (request, K/V head) slices the check covers: all that fit the budget, every request first, in order."""
    cost = [case.group_size * q * kv for q, kv in zip(case.seq_lens_q, case.seq_lens_kv)]
    every = [(i, h) for i in range(len(cost)) for h in range(case.H_kv)]
    if sum(cost[i] for i, _ in every) <= MAX_REFERENCE_SCORES:
        return every
    rng = np.random.default_rng([case.seed, 0x6AE])
    first = [(i, int(rng.integers(case.H_kv))) for i in range(len(cost))]
    rest = [s for s in every if s not in set(first)]
    picked, spent = [], 0
    for s in first + [rest[j] for j in rng.permutation(len(rest))]:
        if spent + cost[s[0]] <= MAX_REFERENCE_SCORES:
            picked.append(s)
            spent += cost[s[0]]
    return sorted(picked)


def _request_gradients(case: Case, inputs: RaggedInputs, kernel, dtype: torch.dtype, device: torch.device,
                       i: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ `[q_len, g, d_k]`, dK and dV `[kv_len, 1, d]` of request i's K/V head h and its g query heads, through `kernel`."""
    cu_q, cu_kv, g = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_kv.tolist(), case.group_size
    q_len, kv_len = case.seq_lens_q[i], case.seq_lens_kv[i]
    heads = slice(h * g, (h + 1) * g)

    def part(t: torch.Tensor, rows: tuple[int, int], cols: slice) -> torch.Tensor:
        return t.detach()[rows[0]:rows[1], cols].to(device=device, dtype=dtype).transpose(0, 1)[None].clone().requires_grad_(True)

    q = part(inputs.q, (cu_q[i], cu_q[i + 1]), heads)
    k = part(inputs.k, (cu_kv[i], cu_kv[i + 1]), slice(h, h + 1))
    v = part(inputs.v, (cu_kv[i], cu_kv[i + 1]), slice(h, h + 1))
    grad_out = inputs.grad_out.detach()[cu_q[i]:cu_q[i + 1], heads].to(device=device, dtype=dtype).transpose(0, 1)[None]
    mask = sequence_mask(q_len, kv_len, case.causal, case.window, device)
    q_pos = (torch.arange(q_len) + kv_len - q_len)[None]
    terms: Terms = slice_terms(case, inputs, heads, q_pos)
    with torch.enable_grad():
        out = kernel(q, k, v, None if mask is None else mask[None, None], terms)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
    return tuple(t[0].transpose(0, 1) for t in grads)  # type: ignore[return-value]


def _backend_slice(grads: Sequence[torch.Tensor], case: Case, inputs: RaggedInputs, i: int, h: int) -> list[torch.Tensor]:
    """The backend's packed dQ, dK, dV cut to request i's K/V head h (and its query heads), shaped as `_request_gradients` returns."""
    cu_q, cu_kv, g = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_kv.tolist(), case.group_size
    dq, dk, dv = grads
    return [dq[cu_q[i]:cu_q[i + 1], h * g:(h + 1) * g], dk[cu_kv[i]:cu_kv[i + 1], h:h + 1], dv[cu_kv[i]:cu_kv[i + 1], h:h + 1]]


def packed_gradient_shapes(case: Case) -> tuple[tuple[int, ...], ...]:
    """The packed shapes of dQ, dK and dV a ragged backward returns."""
    T_q, T_kv = sum(case.seq_lens_q), sum(case.seq_lens_kv)
    return (T_q, case.H, case.d_k), (T_kv, case.H_kv, case.d_k), (T_kv, case.H_kv, case.d_v)


def check_ragged_backward(case: Case, inputs: RaggedInputs, grads_packed: Sequence[torch.Tensor],
                          references: ReferenceCache | None = None) -> Agreement:
    """Judge packed dQ, dK, dV request by request against float64; the worst request's numbers, agree only if every one agrees."""
    if len(grads_packed) != 3:
        return Agreement(None, None, None, False, f"expected 3 gradients (dq, dk, dv), got {len(grads_packed)}")
    for name, grad, shape in zip(GRADIENT_NAMES, grads_packed, packed_gradient_shapes(case)):
        if tuple(grad.shape) != shape:
            return Agreement(None, None, None, False, f"{name} shape {tuple(grad.shape)}, expected the packed {shape}")
    slices = ragged_gradient_slices(case)
    device, scale = reference_device(case), case.softmax_scale

    def targets() -> list[list]:
        per_slice = []
        for i, h in slices:
            ref = _request_gradients(case, inputs, reference_kernel(scale, case.softcap), torch.float64, device, i, h)
            lp = _request_gradients(case, inputs, eager_kernel(scale, case.softcap), inputs.q.dtype, inputs.q.device, i, h)
            per_slice.append([expected(r, low, case.dtype) for r, low in zip(ref, lp)])
        return per_slice

    # Every layout of one batch draws the same q, k, v and upstream gradient: one reference serves them all.
    key = ("ragged-bwd", case.replace(layout="packed", page_size=None))
    worst: tuple[float, Agreement, str] | None = None
    failing: list[str] = []
    requests = sorted({i for i, _ in slices})
    for (i, h), wanted in zip(slices, cached(references, key, inputs, targets)):
        for name, out, target in zip(GRADIENT_NAMES, _backend_slice(grads_packed, case, inputs, i, h), wanted):
            result = compare(out, target)
            where = f"request {i} (K/V head {h}) {name}"
            if not result.agree:
                failing.append(where)
            ratio = math.inf if result.max_abs_err is None or not result.err_bound else result.max_abs_err / result.err_bound
            badness = (not result.agree, ratio)
            if worst is None or badness > (not worst[1].agree, worst[0]):
                worst = (ratio, result, where)
    if worst is None:
        return Agreement(None, None, None, None, "gradients not checked: no request fits the float64 reference budget")
    notes = []
    if failing:
        notes.append(f"disagreeing: {', '.join(failing[:4])}" + (f" and {len(failing) - 4} more" if len(failing) > 4 else ""))
    if len(requests) < len(case.seq_lens_q) or len(slices) < len(case.seq_lens_q) * case.H_kv:
        notes.append(f"{len(slices)} (request, K/V head) slices of {len(case.seq_lens_q) * case.H_kv} checked, "
                     f"covering {len(requests)} of {len(case.seq_lens_q)} requests")
    if worst[1].check_note and not failing:
        notes.append(f"{worst[2]}: {worst[1].check_note}")
    agreement = Agreement(worst[1].max_abs_err, worst[1].err_bound, worst[1].rel_err, not failing, "; ".join(notes) or None)
    wanted_dtype = torch_dtype(case)
    bad = next(((name, g.dtype) for name, g in zip(GRADIENT_NAMES, grads_packed) if g.dtype != wanted_dtype), None)
    if bad:
        return agreement.disagreeing(f"{bad[0]} dtype {str(bad[1]).removeprefix('torch.')}, expected the case's "
                                     f"{str(wanted_dtype).removeprefix('torch.')}")
    return agreement


def padding_note(agreement: Agreement, written: float | None) -> Agreement:
    """The agreement with what a padded backward wrote into its padding rows: recorded, never judged (no reference covers them)."""
    if written is None:
        return agreement
    from dataclasses import replace

    agreement = replace(agreement, masked_rows_max_abs=written if math.isfinite(written) else None)
    if not math.isfinite(written):
        return agreement.disagreeing("writes NaN/Inf into the padding rows' gradients")
    if written > 0:
        return agreement.with_note(f"writes non-zero gradients into padding rows (max |grad| {written:.3g}; judged on the real tokens)")
    return agreement
