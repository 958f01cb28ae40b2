"""FlashAttention's arguments for a ragged batch: packed rows with `cu_seqlens`, or the page pools behind a block table.

Plain functions of CPU-runnable torch code (harness.backends.flash_attn calls them in `prepare`), so the CPU tests
bind their calls to the libraries' real signatures and check the translation against the layout contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.backends.ragged_args import is_paged, kernel_block_table, lengths_int32, softmax_scale, uniform_length
from harness.suite.ragged import RaggedInputs


@dataclass
class FlashRaggedCall:
    """One FlashAttention call on a ragged batch: the function's name, its arguments, and how its output becomes `[T_q, H, d_v]`."""

    function: str
    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, Any]
    to_packed: Callable[[torch.Tensor], torch.Tensor]


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def flash_ragged_call(inputs: RaggedInputs, generation: int) -> FlashRaggedCall:
    """Translate a packed or paged batch into FlashAttention `generation`'s (2, 3 or 4) arguments (untimed).

    Paged: k/v are the page pools `[num_pages, page_size, H_kv, d]` as they lie; unused block-table
    entries point at page 0 (ragged_args.kernel_block_table), never read past a sequence's length.
    """
    q = inputs.q.detach()
    device = q.device
    lens_q = inputs.seq_lens_q
    common: dict[str, Any] = {"softmax_scale": softmax_scale(inputs), "causal": inputs.causal}
    ragged_q = {"cu_seqlens_q": inputs.cu_seqlens_q.to(torch.int32), "max_seqlen_q": max(lens_q)}
    if not is_paged(inputs):
        kwargs = {**ragged_q, "cu_seqlens_k": inputs.cu_seqlens_kv.to(torch.int32), "max_seqlen_k": max(inputs.seq_lens_kv), **common}
        return FlashRaggedCall("flash_attn_varlen_func", (q, inputs.k.detach(), inputs.v.detach()), kwargs, _same)
    pools = (q, inputs.k_pages.detach(), inputs.v_pages.detach())
    table = kernel_block_table(inputs)
    kv_lens = lengths_int32(inputs.seq_lens_kv, device)
    if generation == 4:
        kwargs = {**ragged_q, "seqused_k": kv_lens, "page_table": table, **common}
        return FlashRaggedCall("flash_attn_varlen_func", pools, kwargs, _same)
    table_name = "block_table" if generation == 2 else "page_table"
    S_q = uniform_length(lens_q)
    if S_q is not None:
        # Every sequence has S_q queries, so the packed rows are already the documented [B, S_q, H, d].
        H, d = q.shape[1:]
        q_bshd = q.reshape(len(lens_q), S_q, H, d)
        kwargs = {"cache_seqlens": kv_lens, table_name: table, **common}
        return FlashRaggedCall("flash_attn_with_kvcache", (q_bshd, *pools[1:]), kwargs, lambda out: out.reshape(-1, H, out.shape[-1]))
    if generation == 2:
        kwargs = {**ragged_q, "cu_seqlens_k": inputs.cu_seqlens_kv.to(torch.int32), "max_seqlen_k": max(inputs.seq_lens_kv),
                  "block_table": table, **common}
        return FlashRaggedCall("flash_attn_varlen_func", pools, kwargs, _same)
    kwargs = {**ragged_q, "cache_seqlens": kv_lens, "page_table": table, **common}
    return FlashRaggedCall("flash_attn_with_kvcache", pools, kwargs, _same)
