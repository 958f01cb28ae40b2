"""Ragged batches built directly from lengths, their per-sequence float64 reference, and the ragged case they stand for.

The adapters' tests build their own RaggedInputs (seeded) rather than the suite's generator, so a
translation is checked against the layout contract of harness.suite.ragged itself. Pages are a
seeded permutation with spare pages in the pool, and every slot a sequence does not own holds other
random values: a translation that reads a wrong page, past a length, or through a -1 entry changes the output.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs


def ragged_batch(lens_q, lens_kv, *, H=4, H_kv=2, d_k=16, d_v=16, page_size=None, causal=False, seed=0,
                 spare_pages=3, dtype=torch.float32) -> RaggedInputs:
    """A packed (page_size None) or paged batch of the given lengths, drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    T_q, T_kv = sum(lens_q), sum(lens_kv)

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k, v = draw(T_q, H, d_k), draw(T_kv, H_kv, d_k), draw(T_kv, H_kv, d_v)
    cu = lambda lens: torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)  # noqa: E731
    inputs = RaggedInputs(q, k, v, tuple(lens_q), tuple(lens_kv), cu(lens_q), cu(lens_kv), causal=causal)
    if page_size is None:
        return inputs
    used = [math.ceil(n / page_size) for n in lens_kv]
    num_pages = sum(used) + spare_pages
    order = torch.randperm(num_pages, generator=gen)
    k_pages, v_pages = draw(num_pages, page_size, H_kv, d_k), draw(num_pages, page_size, H_kv, d_v)
    table = torch.full((len(lens_kv), max(used)), -1, dtype=torch.int32)
    taken = 0
    for b, n in enumerate(lens_kv):
        start = int(inputs.cu_seqlens_kv[b])
        for p in range(used[b]):
            page = int(order[taken])
            taken += 1
            table[b, p] = page
            rows = slice(p * page_size, min((p + 1) * page_size, n))
            count = rows.stop - rows.start
            k_pages[page, :count] = k[start + rows.start:start + rows.stop]
            v_pages[page, :count] = v[start + rows.start:start + rows.stop]
    return dataclasses.replace(inputs, page_size=page_size, k_pages=k_pages, v_pages=v_pages, block_table=table)


def attend_one(q, k, v, scale, causal):
    """One sequence in float64: q `[S_q, H, d]`, k/v `[S_kv, H_kv, d]`; query head h reads K/V head h // (H/H_kv).

    Causal is bottom-right (query j sees key t ≤ j + S_kv − S_q); a row that sees no key is 0.
    """
    q, k, v = q.double(), k.double(), v.double()
    S_q, H, _ = q.shape
    S_kv, H_kv, _ = k.shape
    heads = torch.arange(H) // (H // H_kv)
    scores = torch.einsum("qhd,khd->hqk", q, k[:, heads]) * scale
    if causal:
        visible = torch.arange(S_kv)[None, :] <= torch.arange(S_q)[:, None] + (S_kv - S_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", weights, v[:, heads])


def reference(inputs: RaggedInputs) -> torch.Tensor:
    """The batch's float64 output `[T_q, H, d_v]`, each sequence on its own from the in-order packed k/v."""
    scale = 1.0 / math.sqrt(inputs.q.shape[-1])
    outs = []
    for b in range(inputs.batch_size):
        qs = slice(int(inputs.cu_seqlens_q[b]), int(inputs.cu_seqlens_q[b + 1]))
        ks = slice(int(inputs.cu_seqlens_kv[b]), int(inputs.cu_seqlens_kv[b + 1]))
        outs.append(attend_one(inputs.q[qs], inputs.k[ks], inputs.v[ks], scale, inputs.causal))
    return torch.cat(outs)


def agrees(out: torch.Tensor, inputs: RaggedInputs, tol: float = 1e-4) -> bool:
    """Whether a packed output matches the reference (fp32 inputs: an honest path is ~1e-6 away)."""
    ref = reference(inputs)
    return out.shape == ref.shape and bool(torch.isfinite(out).all()) and float((out.double() - ref).abs().max()) < tol


#: The fields of the ragged case the adapters' tests start from (any may be given to `serving_case`).
CASE_DEFAULTS = dict(B=2, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, layout="packed")


def serving_case(**fields) -> Case:
    """A real ragged Case of B requests, each S_q queries over S_kv keys (`B x S_q @ S_kv`), with `fields` changed.

    The adapters' tests hand `prepare` RaggedInputs built from their own lengths; the case gives what
    `supports` and `prepare` read from it (dtype, device, mode, head dims, mask, layout, page size).
    """
    f = {**CASE_DEFAULTS, **fields}
    if f["layout"] == "paged" and f.get("page_size") is None:
        f["page_size"] = 16
    batch = f"{f['B']}x{f['S_q']}" + (f"@{f['S_kv']}" if f["S_kv"] != f["S_q"] else "")
    return Case(**f, seq_lens_q=(f["S_q"],) * f["B"], seq_lens_kv=(f["S_kv"],) * f["B"], length_dist=batch)
