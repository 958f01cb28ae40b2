"""The score variants and head dims of xFormers' `memory_efficient_attention` (xformers 0.0.35, ops/fmha).

It takes `scale` and nothing else of the variants: no softcap (ops/fmha/flash.py hands FlashAttention
`softcap = 0.0`), no ALiBi (the same call passes `alibi_slopes=None`, and attn_bias has no ALiBi class: only a
materialised tensor bias, which is not adapted here) and no sink argument. Its widest operator, cutlass,
declares `SUPPORTED_MAX_K = 65536` (flash and flash3 256, triton_splitk 512): no head dim above is served.
"""

from __future__ import annotations

SCORE_VARIANTS = frozenset({"scale"})
VARIANT_REASONS = {
    "softcap": "memory_efficient_attention has no softcap: its flash operator calls FlashAttention with softcap=0.0",
    "alibi": ("memory_efficient_attention has no ALiBi: no attn_bias class for it, and its flash operator passes alibi_slopes=None "
              "(a materialised tensor bias is not adapted here)"),
    "sinks": "memory_efficient_attention has no attention-sink argument",
}
#: ops/fmha/cutlass.py FwOp.SUPPORTED_MAX_K, the largest of xFormers' CUDA operators.
MAX_HEAD_DIM = 65536


def head_dim_refusal(d_k: int, d_v: int) -> str | None:
    """Why no xFormers operator takes these head dims, or None."""
    if max(d_k, d_v) <= MAX_HEAD_DIM:
        return None
    return f"xformers' operators take head dims up to {MAX_HEAD_DIM} (cutlass FwOp.SUPPORTED_MAX_K); case has d_k={d_k}, d_v={d_v}"
