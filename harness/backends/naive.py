"""The naive backend: eager matmul, softmax, matmul, materialising the `[B, H, S_q, S_kv]` scores."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.ragged_views import padded, paged_gather, per_request, request_masks, requests
from harness.backends.registry import register
from harness.attention.eager import naive_attention
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.suite.ragged import RaggedInputs


@register
class NaiveBackend(Backend):
    """Eager PyTorch attention: the baseline every fused kernel is compared with."""

    name = "naive"
    family = "eager"
    description = "eager matmul → softmax → matmul; materialises the S_q×S_kv scores"
    native_gqa = True
    materializes_scores = True
    returns_weights = True
    layouts = frozenset({"dense", "padded", "packed", "paged"})

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Build the mask once (untimed) and return the eager computation; a ragged batch padded, request by request, or gathered."""
        if case.ragged:
            return self._prepare_ragged(case, inputs)
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        return Prepared(fn=lambda: naive_attention(q, k, v, mask), leaves=(q, k, v))

    @staticmethod
    def _prepare_ragged(case: Case, inputs: RaggedInputs) -> Prepared:
        """padded: one masked rectangle; packed: a loop over the requests; paged: the pages gathered, then that loop."""
        if case.layout == "padded":
            rect = padded(inputs, case.window)
            return Prepared(fn=lambda: naive_attention(rect.q, rect.k, rect.v, rect.mask), to_bhsd=rect.packed_output,
                            notes={"padded_to": [case.S_q, case.S_kv]})

        def attend(r):
            return naive_attention(r.q, r.k, r.v, r.mask)

        masks = request_masks(inputs, case.window)
        if case.layout == "packed":
            batch = requests(inputs, inputs.k, inputs.v, masks)
            return Prepared(fn=lambda: per_request(attend, batch), notes={"packed_via": "per_request_loop"})
        gather = paged_gather(inputs)

        def paged_step() -> torch.Tensor:
            k, v = gather()
            return per_request(attend, requests(inputs, k, v, masks))

        return Prepared(fn=paged_step, notes={"paged_via": "gather_then_per_request_loop"})

    def weights(self, case: Case, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the attention weights `[B, H, S_q, S_kv]` for a case (not timed)."""
        mask = visible_mask(case, device=inputs.q.device)
        return naive_attention(inputs.q, inputs.k, inputs.v, mask, return_weights=True)
