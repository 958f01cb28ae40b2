"""Analytic costs of a case: FLOPs, minimum bytes moved, KV-cache bytes, and the layer's crossover model.

Every throughput figure in a record is derived from these formulas and nothing else, so that a
disputed count (causal, S_q ≠ S_kv) is settled in one place.
"""

from __future__ import annotations

from harness.suite.cases import Case
from harness.suite.inputs import kv_lengths, q_lengths, torch_dtype, visible_key_rows, visible_pairs

#: Backward costs 2.5× the forward (two matmuls become five); forward+backward 3.5×.
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def element_size(case: Case) -> int:
    """Bytes per element of the case's dtype."""
    return torch_dtype(case).itemsize


def forward_flops(case: Case) -> int:
    """Forward FLOPs: `2·H·(d_k + d_v)` per visible (query, key) pair, summed over the batch.

    Q·Kᵀ costs 2·d_k per pair and P·V 2·d_v per pair. Without a mask there are B·S_q·S_kv pairs;
    a causal mask (bottom-right aligned) leaves S(S+1)/2 per sequence when S_q = S_kv, and in
    general Σ_i min(S_kv, i + 1 + S_kv − S_q) over queries i; padding and windows count what they leave.
    Softmax and scaling are not counted (the convention of FlashAttention and FlashInfer).
    """
    return 2 * case.H * (case.d_k + case.d_v) * visible_pairs(case)


def flops(case: Case) -> int:
    """FLOPs of the case's pass (fwd, bwd = 2.5× fwd, fwd_bwd = 3.5× fwd)."""
    return int(round(forward_flops(case) * MODE_FLOP_FACTOR[case.mode]))


def tensor_bytes(case: Case) -> dict[str, int]:
    """Bytes of each tensor as allocated: q, k, v, o (K and V at H_kv heads, padding included)."""
    size = element_size(case)
    return {
        "q": case.B * case.H * case.S_q * case.d_k * size,
        "k": case.B * case.H_kv * case.S_kv * case.d_k * size,
        "v": case.B * case.H_kv * case.S_kv * case.d_v * size,
        "o": case.B * case.H * case.S_q * case.d_v * size,
    }


def touched_bytes(case: Case) -> dict[str, int]:
    """Bytes of each tensor that the mask leaves a kernel to touch: q, k, v, o.

    Query rows: the real ones (padded query rows of a padded batch see nothing). Key rows: those at
    least one query sees (padding and a sliding window shrink them; causal does not, since the last
    query sees every key). MLA reads V inside K's latent, so V costs nothing extra.
    """
    size = element_size(case)
    q_rows, kv_rows = int(q_lengths(case).sum()), visible_key_rows(case)
    return {
        "q": q_rows * case.H * case.d_k * size,
        "k": kv_rows * case.H_kv * case.d_k * size,
        "v": 0 if case.mla else kv_rows * case.H_kv * case.d_v * size,
        "o": q_rows * case.H * case.d_v * size,
    }


def min_bytes(case: Case) -> int:
    """The fewest bytes the pass must move through memory, counting only what the mask leaves.

    fwd: read Q, K, V once and write O once. bwd: read Q, K, V, O and dO, write dQ, dK, dV.
    fwd_bwd: the sum of both. Decoding (S_q = 1) is dominated by K and V:
    `(q + o + Σ_b len_b·H_kv·(d_k + d_v))·bytes`, the formula FlashInfer's decode benchmarks use.
    """
    t = touched_bytes(case)
    fwd = t["q"] + t["k"] + t["v"] + t["o"]
    bwd = 2 * (t["q"] + t["k"] + t["v"]) + 2 * t["o"]
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[case.mode]


def kv_cache_bytes_per_token(case: Case) -> int:
    """KV-cache bytes one token costs in one layer: `H_kv·(d_k + d_v)·bytes`, or `d_k·bytes` for MLA's one latent.

    MHA : GQA : MQA = H : H_kv : 1 heads, i.e. 1 : H_kv/H : 1/H of MHA's bytes.
    """
    size = element_size(case)
    if case.mla:
        return case.d_k * size
    return case.H_kv * (case.d_k + case.d_v) * size


def kv_cache_bytes(case: Case) -> int:
    """Bytes of the keys and values a decoder caches for this case: its real tokens (Σ_b len_b) × bytes per token."""
    return int(kv_lengths(case).sum()) * kv_cache_bytes_per_token(case)


def arithmetic_intensity(case: Case) -> float:
    """FLOPs per byte moved."""
    return flops(case) / min_bytes(case)


def layer_flops(B: int, S: int, D: int) -> dict[str, int]:
    """FLOPs of a multi-head self-attention layer: projections `8·B·S·D²`, core `4·B·S²·D` (d_v = d_k, no mask)."""
    return {"projections": 8 * B * S * D * D, "core": 4 * B * S * S * D}


def model_crossover(D: int, H: int, H_kv: int, causal: bool) -> float:
    """The S at which the core's FLOPs equal the projections': S* = D·(1 + H_kv/H), twice that when causal.

    Projections: Q and O are D×D, K and V are D×(D·H_kv/H), so 2·B·S·D²·(2 + 2·H_kv/H) FLOPs; the core
    is 4·B·S²·D, half of it causal. For MHA without a mask that is the textbook S* = 2D.
    """
    return D * (1 + H_kv / H) * (2 if causal else 1)
