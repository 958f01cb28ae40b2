"""The naive backend: eager matmul, softmax, matmul, materialising the `[B, H, S_q, S_kv]` scores."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.attention.eager import naive_attention
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask


@register
class NaiveBackend(Backend):
    """Eager PyTorch attention: the baseline every fused kernel is compared with."""

    name = "naive"
    family = "eager"
    description = "eager matmul → softmax → matmul; materialises the S_q×S_kv scores"
    native_gqa = True
    materializes_scores = True
    returns_weights = True

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Build the mask once (untimed) and return the eager computation."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        return Prepared(fn=lambda: naive_attention(q, k, v, mask), leaves=(q, k, v))

    def weights(self, case: Case, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the attention weights `[B, H, S_q, S_kv]` for a case (not timed)."""
        mask = visible_mask(case, device=inputs.q.device)
        return naive_attention(inputs.q, inputs.k, inputs.v, mask, return_weights=True)
