"""The score variants of current models: what each one does to a row of scores, ALiBi's slopes, and which a case uses.

A case's fields name them (harness.suite.cases.Case: `softcap`, `sinks`, `alibi`, `scale`); the float64
reference (harness.attention.reference) implements each from the definitions below, on its own, and a
backend declares the ones it computes exactly (`Backend.score_variants`): any other is refused, never
approximated.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.suite.inputs import query_positions

#: Every score variant, with what it does to the scores s = q·kᵀ·scale of one query row.
VARIANTS: dict[str, str] = {
    "softcap": "each scaled score s becomes softcap·tanh(s/softcap) before masking (Gemma 2, Grok), so a masked score stays −inf",
    "sinks": "one learned logit per query head joins every row's softmax denominator and contributes no value (gpt-oss)",
    "alibi": "a bias −slope_h·|pos(i) − j| with Press et al.'s slopes, pos(i) the query's own key position (bottom-right)",
    "scale": "the softmax scale is the model's own instead of 1/√d_k",
}


def variants_of(case: Any) -> frozenset[str]:
    """The score variants a case uses (names of VARIANTS)."""
    used = {"softcap": case.softcap is not None, "sinks": case.sinks, "alibi": case.alibi, "scale": case.scale is not None}
    return frozenset(name for name, on in used.items() if on)


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start ** (i + 1) for i in range(n)]


def _slopes(n: int) -> list[float]:
    if math.log2(n).is_integer():
        return _power_of_two_slopes(n)
    # Not a power of two: the slopes of the closest power below, then every other slope of twice that (Press et al.).
    closest = 2 ** math.floor(math.log2(n))
    return _power_of_two_slopes(closest) + _slopes(2 * closest)[0::2][: n - closest]


def alibi_slopes(H: int) -> torch.Tensor:
    """ALiBi's slope per query head, float32 `[H]` (FlashAttention's `alibi_slopes`): 2^(−8h/H) for h = 1…H when H is a power of two.

    float32 because that is what kernels are handed; every implementation here, the float64 reference
    included, uses these very values, so the slopes' own rounding is no error of a backend.
    """
    return torch.tensor(_slopes(H), dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, S_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """The ALiBi bias `[B, H, S_q, S_kv]` (B of `q_pos [B, S_q]`, H of `slopes`), in `dtype` on q_pos's device: −slope_h·|pos(i) − j|."""
    work = torch.float64 if dtype == torch.float64 else torch.float32  # the product rounded once, in the wider of the two
    j = torch.arange(S_kv, device=q_pos.device, dtype=work)
    distance = (q_pos.to(work)[:, None, :, None] - j).abs()
    return (-slopes.to(q_pos.device, work)[None, :, None, None] * distance).to(dtype)


def case_alibi_bias(case: Any, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A dense case's ALiBi bias `[B, H, S_q, S_kv]`, each query at its own key position (harness.suite.inputs.query_positions)."""
    positions = torch.as_tensor(query_positions(case), device=device)
    return alibi_bias(alibi_slopes(case.H), positions, case.S_kv, dtype)


def request_alibi_bias(H: int, q_len: int, kv_len: int, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One request's ALiBi bias `[1, H, q_len, kv_len]`: its queries are the last q_len of its kv_len positions."""
    positions = torch.arange(q_len, device=device)[None] + (kv_len - q_len)
    return alibi_bias(alibi_slopes(H), positions, kv_len, dtype)
