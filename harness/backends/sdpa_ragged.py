"""SDPA on a batch of requests: padded with a mask, packed as nested jagged tensors or request by request, paged gathered first.

torch's SDPA takes nested jagged tensors (NJT) only without a causal flag or a mask, and (on the CPU)
only through its math kernel; where it refuses them the batch runs request by request, each request
one SDPA call over its own keys. The record's notes say which (`packed_via`) and, when NJT was
refused, torch's reason (`nested_jagged_refused`). Whatever the path, the kernel stays the forced one:
every call runs inside the backend's own `sdpa_kernel` context, and a kernel torch refuses is `unsupported`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.backends.base import Prepared
from harness.backends.ragged_views import Request, padded, paged_gather, request_masks, requests
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs

#: What one SDPA call is: (q, k, v, keyword arguments) → output, inside the backend's kernel context.
Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor]
#: A probe: one untimed call, None when it ran, else torch's reason.
Probe = Callable[[Callable[[], torch.Tensor]], str | None]


def _request_arguments(request: Request, gqa: bool) -> dict[str, Any]:
    """One request's mask arguments: none, `is_causal` when its causal mask is square (top-left = bottom-right), else its bool mask."""
    kwargs: dict[str, Any] = {"enable_gqa": True} if gqa else {}
    if request.mask is None:
        return kwargs
    q_len, kv_len = request.mask.shape[-2:]
    if q_len == kv_len and bool(request.mask[0, 0].equal(torch.ones_like(request.mask[0, 0]).tril())):
        return {**kwargs, "is_causal": True}
    return {**kwargs, "attn_mask": request.mask}


def _nested(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Packed `[T, H, d]` rows as a nested jagged `[B, H, j, d]` tensor (a view of the same storage)."""
    return torch.nested.nested_tensor_from_jagged(values, offsets.long()).transpose(1, 2)


def _loop_step(run: Run, inputs: RaggedInputs, case: Case, gqa: bool,
               kv: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], torch.Tensor]:
    """One SDPA call per request over the keys and values `kv()` gives; the packed output."""
    masks = request_masks(inputs, case.window)
    arguments = [_request_arguments(r, gqa) for r in requests(inputs, inputs.k, inputs.v, masks)]

    def step() -> torch.Tensor:
        k, v = kv()
        batch = requests(inputs, k, v, masks)
        return torch.cat([run(r.q, r.k, r.v, a)[0].transpose(0, 1) for r, a in zip(batch, arguments)])

    return step


def _nested_step(run: Run, inputs: RaggedInputs, case: Case, kv: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], torch.Tensor]:
    """One SDPA call on nested jagged tensors; K/V expanded to H heads inside the call (NJT has no GQA broadcast)."""
    q, g = _nested(inputs.q, inputs.cu_seqlens_q), case.group_size

    def step() -> torch.Tensor:
        k, v = kv()
        if g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        out = run(q, _nested(k, inputs.cu_seqlens_kv), _nested(v, inputs.cu_seqlens_kv), {})
        return out.transpose(1, 2).values()

    return step


def prepare_ragged(case: Case, inputs: RaggedInputs, run: Run, probe: Probe, gqa: bool, name: str, kernel: str | None,
                   prepare_rectangle: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]], Prepared]) -> Prepared:
    """The Prepared of a padded, packed or paged batch for one SDPA backend (`run` its call, `probe` its refusal test,
    `kernel` the forced one or None for torch's choice, which may differ from request to request)."""
    if case.layout == "padded":
        rect = padded(inputs, case.window)
        prepared = prepare_rectangle(rect.q, rect.k, rect.v, {"attn_mask": rect.mask})
        prepared.to_bhsd = rect.packed_output
        prepared.notes["padded_to"] = [case.S_q, case.S_kv]
        return prepared
    if case.layout == "packed":
        kv, via = (lambda: (inputs.k, inputs.v)), {}
    else:
        kv, via = paged_gather(inputs), {"paged_via": "gather_then_sdpa"}
    notes: dict[str, Any] = {**via, "kv_expanded": False, "sdpa_kernel": kernel}
    if not case.causal and case.window is None:
        nested = _nested_step(run, inputs, case, kv)
        refusal = probe(nested)
        if refusal is None:
            return Prepared(fn=nested, notes={**notes, "packed_via": "nested_jagged", "kv_expanded": case.group_size > 1})
        notes["nested_jagged_refused"] = refusal
    else:
        notes["nested_jagged_refused"] = "torch's SDPA takes nested jagged tensors without a causal flag or a mask only"
    loop = _loop_step(run, inputs, case, gqa, kv)
    refusal = probe(loop)
    if refusal is not None:
        raise Unsupported(f"{name}: {refusal}")
    return Prepared(fn=loop, notes={**notes, "packed_via": "per_request_loop"})
