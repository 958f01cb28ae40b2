"""xFormers' call records: the arguments of one `memory_efficient_attention` call, and a ragged batch's translation into them.

The serving and training layouts' translation is plain CPU-runnable torch (its biases are xFormers' real classes, which
import on the CPU), so the CPU tests check it against the layout contract; harness.backends.xformers makes the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.backends.layouts import kv_to_bmghk
from harness.backends.ragged_args import is_paged, kernel_block_table, softmax_scale
from harness.errors import Unsupported
from harness.suite.ragged import RaggedInputs


@dataclass
class XformersCall:
    """Arguments of one `memory_efficient_attention` call and the conversions back to `[B, H, S, d]`."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_bias: Any
    scale: float
    #: Runs on the leaves inside the timed call: free views only (reshape of contiguous, stride-0 expand).
    view: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    out_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    q_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    kv_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    grad_from_bhsd: Callable[[torch.Tensor], torch.Tensor]
    notes: dict[str, Any] = field(default_factory=dict)



def xformers_ragged_call(inputs: RaggedInputs, fmha_bias: Any) -> XformersCall:
    """Translate a packed or paged batch into `memory_efficient_attention`'s arguments and bias (untimed).

    q is the packed rows as one sequence `[1, T_q, H, d_k]`; k/v the packed rows `[1, T_kv, H_kv, d]`, or
    for a paged batch the page pools flattened to `[1, num_pages·page_size, H_kv, d]` (a view, no copy).
    """
    q = inputs.q.detach().unsqueeze(0)
    H, d_k = q.shape[2:]
    H_kv = inputs.k.shape[1]
    lens_q, lens_kv = list(inputs.seq_lens_q), list(inputs.seq_lens_kv)
    if is_paged(inputs):
        num_pages, page_size = inputs.k_pages.shape[:2]
        k = inputs.k_pages.detach().reshape(1, num_pages * page_size, H_kv, d_k)
        v = inputs.v_pages.detach().reshape(1, num_pages * page_size, H_kv, inputs.v_pages.shape[-1])
        cls = fmha_bias.PagedBlockDiagonalCausalWithOffsetPaddedKeysMask if inputs.causal else fmha_bias.PagedBlockDiagonalPaddedKeysMask
        bias = cls.from_seqlens(q_seqlen=lens_q, kv_seqlen=lens_kv, block_tables=kernel_block_table(inputs), page_size=page_size,
                                device=inputs.q.device)
    else:
        k, v = inputs.k.detach().unsqueeze(0), inputs.v.detach().unsqueeze(0)
        cls = fmha_bias.BlockDiagonalCausalFromBottomRightMask if inputs.causal else fmha_bias.BlockDiagonalMask
        try:
            bias = cls.from_seqlens(lens_q, lens_kv, device=inputs.q.device)
        except ValueError as exc:  # a causal block with fewer keys than queries: xFormers leaves it undefined
            raise Unsupported(f"xformers: {' '.join(str(exc).split())[:200]}") from None
    g = H // H_kv

    def view(ql: torch.Tensor, kl: torch.Tensor, vl_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if g == 1:
            return ql, kl, vl_
        return ql.view(1, ql.shape[1], H_kv, g, d_k), kv_to_bmghk(kl, g), kv_to_bmghk(vl_, g)

    def to_packed(out: torch.Tensor) -> torch.Tensor:
        return out.reshape(out.shape[1], H, out.shape[-1])

    notes = {"layout": "paged" if is_paged(inputs) else "packed", "attn_bias": type(bias).__name__}
    return XformersCall(q, k, v, bias, softmax_scale(inputs), view, out_to_bhsd=to_packed, q_to_bhsd=to_packed,
                        kv_to_bhsd=to_packed, grad_from_bhsd=one_sequence, notes=notes)


def one_sequence(t: torch.Tensor) -> torch.Tensor:
    """Packed rows `[T, H, d]` as xFormers' one sequence `[1, T, H, d]` (a view: gradients reach the packed leaf)."""
    return t.unsqueeze(0)
