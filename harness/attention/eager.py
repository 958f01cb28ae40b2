"""The eager attention computation: what the `naive` backend times and what the agreement rule calls "eager in the case's dtype".

It lives below both so that the float64 check (`numerics`) and the backends share it without
importing each other.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q·Kᵀ·scale + mask)·V in eager PyTorch, `[B, H, S, d]` in and out.

    GQA/MQA without copying K/V: queries are viewed as `[B, H_kv, g, S_q, d]` and broadcast
    against `[B, H_kv, 1, S_kv, d]`, so query head h reads K/V head h // g.
    `mask` is boolean, True where visible, broadcastable to `[B, 1, S_q, S_kv]`. Rows with no
    visible key give zeros (FlashAttention's convention), not NaN.
    The scale is applied to Q (a `[B, H, S_q, d]` copy) rather than to the scores, so that only
    two score-sized tensors (scores and weights) are ever alive, as in the textbook layer.
    `matmul` computes both products; the agreement rule passes its own on the CPU (harness.attention.reference.eager_kernel).
    Score variants (harness.attention.variants), all in the scores' dtype: `softcap` c maps s to c·tanh(s/c);
    `bias` (ALiBi's, broadcastable to `[B, H, S_q, S_kv]`) is added; `sinks` `[H]` join each row's softmax
    as one more logit whose weight is dropped (so a row's weights sum to less than 1).
    """
    B, H, S_q, d_k = q.shape
    H_kv, S_kv = k.shape[1], k.shape[2]
    g = H // H_kv
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    qg = (q * scale).view(B, H_kv, g, S_q, d_k)
    scores = matmul(qg, k.unsqueeze(2).transpose(-2, -1))  # [B, H_kv, g, S_q, S_kv]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.expand(-1, H, -1, -1).reshape(bias.shape[0], H_kv, g, S_q, S_kv).to(scores.dtype)
    if mask is not None:
        scores.masked_fill_(~mask.unsqueeze(1), float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.to(scores.dtype).view(1, H_kv, g, 1, 1).expand(B, H_kv, g, S_q, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S_kv]
    del scores
    if mask is not None:
        # In place unless autograd saved the softmax output for backward.
        weights = weights.nan_to_num(nan=0.0) if weights.requires_grad else weights.nan_to_num_(nan=0.0)
    out = matmul(weights, v.unsqueeze(2)).view(B, H, S_q, v.shape[-1])
    if return_weights:
        return out, weights.view(B, H, S_q, S_kv)
    return out
