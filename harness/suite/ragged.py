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
    MLA     (`case.mla`) H_kv = 1 and k_pages is the latent cache `[num_pages, page_size, 1, d_c + d_rope]`; v and
            v_pages are copies of the first d_c columns of k and k_pages, what an MLA kernel reads inside the latent.

Masks are per sequence and bottom-right aligned, as for dense cases: query j of sequence i sees key t when
t <= j + seq_lens_kv[i] - seq_lens_q[i] (causal), every key of its own sequence otherwise, and never a key
of another sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, draw_sinks, make_inputs, torch_dtype


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
    #: The case's sink logits, float32 `[H]` (None unless `case.sinks`): the dense case's stream, harness.suite.inputs.draw_sinks.
    sinks: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        """How many sequences (requests) the batch holds."""
        return len(self.seq_lens_q)


def sequence_mask(q_len: int, kv_len: int, causal: bool, window: int | None, device: str | torch.device = "cpu") -> torch.Tensor | None:
    """Boolean `[q_len, kv_len]`, True where query j of one sequence sees key t (bottom-right aligned), or None when it sees all."""
    if not causal and window is None:
        return None
    position = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    key = torch.arange(kv_len, device=device)[None, :]
    visible = key <= position
    if window is not None:
        visible &= key > position - window
    return visible


def padded_mask(inputs: RaggedInputs, window: int | None, device: str | torch.device = "cpu") -> torch.Tensor:
    """Boolean `[B, 1, S_q, S_kv]` of a batch padded to its longest request: each request's own mask, nothing in its padding."""
    B, S_q, S_kv = inputs.batch_size, max(inputs.seq_lens_q), max(inputs.seq_lens_kv)
    mask = torch.zeros(B, 1, S_q, S_kv, dtype=torch.bool, device=device)
    for i, (q_len, kv_len) in enumerate(zip(inputs.seq_lens_q, inputs.seq_lens_kv)):
        own = sequence_mask(q_len, kv_len, inputs.causal, window, device)
        mask[i, 0, :q_len, :kv_len] = True if own is None else own
    return mask


def page_rows(inputs: RaggedInputs) -> torch.Tensor:
    """For every packed KV token, its row in the pages flattened to `[num_pages * page_size, ...]` (what a gather reads)."""
    size = inputs.page_size
    rows = []
    for i, kv_len in enumerate(inputs.seq_lens_kv):
        t = torch.arange(kv_len, device=inputs.block_table.device)
        rows.append(inputs.block_table[i, t // size].long() * size + t % size)
    return torch.cat(rows)


def gather_pages(pages: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The packed `[T_kv, H_kv, d]` tokens of a paged cache `[num_pages, page_size, H_kv, d]`, given `page_rows`."""
    return pages.reshape(-1, *pages.shape[2:]).index_select(0, rows)


def _offsets(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.as_tensor(lengths, dtype=torch.int64), 0).to(torch.int32)
    return out.to(device)


def make_ragged_inputs(case: Case, *, device: str | torch.device | None = None) -> RaggedInputs:
    """Seeded standard-normal packed tensors for a ragged case, and its paged cache when the layout is paged.

    q, k, v (and the upstream gradient) are drawn from `case.seed` in that order whatever the layout, so
    the padded, packed and paged cases of one batch attend over the very same values. The pages are
    assigned by a seeded permutation, so consecutive tokens of a request sit in scattered pages; the
    rows of a last page past the request's length hold drawn values too (as stale entries of a real cache
    do), so a kernel that reads past a length gets a wrong answer rather than a lucky zero.
    """
    device = torch.device(device or case.device)
    generator = torch.Generator(device=device)
    generator.manual_seed(case.seed)
    dtype = torch_dtype(case)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(dtype)

    q_lens, kv_lens = case.seq_lens_q, case.seq_lens_kv
    T_q, T_kv = sum(q_lens), sum(kv_lens)
    q, k = draw(T_q, case.H, case.d_k), draw(T_kv, case.H_kv, case.d_k)
    # MLA: V is the first d_c columns of the one latent, as in a dense MLA case (inputs.make_inputs); a copy, so that a
    # backend reading K and V apart gets an ordinary V of the same values.
    v = k[..., :case.d_v].clone() if case.mla else draw(T_kv, case.H_kv, case.d_v)
    grad_out = draw(T_q, case.H, case.d_v) if case.mode != "fwd" else None
    inputs = RaggedInputs(q=q, k=k, v=v, seq_lens_q=tuple(q_lens), seq_lens_kv=tuple(kv_lens), cu_seqlens_q=_offsets(q_lens, device),
                          cu_seqlens_kv=_offsets(kv_lens, device), causal=case.causal, grad_out=grad_out,
                          sinks=draw_sinks(case, device))
    if case.layout != "paged":
        return inputs
    size = case.page_size
    pages_per_request = [-(-n // size) for n in kv_lens]
    num_pages = sum(pages_per_request)
    order = np.random.default_rng([case.seed, 0x9A6E]).permutation(num_pages)
    block_table = torch.full((len(kv_lens), max(pages_per_request)), -1, dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages_per_request):
        block_table[i, :n] = torch.as_tensor(order[start:start + n], dtype=torch.int32)
        start += n
    inputs.page_size, inputs.block_table = size, block_table.to(device)
    inputs.k_pages = draw(num_pages, size, case.H_kv, case.d_k)
    inputs.v_pages = None if case.mla else draw(num_pages, size, case.H_kv, case.d_v)
    rows = page_rows(inputs)
    inputs.k_pages.view(-1, case.H_kv, case.d_k)[rows] = k
    if case.mla:
        # The latent pages `[num_pages, page_size, 1, d_c + d_rope]` are the cache; V's pages are their first d_c
        # columns, stale rows included, so that a kernel reading past a length is as wrong in V as in K.
        inputs.v_pages = inputs.k_pages[..., :case.d_v].clone()
    else:
        inputs.v_pages.view(-1, case.H_kv, case.d_v)[rows] = v
    return inputs


def make_case_inputs(case: Case) -> RaggedInputs | AttentionInputs:
    """What a backend's `prepare` is handed for the case: a RaggedInputs for a batch of requests, else its AttentionInputs."""
    return make_ragged_inputs(case) if case.ragged else make_inputs(case)
