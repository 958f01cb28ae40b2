"""A serving-shaped batch as tensors: the one ragged representation every layout's adapter translates from.

A batch of requests has its own query and KV length per sequence. The harness draws it once, in this
form, from the case's seed; each backend turns it into its library's arguments (FlashAttention's
`cu_seqlens` and `block_table`, xFormers' block-diagonal masks, FlashInfer's index pointers,
FlexAttention's document ids and page table) in its untimed `prepare`.

    packed  q [T_q, H, d_k], k [T_kv, H_kv, d_k], v [T_kv, H_kv, d_v]: sequence i's queries are rows
            cu_seqlens_q[i]:cu_seqlens_q[i+1] of q, its keys and values rows cu_seqlens_kv[i]:cu_seqlens_kv[i+1].
    paged   the same q; the KV cache in fixed-size pages, k_pages [num_pages, page_size, H_kv, d_k] and
            v_pages [num_pages, page_size, H_kv, d_v]. Sequence i's KV token t is row t % page_size of page
            block_table[i, t // page_size]. Pages are scattered (a seeded permutation), never in order;
            unused block-table entries hold -1. k and v (packed) still hold the same tokens in order, so
            a reference and a gather-then-attend baseline read the same values.

Masks are per sequence and bottom-right aligned, as for dense cases: query j of sequence i sees key t when
t <= j + seq_lens_kv[i] - seq_lens_q[i] (causal), every key of its own sequence otherwise, and never a key
of another sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RaggedInputs:
    """The tensors of one ragged batch (see the module's docstring for the layout contract)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seq_lens_q: tuple[int, ...]
    seq_lens_kv: tuple[int, ...]
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    causal: bool = False
    page_size: int | None = None
    k_pages: torch.Tensor | None = None
    v_pages: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    #: The upstream gradient for backward modes, shaped like the packed output [T_q, H, d_v].
    grad_out: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        """How many sequences (requests) the batch holds."""
        return len(self.seq_lens_q)
