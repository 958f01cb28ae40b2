"""SDPA on a batch of requests: padded with a mask, packed as nested jagged tensors or request by request, paged gathered first.

Nothing in a timed call reads a tensor's values back to the host: every length, offset and min/max
length the call needs is a Python int taken from `RaggedInputs` in `prepare`. On CUDA each such read
would be a device-to-host sync inside the measurement, and it would forbid CUDA-graph capture.

torch's SDPA takes nested jagged tensors (NJT) only without a causal flag or a mask. Its math path for
them splits the batch by lengths it reads on the host at every call (torch/nested/_internal/sdpa.py), and
math is the only path on the CPU, so NJT is tried on CUDA with a kernel other than math only, and kept
where one call under CUDA's sync debug mode never synchronised. Elsewhere the batch runs request by
request, each request one SDPA call over its own keys with the lightest mask that is right for it
(`request_arguments`). The record's notes say which (`packed_via`), why NJT was not used
(`nested_jagged_refused`), and how many requests got each mask form (`mask_forms`). Whatever the path,
the kernel stays the forced one: every call runs inside the backend's own `sdpa_kernel` context, and a
kernel torch refuses is `unsupported` in torch's words.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch

from harness.attention.variants import request_alibi_bias
from harness.backends.base import Prepared
from harness.backends.ragged_views import padded, padded_prepared, paged_gather, requests
from harness.errors import Unsupported, one_line
from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs, sequence_mask

#: What one SDPA call is: (q, k, v, keyword arguments) → output, inside the backend's kernel context.
Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor]
#: A probe: one untimed call, None when it ran, else torch's reason.
Probe = Callable[[Callable[[], torch.Tensor]], str | None]
#: Why NJT is not tried where torch would run it through its math path.
NJT_MATH_READS = ("torch runs SDPA on nested jagged tensors through its math path {where}, and that path reads every request's "
                  "length back to the host at each call (it splits the batch by them)")
NJT_MASKED = "torch's SDPA takes nested jagged tensors without a causal flag or a mask only"
NJT_ALIBI = "ALiBi is a float attn_mask, and torch's SDPA takes nested jagged tensors without a mask only"


def request_arguments(q_len: int, kv_len: int, causal: bool, window: int | None, device: torch.device,
                      gqa: bool) -> tuple[dict[str, Any], str]:
    """One request's SDPA mask arguments and the name of their form: none, is_causal, causal_lower_right or bool_mask.

    A request whose queries see all its keys (not causal, or one bottom-right query) gets no mask; a
    square causal one `is_causal`; a causal one with fewer queries than keys (a chunked prefill, speculative
    draft tokens) the lower-right CausalBias. Only a window (or more queries than keys) needs a real mask.
    CUDA's flash kernel takes no mask at all, so a bool mask there would refuse every serving batch.
    """
    kwargs: dict[str, Any] = {"enable_gqa": True} if gqa else {}
    if window is None and (not causal or q_len == 1):
        return kwargs, "none"
    if window is None and q_len == kv_len:
        return {**kwargs, "is_causal": True}, "is_causal"
    if window is None and q_len < kv_len:
        # CausalBias._dispatch (torch/nn/attention/bias.py) runs a lower-right bias with q_len < kv_len as
        # aten._scaled_dot_product_flash_attention(is_causal=True) where can_use_flash_attention accepts the
        # call (flash's causal is bottom-right), else aten._efficient_attention_forward with the lower-right
        # mask type where can_use_efficient_attention does, else SDPA over the materialised bool mask. Both
        # checks honour sdpa_kernel (check_runtime_disabled_*), so a forced kernel stays forced. The efficient
        # kernel has no GQA, so a GQA request forced there meets the mask and torch's refusal. On the CPU
        # neither check holds and the mask is materialised at each call, inside the timed call.
        from torch.nn.attention.bias import causal_lower_right

        return {**kwargs, "attn_mask": causal_lower_right(q_len, kv_len)}, "causal_lower_right"
    mask = sequence_mask(q_len, kv_len, causal, window, device)
    return {**kwargs, "attn_mask": mask[None, None]}, "bool_mask"


def alibi_arguments(case: Case, q_len: int, kv_len: int, device: torch.device, gqa: bool) -> tuple[dict[str, Any], str]:
    """One request's SDPA arguments with ALiBi: its bias as a float mask, −inf where its own mask hides a key; form `alibi_mask`."""
    bias = request_alibi_bias(case.H, q_len, kv_len, device, torch.float32)
    visible = sequence_mask(q_len, kv_len, case.causal, case.window, device)
    bias = bias if visible is None else bias.masked_fill(~visible, float("-inf"))
    return {**({"enable_gqa": True} if gqa else {}), "attn_mask": bias}, "alibi_mask"


def nested_rows(values: torch.Tensor, offsets: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    """Packed `[T, H, d]` rows as a nested jagged `[B, H, j, d]` view, with its min and max length given so torch never reads them back."""
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min(lengths), max_seqlen=max(lengths)).transpose(1, 2)


def _loop_step(run: Run, inputs: RaggedInputs, case: Case, gqa: bool, kv: Callable[[], tuple[torch.Tensor, torch.Tensor]],
               fixed_kv: bool) -> tuple[Callable[[], torch.Tensor], dict[str, int]]:
    """One SDPA call per request over the keys and values `kv()` gives, the packed output; and how many requests got each mask form."""
    chosen = [alibi_arguments(case, q_len, kv_len, inputs.q.device, gqa) if case.alibi
              else request_arguments(q_len, kv_len, case.causal, case.window, inputs.q.device, gqa)
              for q_len, kv_len in zip(inputs.seq_lens_q, inputs.seq_lens_kv)]
    own_scale = {"scale": case.scale} if case.scale is not None else {}
    arguments = [{**kwargs, **own_scale, **_float_mask_dtype(kwargs, inputs.q.dtype)} for kwargs, _ in chosen]
    unmasked = [None] * inputs.batch_size
    # Packed keys are the inputs' own, so their views are built once; gathered ones are new at each call. In backward
    # modes the packed q, k, v are the leaves, and each call slices them afresh so its graph reaches them.
    fixed = requests(inputs, inputs.k, inputs.v, unmasked) if fixed_kv and case.mode == "fwd" else None

    def step() -> torch.Tensor:
        batch = fixed if fixed is not None else requests(inputs, *kv(), unmasked)
        return torch.cat([run(r.q, r.k, r.v, a)[0].transpose(0, 1) for r, a in zip(batch, arguments)])

    return step, dict(Counter(form for _, form in chosen))


def _nested_step(run: Run, inputs: RaggedInputs, case: Case, kv: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 fixed_kv: bool) -> Callable[[], torch.Tensor]:
    """One SDPA call on nested jagged tensors; K/V expanded to H heads inside the call (NJT has no GQA broadcast)."""
    offsets_q, offsets_kv, g = inputs.cu_seqlens_q.long(), inputs.cu_seqlens_kv.long(), case.group_size
    backward = case.mode != "fwd"
    fixed_q = None if backward else nested_rows(inputs.q, offsets_q, inputs.seq_lens_q)

    def nested_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return nested_rows(k, offsets_kv, inputs.seq_lens_kv), nested_rows(v, offsets_kv, inputs.seq_lens_kv)

    # Views of the inputs' own K/V are built once; an expansion or a gather makes new values at each call.
    fixed = nested_kv(inputs.k, inputs.v) if fixed_kv and g == 1 and not backward else None

    def step() -> torch.Tensor:
        q = fixed_q if fixed_q is not None else nested_rows(inputs.q, offsets_q, inputs.seq_lens_q)
        k, v = fixed if fixed is not None else nested_kv(*kv())
        return run(q, k, v, {"scale": case.scale} if case.scale is not None else {}).transpose(1, 2).values()

    return step


def host_sync(fn: Callable[[], torch.Tensor]) -> str | None:
    """One untimed CUDA call of `fn` under torch's sync debug mode "error": None when it never synchronised the host, else torch's words."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            fn()
    except RuntimeError as exc:
        return one_line(exc)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return None


def _nested_refusal(case: Case, kernel: str | None) -> str | None:
    """Why the batch is not even tried as one NJT call (a mask, or a path torch runs by reading the host), or None."""
    if case.alibi:
        return NJT_ALIBI
    if case.causal or case.window is not None:
        return NJT_MASKED
    if case.device != "cuda":
        return NJT_MATH_READS.format(where="on the CPU (its only one)")
    if kernel == "MATH":
        return NJT_MATH_READS.format(where="when math is the forced kernel")
    return None


def _synced(step: Callable[[], torch.Tensor]) -> str | None:
    """Why an NJT call that ran is not timed, when one call of it synchronised the host; None when it never did."""
    synced = host_sync(step)
    return None if synced is None else f"torch's nested-jagged SDPA synchronised the host inside the call: {synced}"


def prepare_ragged(case: Case, inputs: RaggedInputs, run: Run, probe: Probe, gqa: bool, name: str, kernel: str | None,
                   prepare_rectangle: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]], Prepared]) -> Prepared:
    """The Prepared of a padded, packed or paged batch for one SDPA backend (`run` its call, `probe` its refusal test,
    `kernel` the forced one or None for torch's choice, which may differ from request to request)."""
    if case.layout == "padded":
        rect = padded(inputs, case.window, requires_grad=case.mode != "fwd")
        prepared = padded_prepared(rect, prepare_rectangle(rect.q, rect.k, rect.v, _padded_arguments(case, inputs, rect.mask)),
                                   case.mode != "fwd")
        prepared.notes["padded_to"] = [case.S_q, case.S_kv]
        prepared.notes["mask_forms"] = {"bool_mask": inputs.batch_size}
        return prepared
    fixed_kv = case.layout == "packed"
    if fixed_kv:
        kv, via = (lambda: (inputs.k, inputs.v)), {}
    else:
        kv, via = paged_gather(inputs), {"paged_via": "gather_then_sdpa"}
    notes: dict[str, Any] = {**via, "kv_expanded": False, "sdpa_kernel": kernel}
    refusal = _nested_refusal(case, kernel)
    if refusal is None:
        nested = _nested_step(run, inputs, case, kv, fixed_kv)
        refusal = probe(nested) or _synced(nested)
    leaves = (inputs.q, inputs.k, inputs.v) if case.mode != "fwd" else ()
    if refusal is None:
        return Prepared(fn=nested, leaves=leaves, notes={**notes, "packed_via": "nested_jagged", "kv_expanded": case.group_size > 1,
                                                         "mask_forms": {"none": inputs.batch_size}})
    notes["nested_jagged_refused"] = refusal
    loop, forms = _loop_step(run, inputs, case, gqa, kv, fixed_kv)
    refusal = probe(loop)
    if refusal is not None:
        raise Unsupported(f"{name}: {refusal}")
    return Prepared(fn=loop, leaves=leaves, notes={**notes, "packed_via": "per_request_loop", "mask_forms": forms})


def _float_mask_dtype(kwargs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """A float attn_mask in the queries' dtype (SDPA wants them alike); nothing to change otherwise."""
    mask = kwargs.get("attn_mask")
    return {"attn_mask": mask.to(dtype)} if isinstance(mask, torch.Tensor) and mask.is_floating_point() else {}


def _padded_arguments(case: Case, inputs: RaggedInputs, mask: torch.Tensor) -> dict[str, Any]:
    """A padded rectangle's arguments: its bool mask, or with ALiBi each request's own bias in its corner (−inf where hidden)."""
    own_scale = {"scale": case.scale} if case.scale is not None else {}
    if not case.alibi:
        return {"attn_mask": mask, **own_scale}
    device, dtype = inputs.q.device, inputs.q.dtype
    bias = torch.zeros(inputs.batch_size, case.H, case.S_q, case.S_kv, device=device, dtype=dtype)
    for i, (q_len, kv_len) in enumerate(zip(inputs.seq_lens_q, inputs.seq_lens_kv)):
        bias[i, :, :q_len, :kv_len] = request_alibi_bias(case.H, q_len, kv_len, device, dtype)[0]
    return {"attn_mask": bias.masked_fill(~mask, float("-inf")), **own_scale}
