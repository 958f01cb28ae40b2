"""The naive backend: eager matmul, softmax, matmul, materialising the `[B, H, S_q, S_kv]` scores."""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.ragged_views import padded, padded_prepared, paged_gather, request_masks, requests
from harness.backends.registry import register
from harness.attention.eager import naive_attention
from harness.attention.variants import case_alibi_bias, request_alibi_bias
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.suite.ragged import RaggedInputs


def variant_arguments(case: Case, inputs: AttentionInputs | RaggedInputs) -> dict[str, Any]:
    """naive_attention's score-variant arguments for a dense case: the scale, softcap, sinks and the ALiBi bias (built untimed)."""
    kwargs: dict[str, Any] = {"scale": case.softmax_scale, "softcap": case.softcap, "sinks": inputs.sinks}
    if case.alibi:
        kwargs["bias"] = case_alibi_bias(case, inputs.q.device, inputs.q.dtype)
    return kwargs


@register
class NaiveBackend(Backend):
    """Eager PyTorch attention: the baseline every fused kernel is compared with."""

    name = "naive"
    family = "eager"
    description = "eager matmul → softmax → matmul; materialises the S_q×S_kv scores"
    native_gqa = True
    materializes_scores = True
    returns_weights = True
    deterministic_backward = True  # matmuls and softmax: no atomics in its backward
    layouts = frozenset({"dense", "padded", "packed", "paged"})
    score_variants = frozenset({"softcap", "sinks", "alibi", "scale"})
    ragged_backward = frozenset({"padded", "packed"})
    kv_dtypes = frozenset({"fp8_e4m3", "fp8_e5m2"})

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Build the mask once (untimed) and return the eager computation; a ragged batch padded, request by request, or gathered."""
        if case.ragged:
            return self._prepare_ragged(case, inputs)
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        kwargs = variant_arguments(case, inputs)
        if case.kv_dtype is not None:
            # An FP8 KV cache is read as FP8 and widened to the queries' dtype inside the call, as a decode kernel loads it.
            dtype = q.dtype
            k_scale, v_scale = inputs.descales["k"].to(dtype), inputs.descales["v"].to(dtype)  # once, untimed
            return Prepared(fn=lambda: naive_attention(q, k.to(dtype) * k_scale, v.to(dtype) * v_scale, mask, **kwargs),
                            notes={"kv_cache": f"{case.kv_dtype}, widened in the call"})
        return Prepared(fn=lambda: naive_attention(q, k, v, mask, **kwargs), leaves=(q, k, v))

    @staticmethod
    def _prepare_ragged(case: Case, inputs: RaggedInputs) -> Prepared:
        """padded: one masked rectangle; packed: a loop over the requests; paged: the pages gathered, then that loop."""
        device, dtype = inputs.q.device, inputs.q.dtype
        common = {"scale": case.softmax_scale, "softcap": case.softcap, "sinks": inputs.sinks}
        biases = [request_alibi_bias(case.H, q_len, kv_len, device, dtype) if case.alibi else None
                  for q_len, kv_len in zip(inputs.seq_lens_q, inputs.seq_lens_kv)]
        backward = case.mode != "fwd"
        if case.layout == "padded":
            rect = padded(inputs, case.window, requires_grad=backward)
            bias = None
            if case.alibi:
                # Each request's own bias in its corner of the rectangle; the padding is masked, so its bias never counts.
                bias = torch.zeros(inputs.batch_size, case.H, case.S_q, case.S_kv, device=device, dtype=dtype)
                for i, own in enumerate(biases):
                    bias[i, :, :own.shape[2], :own.shape[3]] = own[0]
            return padded_prepared(rect, Prepared(fn=lambda: naive_attention(rect.q, rect.k, rect.v, rect.mask, bias=bias, **common),
                                                  notes={"padded_to": [case.S_q, case.S_kv]}), backward)

        masks = request_masks(inputs, case.window)

        def attend_all(batch: list) -> torch.Tensor:
            # As ragged_views.per_request, with each request's own bias beside it.
            return torch.cat([naive_attention(r.q, r.k, r.v, r.mask, bias=b, **common)[0].transpose(0, 1) for r, b in zip(batch, biases)])

        if case.layout == "packed":
            if backward:
                # The packed q, k, v are the leaves: each call slices them afresh, so each call's graph reaches them.
                return Prepared(fn=lambda: attend_all(requests(inputs, inputs.k, inputs.v, masks)), leaves=(inputs.q, inputs.k, inputs.v),
                                notes={"packed_via": "per_request_loop"})
            batch = requests(inputs, inputs.k, inputs.v, masks)
            return Prepared(fn=lambda: attend_all(batch), notes={"packed_via": "per_request_loop"})
        gather = paged_gather(inputs)

        def paged_step() -> torch.Tensor:
            k, v = gather()
            return attend_all(requests(inputs, k, v, masks))

        return Prepared(fn=paged_step, notes={"paged_via": "gather_then_per_request_loop"})

    def weights(self, case: Case, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the attention weights `[B, H, S_q, S_kv]` for a case (not timed)."""
        mask = visible_mask(case, device=inputs.q.device)
        k, v = inputs.k, inputs.v
        if case.kv_dtype is not None:
            k, v = (t.to(inputs.q.dtype) * inputs.descales[name].to(inputs.q.dtype) for t, name in ((k, "k"), (v, "v")))
        return naive_attention(inputs.q, k, v, mask, return_weights=True, **variant_arguments(case, inputs))
