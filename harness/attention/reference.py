"""The float64 reference: attention computed independently of every backend, slice by slice into NaN-poisoned buffers.

K/V heads are picked per (batch, K/V head) slice, so query heads g·h … g·h+g−1 read K/V head h. Large
cases are sampled (query rows forward, slices backward) so a float64 pass stays within seconds.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from harness.attention.eager import naive_attention
from harness.attention.fp8 import dequantized
from harness.attention.variants import alibi_bias, alibi_slopes
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, input_leaves, query_positions, visible_mask
from harness.suite.ragged import RaggedInputs, sequence_mask

#: Above this many score elements (B·H·S_q·S_kv) the reference samples query rows (forward) or
#: (batch, K/V head) slices (backward), so that a float64 pass stays within seconds and ~1 GB.
MAX_REFERENCE_SCORES = 2**26
#: Query rows sampled for the forward reference of a large case.
SAMPLED_ROWS = 128


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer shaped like `t` filled with NaN, so that elements a kernel never writes show up.

    Every output buffer the harness allocates comes from here: the reference's own buffers below,
    and the `out=` buffer of any backend adapter whose kernel writes into a caller's tensor (it
    must allocate it in `prepare`, so the first, checked call writes into NaN).
    """
    if not t.is_floating_point():
        raise TypeError(f"cannot poison a {t.dtype} buffer with NaN")
    return torch.full_like(t, float("nan"))


def reference_device(case: Case) -> torch.device:
    """Where the float64 reference runs: the CPU, except for CUDA cases (a CPU float64 pass at those sizes takes minutes)."""
    return torch.device("cuda") if case.device == "cuda" else torch.device("cpu")


def default_scale(case: Case) -> float:
    """The softmax scale every backend is asked for: the case's `scale`, else 1/√d_k (`Case.softmax_scale`)."""
    return case.softmax_scale


def query_rows(case: Case) -> torch.Tensor | None:
    """The query rows the forward check compares: all (None), or a seeded sample including the first and last."""
    if case.B * case.H * case.S_q * case.S_kv <= MAX_REFERENCE_SCORES or case.S_q <= SAMPLED_ROWS:
        return None
    rng = np.random.default_rng([case.seed, 0xC4EC])
    rows = rng.choice(case.S_q, size=SAMPLED_ROWS - 2, replace=False)
    return torch.as_tensor(sorted({0, case.S_q - 1, *rows.tolist()}))


class Terms(NamedTuple):
    """What a slice's score variants read beside q, k, v: its heads' sink logits and ALiBi slopes `[heads]`, its rows' key positions `[B, rows]`."""

    sinks: torch.Tensor | None = None
    slopes: torch.Tensor | None = None
    q_pos: torch.Tensor | None = None


NO_TERMS = Terms()


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, *, return_weights: bool = False,
    softcap: float | None = None, terms: Terms = NO_TERMS,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q·Kᵀ·scale, masked)·V in the inputs' precision, `[B, H, S, d]`; query head h reads K/V head h // (H/H_kv).

    `mask` is boolean, True where visible, broadcastable to `[B, 1, S_q, S_kv]`. A query row with
    no visible key gives zero weights and a zero output (FlashAttention's convention), with finite
    gradients, so the reference is defined everywhere. The score variants from their definitions
    (harness.attention.variants): `softcap` c maps each scaled score s to c·tanh(s/c); `terms.slopes`
    with `terms.q_pos` subtract slope_h·|pos(i) − j|; `terms.sinks` join each row's denominator as one
    logit more whose weight is dropped.
    """
    H, H_kv = q.shape[1], k.shape[1]
    kv_head = torch.arange(H, device=q.device) // (H // H_kv)
    k, v = k.index_select(1, kv_head), v.index_select(1, kv_head)
    scores = torch.matmul(q * scale, k.transpose(-2, -1))
    S_kv = scores.shape[-1]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if terms.slopes is not None:
        key = torch.arange(S_kv, device=q.device, dtype=scores.dtype)
        distance = (terms.q_pos.to(q.device, scores.dtype)[:, None, :, None] - key).abs()
        scores = scores - terms.slopes.to(q.device, scores.dtype)[None, :, None, None] * distance
    empty = None
    if mask is not None:
        empty = ~mask.any(dim=-1, keepdim=True)
        # Empty rows keep their finite scores (their weights are zeroed below), so that neither softmax
        # nor its gradient ever sees a row of −inf only. In place: matmul's backward does not need its output.
        scores.masked_fill_(~mask & ~empty if bool(empty.any()) else ~mask, float("-inf"))
    if terms.sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        sink = terms.sinks.to(q.device, scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S_kv]
    if empty is not None and bool(empty.any()):
        weights = weights.masked_fill(empty, 0.0)
    out = torch.matmul(weights, v)
    return (out, weights) if return_weights else out


#: A slice kernel: (q, k, v, mask[, terms]) → output, `[1, heads, rows, d]` in and out.
Kernel = Callable[..., torch.Tensor]


def reference_kernel(scale: float, softcap: float | None = None) -> Kernel:
    """The float64 reference as a slice kernel."""
    return lambda q, k, v, m, terms=NO_TERMS: reference_attention(q, k, v, m, scale, softcap=softcap, terms=terms)


#: Dtypes whose CPU matmul the rule's `lp` computes as `fp32_accumulated_matmul`.
WIDENED_ON_CPU = (torch.bfloat16, torch.float16)


def fp32_accumulated_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a·b of low-precision tensors as a GEMM that accumulates in fp32 computes it: products summed in fp32, rounded back once.

    What torch's bf16/fp16 CPU matmul returns (fp32 accumulation; equal but for summation order), at fp32 speed:
    without native bf16 (an AVX2 CPU) torch's own bf16 GEMM runs on one thread some 40x slower than fp32,
    and the reference of a quick case then cost more than every backend's samples of it.
    """
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def eager_kernel(scale: float, softcap: float | None = None) -> Kernel:
    """Eager attention in the inputs' dtype (the rule's `lp`) as a slice kernel; on the CPU a bf16/fp16 matmul accumulates in fp32 explicitly."""

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None, terms: Terms = NO_TERMS) -> torch.Tensor:
        widened = q.device.type == "cpu" and q.dtype in WIDENED_ON_CPU
        bias = None if terms.slopes is None else alibi_bias(terms.slopes, terms.q_pos.to(q.device), k.shape[2], q.dtype)
        sinks = None if terms.sinks is None else terms.sinks.to(q.device)
        return naive_attention(q, k, v, m, scale=scale, matmul=fp32_accumulated_matmul if widened else torch.matmul,
                               softcap=softcap, sinks=sinks, bias=bias)

    return kernel


def all_slices(case: Case) -> list[tuple[int, int]]:
    """Every (batch, K/V head) slice of a case."""
    return [(b, h) for b in range(case.B) for h in range(case.H_kv)]


def _cast(inputs: AttentionInputs, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v in `dtype` on `device`; an FP8 tensor dequantized first (its values times its descale: what it holds)."""
    descales = getattr(inputs, "descales", None) or {}
    return tuple(dequantized(getattr(inputs, name).detach(), descales.get(name)).to(device=device, dtype=dtype) for name in ("q", "k", "v"))


def slice_terms(case: Case, inputs: AttentionInputs | RaggedInputs, heads: slice, q_pos: torch.Tensor | None) -> Terms:
    """The variant terms of the query heads `heads` whose rows sit at key positions `q_pos` `[B, rows]` (None: no ALiBi)."""
    sinks = inputs.sinks.detach().cpu()[heads] if case.sinks else None
    slopes = alibi_slopes(case.H)[heads] if case.alibi else None
    return Terms(sinks, slopes, q_pos if case.alibi else None)


def _positions(case: Case, rows: torch.Tensor | None) -> torch.Tensor | None:
    """Every query row's key position `[B, rows]` (sampled rows keep their own), or None when the case has no ALiBi."""
    if not case.alibi:
        return None
    positions = torch.as_tensor(query_positions(case))
    return positions if rows is None else positions[:, rows.cpu()]


def forward(case: Case, inputs: AttentionInputs, kernel: Kernel, dtype: torch.dtype, device: torch.device, rows: torch.Tensor | None) -> torch.Tensor:
    """The output `[B, H, rows, d_v]`, computed one (batch, K/V head) slice at a time into a poisoned buffer."""
    q, k, v = _cast(inputs, dtype, device)
    mask = visible_mask(case, device=device)
    if rows is not None:
        rows = rows.to(device)
        q = q[:, :, rows]
        mask = mask[:, :, rows] if mask is not None else None
    g = case.group_size
    positions = _positions(case, rows)
    out = poisoned_like(q.new_empty(case.B, case.H, q.shape[2], case.d_v))
    for b, h in all_slices(case):
        heads = slice(h * g, (h + 1) * g)
        terms = slice_terms(case, inputs, heads, None if positions is None else positions[b : b + 1])
        out[b : b + 1, heads] = kernel(q[b : b + 1, heads], k[b : b + 1, h : h + 1], v[b : b + 1, h : h + 1],
                                       None if mask is None else mask[b : b + 1], terms)
    return out


def gradients(
    case: Case, inputs: AttentionInputs, kernel: Kernel, dtype: torch.dtype, device: torch.device, slices: Sequence[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the given slices, each in a poisoned buffer of the full shape (other slices stay NaN)."""
    q, k, v = _cast(inputs, dtype, device)
    grad_out = inputs.grad_out.detach().to(device=device, dtype=dtype)
    mask = visible_mask(case, device=device)
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    g = case.group_size
    positions = _positions(case, None)
    with torch.enable_grad():
        for b, h in slices:
            heads = slice(h * g, (h + 1) * g)
            leaves = [t.clone().requires_grad_(True) for t in (q[b : b + 1, heads], k[b : b + 1, h : h + 1], v[b : b + 1, h : h + 1])]
            terms = slice_terms(case, inputs, heads, None if positions is None else positions[b : b + 1])
            out = kernel(*leaves, None if mask is None else mask[b : b + 1], terms)
            gq, gk, gv = torch.autograd.grad(out, leaves, grad_out[b : b + 1, heads])
            dq[b : b + 1, heads], dk[b : b + 1, h : h + 1], dv[b : b + 1, h : h + 1] = gq, gk, gv
    return dq, dk, dv


class ReferenceCache:
    """The most recent reference, reused by the next check when its inputs are equal (the next backend on the same case).

    Owned and passed by the loop that checks pairs: it pays off when that loop runs cases outer and
    backends inner, and costs one comparison otherwise. Equality is verified element by element
    against a copy, so a reused reference is always the one those very inputs give. The copies are
    kept in host memory whatever the inputs' device, so a CUDA case's next backend runs with no
    extra input-sized tensors on the GPU. The reference itself stays on the device it was computed
    on until the next one replaces it: that costs capacity, not measurement (peaks are read above
    what is held when their window opens), and saves a float64 pass per backend of a CUDA case.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._inputs: list[tuple[str, Any]] = []
        self._value: object = None

    @staticmethod
    def _leaves(inputs: AttentionInputs) -> list[tuple[str, Any]]:
        """Everything the reference reads: every leaf of the inputs (q, k, v, grad_out, the FP8 descales, the sinks, the lengths)."""
        return input_leaves(inputs)

    @staticmethod
    def _tensor_like(value: Any) -> bool:
        """A tensor, or what stands for one where the cache looks (shape, dtype, detach, cpu, to): compared by its contents."""
        return isinstance(value, torch.Tensor) or all(hasattr(value, name) for name in ("shape", "dtype", "detach", "to"))

    def _holds(self, key: tuple, leaves: list[tuple[str, Any]]) -> bool:
        def same(a: Any, b: Any) -> bool:
            if self._tensor_like(a) or isinstance(b, torch.Tensor):
                return (self._tensor_like(a) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                        and torch.equal(a.detach().cpu(), b))
            return type(a) is type(b) and a == b

        return (
            self._key == key and [p for p, _ in leaves] == [p for p, _ in self._inputs]
            and all(same(a, b) for (_, a), (_, b) in zip(leaves, self._inputs))
        )

    def get(self, key: tuple, inputs: AttentionInputs, compute: Callable[[], object]) -> object:
        """The value for `key` and these inputs, computed (and kept) when not the last one."""
        leaves = self._leaves(inputs)
        if self._holds(key, leaves):
            return self._value
        self._key, self._inputs, self._value = None, [], None
        value = compute()
        # `.to(copy=True)`: a CPU tensor's `.cpu()` is itself, and a later in-place write would pass the comparison;
        # a value deep-copied, so that a dict written in place is not compared with itself.
        self._key, self._value = key, value
        self._inputs = [(p, v.detach().to("cpu", copy=True) if self._tensor_like(v) else copy.deepcopy(v)) for p, v in leaves]
        return value


def cached(cache: ReferenceCache | None, key: tuple, inputs: AttentionInputs, compute: Callable[[], object]) -> object:
    """`compute()`, or the cache's value when it holds these very inputs under `key`."""
    return compute() if cache is None else cache.get(key, inputs, compute)


def gradient_slices(case: Case) -> list[tuple[int, int]]:
    """The (batch, K/V head) slices the backward check covers: all, or a seeded sample that fits the reference budget.

    Gradients of one slice depend on that slice alone, so a sample is checked exactly; it is empty
    when even one slice is over the budget.
    """
    slices = all_slices(case)
    per_slice = case.group_size * case.S_q * case.S_kv
    fits = MAX_REFERENCE_SCORES // per_slice
    if fits >= len(slices):
        return slices
    if fits == 0:
        return []
    rng = np.random.default_rng([case.seed, 0x6AD])
    picked = rng.choice(len(slices), size=max(1, fits - 2), replace=False).tolist()
    return [slices[i] for i in sorted({0, len(slices) - 1, *picked})][:fits]


def ragged_rows(case: Case) -> torch.Tensor | None:
    """The packed query rows a ragged forward check compares: all (None), or a seeded sample of every request's rows.

    Stratified by request, never uniform over the packed rows: in `8x1024 + 32x1@1024 + 8x1024` a uniform
    sample of 128 rows left 31 of the 48 requests unchecked (and 31 of the 32 decodes), so a backend
    wrong on one kind of request passed. Every request gets its last row (it sees the most keys) and,
    where the sample holds two a request, its first; the rest of the sample goes to the requests'
    interior rows in proportion to how many each has.
    """
    T_q = sum(case.seq_lens_q)
    scores = case.H * sum(q * kv for q, kv in zip(case.seq_lens_q, case.seq_lens_kv))
    if scores <= MAX_REFERENCE_SCORES or T_q <= SAMPLED_ROWS:
        return None
    rng = np.random.default_rng([case.seed, 0xC4ED])
    lens = case.seq_lens_q
    both_ends = 2 * sum(n > 0 for n in lens) <= SAMPLED_ROWS
    starts = np.cumsum([0, *lens[:-1]])
    rows = [int(s + n - 1) for s, n in zip(starts, lens) if n]
    if both_ends:
        rows += [int(s) for s, n in zip(starts, lens) if n > 1]
    interior = [max(0, n - 2) if both_ends else max(0, n - 1) for n in lens]
    room, total = SAMPLED_ROWS - len(rows), sum(interior)
    for s, n, inside in zip(starts, lens, interior):
        take = min(inside, room * inside // total) if total and room > 0 else 0
        if take:
            first = s + 1 if both_ends else s
            rows += (first + rng.choice(inside, size=take, replace=False)).tolist()
    return torch.as_tensor(sorted(rows))


def ragged_forward(case: Case, inputs: RaggedInputs, kernel: Kernel, dtype: torch.dtype, device: torch.device,
                   rows: torch.Tensor | None) -> torch.Tensor:
    """The packed output `[T_q or len(rows), H, d_v]`, each request attending over its own keys alone, into a poisoned buffer.

    Reads the packed k and v (the paged cache holds the same tokens), so one reference serves every layout of a batch.
    """
    q, k, v = (t.detach().to(device=device, dtype=dtype) for t in (inputs.q, inputs.k, inputs.v))
    wanted = torch.arange(q.shape[0]) if rows is None else rows.cpu()
    out = poisoned_like(q.new_empty(len(wanted), case.H, case.d_v))
    cu_q, cu_kv = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_kv.tolist()
    for i, (q_len, kv_len) in enumerate(zip(case.seq_lens_q, case.seq_lens_kv)):
        picked = ((wanted >= cu_q[i]) & (wanted < cu_q[i + 1])).nonzero().flatten()
        if not len(picked):
            continue
        local = (wanted[picked] - cu_q[i]).to(device)
        mask = sequence_mask(q_len, kv_len, case.causal, case.window, device)
        qi = q[cu_q[i]:cu_q[i + 1]].index_select(0, local).transpose(0, 1)[None]  # [1, H, rows, d_k]
        ki, vi = (t[cu_kv[i]:cu_kv[i + 1]].transpose(0, 1)[None] for t in (k, v))
        q_pos = (local.cpu() + kv_len - q_len)[None]  # each request's queries sit at the end of its own keys
        terms = slice_terms(case, inputs, slice(None), q_pos)
        result = kernel(qi, ki, vi, None if mask is None else mask.index_select(0, local)[None, None], terms)
        out[picked.to(device)] = result[0].transpose(0, 1)
    return out
