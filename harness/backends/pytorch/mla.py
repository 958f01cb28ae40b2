"""Multi-head latent attention (DeepSeek-V2/V3) in its decoding form, with the up-projections absorbed.

MLA caches, per token, one latent `c_KV` of width d_c (DeepSeek-V3: 512) plus a shared RoPE key
of width d_rope (64), instead of H heads of K and V. At decode time W_UK is absorbed into the
queries and W_UV into the output projection, so every head attends with a query of width
`d_c + d_rope` over the one shared cache `[c_KV; k_rope]`, and the values are `c_KV` itself.

As a Case that is exactly: `mla=True`, H_kv = 1, d_k = d_c + d_rope (576), d_v = d_c (512); the
harness then draws V as the first d_c columns of K (harness.suite.inputs), so every backend and the
float64 reference compute the same function. Other backends see it as MQA with d_k = 576 and read
K and V separately; this one reads the shared latent once. KV-cache bytes per token are
`(d_c + d_rope)·bytes` (1,152 in bf16), in the record's `kv_cache_bytes` and in its notes.

A paged MLA case (layout "paged") holds that cache as latent pages `[num_pages, page_size, 1, d_c + d_rope]` behind a
block table, as FlashMLA and FlashInfer's MLA wrapper read it (harness.backends.flashmla.adapter, .flashinfer_mla). This
backend is their eager baseline: the timed call gathers each request's latent rows through the block table into one
padded `[B, S_kv, d_c + d_rope]` batch (the gather a paged cache costs an eager kernel), then runs the same absorbed
attention under each request's own mask.

The softmax scale is the case's (`Case.softmax_scale`): a model preset's MLA cases carry the model's own,
1/√(d_nope + d_rope) = 1/√192 times YaRN's mscale², never the absorbed head's 1/√576. Training uses the decompressed form, which is plain MHA with d_k = 192 and
d_v = 128 (every other backend serves it), so this backend is forward only.
"""

from __future__ import annotations


import numpy as np
import torch

from harness.backends.base import Backend, Prepared
from harness.backends.layouts import pack, unpack
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.suite.ragged import RaggedInputs, padded_mask
from harness.attention.theory import kv_cache_bytes_per_token

#: What an MLA kernel adapter refuses a case that is not MLA with (shared by the paged kernels' adapters).
NOT_MLA = "serves latent-cache cases only (mla=True: H_kv=1, d_k = d_c + d_rope, d_v = d_c); this case has separate K and V"


def padded_latent_rows(inputs: RaggedInputs) -> torch.Tensor:
    """For each request b and key slot t < S_kv, the row of the flattened pages holding its latent: `[B, S_kv]` int64.

    Slots past a request's length point at row 0; the padded mask hides them, so what they read never counts.
    """
    size, table = inputs.page_size, inputs.block_table.long()
    t = torch.arange(max(inputs.seq_lens_kv), device=table.device)
    page = table[:, (t // size).clamp(max=table.shape[1] - 1)].clamp(min=0)
    rows = page * size + t % size
    lengths = torch.as_tensor(inputs.seq_lens_kv, device=table.device)[:, None]
    return torch.where(t[None, :] < lengths, rows, torch.zeros_like(rows))


def paged_absorbed(case: Case, inputs: RaggedInputs) -> Prepared:
    """The paged MLA baseline: queries padded (untimed), the latent gathered through the block table and attended (timed)."""
    lengths_q = np.asarray(inputs.seq_lens_q)
    q = unpack(inputs.q.detach(), lengths_q, max(inputs.seq_lens_q)).transpose(1, 2).contiguous()
    pages = inputs.k_pages.detach().reshape(-1, case.d_k)  # H_kv = 1: one latent row per cached token
    rows = padded_latent_rows(inputs)
    mask = padded_mask(inputs, case.window, q.device)
    scale = case.softmax_scale

    def fn() -> torch.Tensor:
        return absorbed_mla(q, pages[rows], case.d_v, mask, scale)

    notes = {"form": "absorbed", "d_c": case.d_v, "d_rope": case.d_k - case.d_v, "paged_via": "gather_then_absorbed",
             "page_size": inputs.page_size, "kv_cache_bytes_per_token": kv_cache_bytes_per_token(case)}
    return Prepared(fn=fn, to_bhsd=lambda out: pack(out.transpose(1, 2), lengths_q), notes=notes)


def absorbed_mla(q: torch.Tensor, latent: torch.Tensor, d_c: int, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Absorbed MLA: queries `[B, H, S_q, d_c + d_rope]` against one latent cache `[B, S_kv, d_c + d_rope]`.

    All heads share the cache, so the heads fold into rows: one `[B, H·S_q, d] × [B, d, S_kv]` product
    for the scores and one `[B, H·S_q, S_kv] × [B, S_kv, d_c]` for the output, whose values are the
    latent's first d_c columns (a view, not a copy). `mask` is boolean `[B, 1, S_q, S_kv]`, True where
    visible; a row with no visible key gives zeros. Returns `[B, H, S_q, d_c]`.
    """
    B, H, S_q, d = q.shape
    S_kv = latent.shape[1]
    scores = torch.bmm(q.reshape(B, H * S_q, d) * scale, latent.transpose(1, 2)).view(B, H, S_q, S_kv)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.nan_to_num(nan=0.0)
    out = torch.bmm(weights.view(B, H * S_q, S_kv), latent[..., :d_c])
    return out.view(B, H, S_q, d_c)


@register
class MlaBackend(Backend):
    """DeepSeek's absorbed MLA decode: every head against one shared latent KV cache (eager PyTorch)."""

    name = "mla"
    family = "mla"
    attention_core = False
    description = "DeepSeek-V2/V3 multi-head latent attention, absorbed decode form (one shared latent cache), eager"
    native_gqa = True
    supports_backward = False
    layouts = frozenset({"dense", "paged"})
    score_variants = frozenset({"scale"})
    feature_reasons = {"backward": "mla is the absorbed decode (inference) form; training uses the decompressed form, plain MHA "
                                   "with d_k=192, d_v=128"}

    def own_refusals(self, case: Case) -> list[str]:
        """Only MLA cases (mla=True: one latent cache, V inside K); dense or paged and forward only are declared."""
        return [] if case.mla else [f"{self.name} {NOT_MLA}"]

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """The latent cache is K's one head (`[B, S_kv, d_c + d_rope]`, a view), or its pages; time the absorbed attention."""
        if isinstance(inputs, RaggedInputs):
            return paged_absorbed(case, inputs)
        q = inputs.q
        latent = inputs.k[:, 0]
        mask = visible_mask(case, device=q.device)
        scale = case.softmax_scale
        notes = {
            "form": "absorbed", "d_c": case.d_v, "d_rope": case.d_k - case.d_v,
            "kv_cache_bytes_per_token": kv_cache_bytes_per_token(case),
        }
        return Prepared(fn=lambda: absorbed_mla(q, latent, case.d_v, mask, scale), leaves=(), notes=notes)
