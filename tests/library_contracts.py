"""Emulations of the GPU libraries' documented contracts in plain torch, for the CPU tests of their translations.

Each reads its library's arguments exactly as the library defines them (cu_seqlens, block tables,
FlashInfer's CSR page indices and last-page lengths, xFormers' biases) and refuses what the library
would misread (an index that is not int32, a page outside the pool, a last_page_len outside
[1, page_size]); the attention itself is `attend_one`, float64, per sequence.
"""

from __future__ import annotations

import torch

from harness.backends.flashinfer.adapter import PAGED_DECODE, RAGGED_PREFILL
from tests.ragged_fixtures import attend_one


def _check_index(t: torch.Tensor, what: str) -> None:
    assert t.dtype == torch.int32, f"{what} must be int32 (the libraries index with int32), got {t.dtype}"


def gather_pages(pages: torch.Tensor, page_ids: list[int], length: int) -> torch.Tensor:
    """A sequence's first `length` KV rows from a page pool, its pages in the order given; a bad page id is an error."""
    num_pages, page_size = pages.shape[:2]
    assert len(page_ids) * page_size >= length, "fewer pages than the sequence's length needs"
    for p in page_ids:
        assert 0 <= p < num_pages, f"page {p} outside the pool of {num_pages} pages"
    return pages[torch.tensor(page_ids, dtype=torch.long)].reshape(-1, *pages.shape[2:])[:length]


def flash_emulator(function: str, args, kwargs) -> torch.Tensor:
    """FlashAttention's documented semantics for flash_attn_func / _varlen_func / _with_kvcache, output as the call returns it.

    Only the kernel's math, which no real code can run without a GPU: the call's arguments are bound
    to the real signatures in tests/test_flash_attn_library.py. No sliding window (its tests use the
    dense contract in tests/test_translation.py).
    """
    q, k, v = args
    scale, causal = kwargs["softmax_scale"], kwargs["causal"]
    assert kwargs.get("window_size", (-1, -1)) in ((-1, -1), (None, None)), "the emulation has no sliding window"
    table = kwargs.get("block_table", kwargs.get("page_table"))
    if function == "flash_attn_func":  # [B, S, H, d], every row real
        return torch.stack([attend_one(q[b], k[b], v[b], scale, causal).to(q.dtype) for b in range(q.shape[0])])
    if function == "flash_attn_with_kvcache" and "cu_seqlens_q" not in kwargs:
        q_rows = [q[b] for b in range(q.shape[0])]  # [B, S_q, H, d]
    else:
        cu_q = kwargs["cu_seqlens_q"]
        _check_index(cu_q, "cu_seqlens_q")
        assert kwargs["max_seqlen_q"] == int((cu_q[1:] - cu_q[:-1]).max())
        q_rows = [q[int(cu_q[b]):int(cu_q[b + 1])] for b in range(len(cu_q) - 1)]
    if table is None:
        cu_k = kwargs["cu_seqlens_k"]
        _check_index(cu_k, "cu_seqlens_k")
        kv = [(k[int(cu_k[b]):int(cu_k[b + 1])], v[int(cu_k[b]):int(cu_k[b + 1])]) for b in range(len(cu_k) - 1)]
    else:
        _check_index(table, "block table")
        if "cache_seqlens" in kwargs:
            lengths = kwargs["cache_seqlens"]
        elif "seqused_k" in kwargs:
            lengths = kwargs["seqused_k"]
        else:  # FA2's varlen function over pages: lengths are cu_seqlens_k's differences
            lengths = kwargs["cu_seqlens_k"][1:] - kwargs["cu_seqlens_k"][:-1]
            _check_index(kwargs["cu_seqlens_k"], "cu_seqlens_k")
        _check_index(lengths, "KV lengths")
        kv = [(gather_pages(k, table[b].tolist(), int(n)), gather_pages(v, table[b].tolist(), int(n))) for b, n in enumerate(lengths)]
    outs = [attend_one(qb, kb, vb, scale, causal).to(q.dtype) for qb, (kb, vb) in zip(q_rows, kv)]
    return torch.stack(outs) if q.dim() == 4 else torch.cat(outs)


def xformers_emulator(call) -> torch.Tensor:
    """memory_efficient_attention's kernel math, emulated (no xFormers kernel runs on the CPU): softmax(q·kᵀ·scale + bias) v, float64.

    Only the math is emulated: the mask is the real bias's own `materialize()` (a paged one through
    `paged_bias_emulator`). q, k, v are `call.view`'s 4-D `[B, M, H, K]` (K/V may have H_kv < H heads:
    query head h reads head h // (H/H_kv)) or 5-D `[B, M, G, g, K]`; the output has q's layout.
    """
    q, k, v = call.view(call.q, call.k, call.v)
    shape = (*q.shape[:-1], v.shape[-1])
    if q.dim() == 4:
        G = k.shape[2]
        q = q.unflatten(2, (G, q.shape[2] // G))
        k, v = (t.unsqueeze(3).expand(-1, -1, -1, q.shape[3], -1) for t in (k, v))
    bias = call.attn_bias
    if getattr(bias, "block_tables", None) is not None:
        additive = paged_bias_emulator(bias, k.shape[1])
    else:
        additive = torch.zeros(q.shape[1], k.shape[1]) if bias is None else bias.materialize((q.shape[1], k.shape[1]))
    scale = call.scale if call.scale is not None else q.shape[-1] ** -0.5  # xFormers' default, Inputs.scale_float
    scores = torch.einsum("bmghk,bnghk->bghmn", q.double(), k.double()) * scale + additive.double()
    out = torch.einsum("bghmn,bnghk->bmghk", torch.softmax(scores, -1).nan_to_num(0.0), v.double())
    return out.reshape(shape)


def paged_bias_emulator(bias, pool_rows: int) -> torch.Tensor:
    """A paged bias's additive mask `[Σ q_len, pool_rows]` over the flattened page pool, from the real bias's `materialize()`.

    The table must be int32 with every entry, used or not, a page of the pool (a kernel is handed whole
    rows). xFormers' debug materialize() writes the page of every entry, so an unused entry repeating one
    of the sequence's own pages would mask that page out there, though the kernel reads no entry past a
    length: unused entries are pointed at a page past the pool, which is then cut off. Nothing is emulated.
    """
    import dataclasses
    import math

    _check_index(bias.block_tables, "block_tables")
    num_pages, size = pool_rows // bias.page_size, bias.page_size
    table = bias.block_tables.clone()
    assert int(table.min()) >= 0 and int(table.max()) < num_pages, f"a block-table entry outside the pool of {num_pages} pages"
    for b, n in enumerate(bias.k_seqinfo.seqlen_py):
        table[b, math.ceil(n / size):] = num_pages
    mask = dataclasses.replace(bias, block_tables=table).materialize((bias.q_seqinfo.seqstart_py[-1], bias.k_seqinfo.seqstart_py[-1]))
    if mask.shape[-1] < pool_rows:  # materialize() stops at the highest page the table names
        mask = torch.cat([mask, mask.new_full((mask.shape[0], pool_rows - mask.shape[-1]), float("-inf"))], -1)
    return mask[:, :pool_rows]


def flashinfer_emulator(call) -> torch.Tensor:
    """FlashInfer's kernel math for the wrapper `call` names, run on `run()`'s arguments after `plan()`'s.

    Only the math is emulated, because no real FlashInfer code runs on a CPU: the wrappers' constructors,
    plan() and run() are bound to the installed library's own signatures, its decode kernel's head groups
    read from its source, in tests/test_flashinfer_library.py.
    """
    plan = call.plan_args
    assert plan["q_data_type"] == plan["kv_data_type"] == call.run_args[0].dtype
    q = call.run_args[0]
    H, H_kv = plan["num_qo_heads"], plan["num_kv_heads"]
    assert q.shape[1] == H and H % H_kv == 0
    scale, causal = plan["sm_scale"], plan.get("causal", False)
    if call.wrapper == RAGGED_PREFILL:
        k, v = call.run_args[1:]
        qo, kv_ptr = plan["qo_indptr"], plan["kv_indptr"]
        _check_index(qo, "qo_indptr"), _check_index(kv_ptr, "kv_indptr")
        assert k.shape[1] == H_kv and k.shape[2] == plan["head_dim_qk"] and v.shape[2] == plan["head_dim_vo"]
        pieces = [(q[int(qo[i]):int(qo[i + 1])], k[int(kv_ptr[i]):int(kv_ptr[i + 1])], v[int(kv_ptr[i]):int(kv_ptr[i + 1])])
                  for i in range(len(qo) - 1)]
    else:
        k_cache, v_cache = call.run_args[1]  # NHD: [max_num_pages, page_size, H_kv, d]
        page_size = plan["page_size"]
        assert k_cache.shape[1] == page_size and k_cache.shape[2] == H_kv
        if call.wrapper == PAGED_DECODE:
            indptr, indices, last = plan["indptr"], plan["indices"], plan["last_page_len"]
            qo = torch.arange(q.shape[0] + 1, dtype=torch.int32)  # one query per request
        else:
            indptr, indices, last = plan["paged_kv_indptr"], plan["paged_kv_indices"], plan["paged_kv_last_page_len"]
            qo = plan["qo_indptr"]
        for t, what in ((indptr, "indptr"), (indices, "indices"), (last, "last_page_len"), (qo, "qo_indptr")):
            _check_index(t, what)
        assert len(indices) == int(indptr[-1])
        pieces = []
        for i in range(len(indptr) - 1):
            pages = indices[int(indptr[i]):int(indptr[i + 1])].tolist()
            assert 1 <= int(last[i]) <= page_size, f"last_page_len {int(last[i])} outside [1, {page_size}]"
            length = page_size * (len(pages) - 1) + int(last[i])  # FlashInfer's definition of the KV length
            pieces.append((q[int(qo[i]):int(qo[i + 1])], gather_pages(k_cache, pages, length), gather_pages(v_cache, pages, length)))
    return torch.cat([attend_one(qi, ki, vi, scale, causal).to(q.dtype) for qi, ki, vi in pieces])


def flashinfer_window_emulator(call) -> torch.Tensor:
    """Ragged prefill's math with window_left (query j sees keys j + shift − window_left … j + shift): the kernel, which no CPU runs."""
    plan = call.plan_args
    q, k, v = call.run_args
    qo, kv = plan["qo_indptr"], plan["kv_indptr"]
    outs = []
    for i in range(len(qo) - 1):
        qi, ki, vi = q[int(qo[i]):int(qo[i + 1])], k[int(kv[i]):int(kv[i + 1])], v[int(kv[i]):int(kv[i + 1])]
        heads = torch.arange(qi.shape[1]) // (qi.shape[1] // ki.shape[1])
        scores = torch.einsum("qhd,khd->hqk", qi.double(), ki[:, heads].double()) * plan["sm_scale"]
        pos = torch.arange(qi.shape[0])[:, None] + (ki.shape[0] - qi.shape[0])
        t = torch.arange(ki.shape[0])[None, :]
        keep = (t <= pos) & (t >= pos - plan["window_left"])
        p = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
        outs.append(torch.einsum("hqk,khd->qhd", p, vi[:, heads].double()).to(q.dtype))
    return torch.cat(outs)
