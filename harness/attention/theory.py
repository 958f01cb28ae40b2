"""Analytic costs of a case: FLOPs, minimum bytes moved, KV-cache bytes, and the layer's crossover model.

Every throughput figure in a record is derived from these formulas and nothing else, so that a
disputed count (causal, S_q ≠ S_kv) is settled in one place.

Score variants (harness.attention.variants): softcap and ALiBi are elementwise on the scores and add no
matmul FLOPs (softmax and scaling are not counted either), and a model's own `scale` costs nothing; sinks
add one logit per row to the softmax (no FLOPs counted) and H·4 bytes read (one float32 logit per head).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from harness.suite.cases import Case
from harness.suite.case_values import DTYPE_BYTES, FP8_DTYPES


#: Padded sequences whose lengths are drawn and counted at a time: memory stays bounded whatever B is.
LENGTH_CHUNK = 1 << 16


@dataclass(frozen=True)
class MaskCounts:
    """What a case's mask leaves, summed over the batch (per head), as exact Python integers.

    The closed forms of `harness.suite.inputs` (`q_lengths`, `kv_lengths`, `visible_pairs`,
    `visible_key_rows`), computed without a per-query or per-key array: costs are asked of cases
    (S = 10⁹) whose tensors could never be allocated, and must not allocate either.
    """

    q_rows: int
    kv_tokens: int
    pairs: int
    key_rows: int


def _maximum(x: Any, y: Any) -> Any:
    """Elementwise max of arrays; the builtin on Python ints (np.maximum would turn them into int64, which overflows)."""
    return np.maximum(x, y) if isinstance(x, np.ndarray) else max(x, y)


def _minimum(x: Any, y: Any) -> Any:
    """Elementwise min of arrays; the builtin on Python ints."""
    return np.minimum(x, y) if isinstance(x, np.ndarray) else min(x, y)


def _capped_triangle(n: Any, w: int | None) -> Any:
    """Σ_{k=1..n} min(k, w) for n ≥ 0 (w None: no cap), elementwise on arrays."""
    if w is None:
        return n * (n + 1) // 2
    m = _minimum(n, w)
    return m * (m + 1) // 2 + (n - m) * w


def _sequence_counts(q_len: Any, kv_len: Any, case: Case) -> tuple[Any, Any]:
    """(visible pairs, keys seen) of sequences with `q_len` real queries against `kv_len` keys (arrays or ints).

    Query i sits at position p = i + kv_len − q_len (bottom-right). Unmasked, it sees all kv_len keys.
    Causal, it sees the p + 1 keys up to p (none when p < 0); with a window w, min(p + 1, w) of them.
    Summed over p = a … kv_len − 1, where a = max(kv_len − q_len, 0) is the first position that sees a
    key, that is T(kv_len) − T(a) with T(n) = Σ_{k≤n} min(k, w). The keys seen by consecutive queries
    form touching intervals, so their union is [max(a − w + 1, 0), kv_len).
    """
    if not (case.causal or case.window is not None):
        return q_len * kv_len, kv_len
    w = case.window
    a = _maximum(kv_len - q_len, 0)
    pairs = _capped_triangle(kv_len, w) - _capped_triangle(a, w)
    first_key = 0 if w is None else _maximum(a - w + 1, 0)
    return pairs, kv_len - first_key


def _padded_kv_lengths(case: Case, chunk: int) -> Iterator[np.ndarray]:
    """`inputs.kv_lengths` of a padded case, `chunk` sequences at a time (the same draws, in the same order)."""
    rng = np.random.default_rng([case.seed, 0x9AD])
    low = max(1, (case.S_kv + 1) // 2)
    for start in range(0, case.B, chunk):
        lengths = rng.integers(low, case.S_kv + 1, size=min(chunk, case.B - start)).astype(np.int64)
        if start == 0:
            lengths[0] = case.S_kv  # one full sequence, as in a real padded batch
        yield lengths


def _ragged_counts(case: Case) -> MaskCounts:
    """A batch of requests: each request's own closed form, summed; the same for every layout of the batch (padding is not work)."""
    q_len = np.asarray(case.seq_lens_q, dtype=object)  # Python integers: exact for any length
    kv_len = np.asarray(case.seq_lens_kv, dtype=object)
    pairs, key_rows = _sequence_counts(q_len, kv_len, case)
    return MaskCounts(int(q_len.sum()), int(kv_len.sum()), int(np.sum(pairs)), int(np.sum(key_rows)))


@functools.lru_cache(maxsize=4096)
def mask_counts(case: Case, chunk: int = LENGTH_CHUNK) -> MaskCounts:
    """Rows, tokens and visible pairs of a case in closed form: O(1) memory, O(B / chunk) numpy calls with padding."""
    if case.ragged:
        return _ragged_counts(case)
    if not case.padding:
        pairs, key_rows = _sequence_counts(case.S_q, case.S_kv, case)
        return MaskCounts(case.B * case.S_q, case.B * case.S_kv, case.B * int(pairs), case.B * int(key_rows))
    # One length per sequence: drawn a chunk at a time. int64 arithmetic while no intermediate can overflow
    # (every one is below (S + 1)² per sequence), Python integers (object arrays) beyond that.
    exact = (max(case.S_q, case.S_kv) + 1) ** 2 * min(chunk, case.B) >= 2**62
    totals = [0, 0, 0, 0]
    for kv_len in _padded_kv_lengths(case, chunk):
        if exact:
            kv_len = kv_len.astype(object)
        q_len = kv_len if case.S_q == case.S_kv else case.S_q  # a right-padded batch pads its queries too
        pairs, key_rows = _sequence_counts(q_len, kv_len, case)
        q_rows = kv_len.sum() if case.S_q == case.S_kv else case.S_q * len(kv_len)
        for index, value in enumerate((q_rows, kv_len.sum(), pairs.sum(), key_rows.sum())):
            totals[index] += int(value)
    return MaskCounts(*totals)


def element_size(case: Case) -> int:
    """Bytes per element of the case's dtype, Q's (without importing torch: the report's cost model runs without it)."""
    return DTYPE_BYTES[case.dtype]


def kv_element_size(case: Case) -> int:
    """Bytes per element of K and V: the FP8 cache's one where `kv_dtype` is set, else the case's dtype's."""
    return DTYPE_BYTES[case.kv_dtype or case.dtype]


def output_element_size(case: Case) -> int:
    """Bytes per element of the output: an FP8 attention writes bf16 (2), every other case its dtype."""
    return 2 if case.dtype in FP8_DTYPES else DTYPE_BYTES[case.dtype]


def forward_flops(case: Case) -> int:
    """Forward FLOPs: `2·H·(d_k + d_v)` per visible (query, key) pair, summed over the batch.

    Q·Kᵀ costs 2·d_k per pair and P·V 2·d_v per pair. Without a mask there are B·S_q·S_kv pairs;
    a causal mask (bottom-right aligned) leaves S(S+1)/2 per sequence when S_q = S_kv, and in
    general Σ_i min(S_kv, i + 1 + S_kv − S_q) over queries i; padding and windows count what they leave.
    Softmax and scaling are not counted (the convention of FlashAttention and FlashInfer).
    """
    return 2 * case.H * (case.d_k + case.d_v) * mask_counts(case).pairs


def backward_flops(case: Case) -> int:
    """Backward FLOPs: `2·H·(3·d_k + 2·d_v)` per visible pair, its five products.

    S = Q·Kᵀ recomputed (2·d_k), dV = Pᵀ·dO (2·d_v), dP = dO·Vᵀ (2·d_v), dQ = dS·K (2·d_k), dK = dSᵀ·Q (2·d_k): 2.5× the
    forward only when d_k = d_v (FlashAttention's benchmark convention); a DeepSeek-shaped 192/128 backward is 832/800 of that.
    """
    return 2 * case.H * (3 * case.d_k + 2 * case.d_v) * mask_counts(case).pairs


def flops(case: Case) -> int:
    """FLOPs of the case's pass: the forward's, the backward's five products, or both (exact integers, however large)."""
    if case.mode == "fwd":
        return forward_flops(case)
    if case.mode == "bwd":
        return backward_flops(case)
    return forward_flops(case) + backward_flops(case)


def touched_bytes(case: Case) -> dict[str, int]:
    """Bytes of each tensor that the mask leaves a kernel to touch: q, k, v, o.

    Query rows: the real ones (padded query rows of a padded batch see nothing). Key rows: those at
    least one query sees (padding and a sliding window shrink them; causal does not, since the last
    query sees every key). MLA reads V inside K's latent, so V costs nothing extra. A ragged batch counts
    its requests' real tokens in every layout (a padded row's padding is waste, not work); a paged one
    also reads its block table, one int32 per page a request's keys span ("table"); a case with sinks its
    H float32 sink logits ("sinks"). FP8 inputs and an FP8 KV cache count one byte an element; an FP8 case's output is bf16.
    """
    size, kv_size = element_size(case), kv_element_size(case)
    counts = mask_counts(case)
    q_rows, kv_rows = counts.q_rows, counts.key_rows
    touched = {
        "q": q_rows * case.H * case.d_k * size,
        "k": kv_rows * case.H_kv * case.d_k * kv_size,
        "v": 0 if case.mla else kv_rows * case.H_kv * case.d_v * kv_size,
        "o": q_rows * case.H * case.d_v * output_element_size(case),
    }
    if case.sinks:
        touched["sinks"] = 4 * case.H
    if case.layout == "paged":
        touched["table"] = 4 * sum(-(-n // case.page_size) for n in case.seq_lens_kv)
    return touched


def min_bytes(case: Case) -> int:
    """The fewest bytes the pass must move through memory, counting only what the mask leaves.

    fwd: read Q, K, V once and write O once. bwd: read Q, K, V, O and dO, write dQ, dK, dV (MLA reads V inside K's
    latent, but its backward still writes dV: H_kv·d_v per key row). fwd_bwd: the sum of both. Decoding (S_q = 1) is dominated by K and V:
    `(q + o + Σ_b len_b·H_kv·(d_k + d_v))·bytes`, the formula FlashInfer's decode benchmarks use.
    """
    t = touched_bytes(case)
    fwd = t["q"] + t["k"] + t["v"] + t["o"] + t.get("table", 0) + t.get("sinks", 0)
    dv_written = mask_counts(case).key_rows * case.H_kv * case.d_v * kv_element_size(case) if case.mla else t["v"]
    bwd = 2 * (t["q"] + t["k"]) + t["v"] + dv_written + 2 * t["o"] + t.get("sinks", 0)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[case.mode]


def kv_cache_bytes_per_token(case: Case) -> int:
    """KV-cache bytes one token costs in one layer: `H_kv·(d_k + d_v)·bytes`, or `d_k·bytes` for MLA's one latent.

    MHA : GQA : MQA = H : H_kv : 1 heads, i.e. 1 : H_kv/H : 1/H of MHA's bytes. An FP8 cache is one byte an element.
    """
    size = kv_element_size(case)
    if case.mla:
        return case.d_k * size
    return case.H_kv * (case.d_k + case.d_v) * size


def kv_cache_bytes(case: Case) -> int:
    """Bytes of the keys and values a decoder caches for this case: its real tokens (Σ_b len_b) × bytes per token."""
    return mask_counts(case).kv_tokens * kv_cache_bytes_per_token(case)


def arithmetic_intensity(case: Case) -> float:
    """FLOPs per byte moved."""
    return flops(case) / min_bytes(case)


def model_crossover(D: int, H: int, H_kv: int, causal: bool) -> float:
    """The S at which the core's FLOPs equal the projections': S* = D·(1 + H_kv/H), twice that when causal.

    Projections: Q and O are D×D, K and V are D×(D·H_kv/H), so 2·B·S·D²·(2 + 2·H_kv/H) FLOPs; the core
    is 4·B·S²·D, half of it causal. For MHA without a mask that is the textbook S* = 2D.
    """
    return D * (1 + H_kv / H) * (2 if causal else 1)
