"""The score variants FlexAttention computes exactly: softcap and ALiBi as a `score_mod`, sinks through the returned log-sum-exp.

flex_attention's `score_mod(score, b, h, q_idx, kv_idx)` sees each scaled score before the mask, so softcap
(c·tanh(s/c)) and ALiBi (−slope_h·|pos(i) − j|) are exactly what a model writes. Sinks have no argument of
their own, but `return_lse=True` gives each row's log-sum-exp L over its keys, and with one more logit σ in
the denominator every weight is scaled by e^L / (e^L + e^σ) = sigmoid(L − σ): the output is the keys-only
output times that factor, an identity rather than an approximation (a row that sees no key has L = −∞ and stays 0).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.attention.variants import alibi_slopes
from harness.backends.ragged_args import is_paged, pages_used
from harness.suite.cases import Case
from harness.suite.inputs import query_positions
from harness.suite.ragged import RaggedInputs

#: What flex_attention computes exactly (see the module's docstring); its `scale=` takes a model's own scale.
FLEX_VARIANTS = frozenset({"softcap", "alibi", "sinks", "scale"})


def request_offsets(inputs: RaggedInputs) -> tuple[Any, Any, Any, Any]:
    """A packed batch's per-row request (`document`), each request's first packed row, its key lengths and its bottom-right shift."""
    device = inputs.q.device
    lens_q = torch.as_tensor(inputs.seq_lens_q, device=device)
    lens_kv = torch.as_tensor(inputs.seq_lens_kv, device=device)
    document = torch.repeat_interleave(torch.arange(inputs.batch_size, device=device), lens_q)
    q_start = inputs.cu_seqlens_q[:-1].to(device=device, dtype=torch.int64)
    return document, q_start, lens_kv, lens_kv - lens_q  # query j of a request sits at key position j + shift


def _key_positions(inputs: RaggedInputs) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    """For a packed or paged batch: each packed query row's key position, and a key slot's position in its sequence."""
    device = inputs.q.device
    B = inputs.batch_size
    document, q_start, lens_kv, shift = request_offsets(inputs)

    def query(q_idx):
        seq = document[q_idx]
        return q_idx - q_start[seq] + shift[seq]

    if not is_paged(inputs):
        kv_start = inputs.cu_seqlens_kv[:-1].to(device=device, dtype=torch.int64)
        return query, lambda q_idx, kv_idx: kv_idx - kv_start[document[q_idx]]
    page_size = inputs.page_size
    logical = torch.full((B, inputs.k_pages.shape[0]), -1, dtype=torch.int64, device=device)
    for b, used in enumerate(pages_used(inputs)):
        logical[b, inputs.block_table[b, :used].to(device=device, dtype=torch.int64)] = torch.arange(used, device=device)

    def key(q_idx, kv_idx):
        return logical[document[q_idx], kv_idx // page_size] * page_size + kv_idx % page_size

    return query, key


def score_mod_for(case: Case, inputs: Any) -> Callable[..., Any] | None:
    """The case's softcap and ALiBi as a flex `score_mod(score, b, h, q_idx, kv_idx)`, or None when it has neither."""
    if case.softcap is None and not case.alibi:
        return None
    cap = case.softcap
    if cap is not None:
        def softcap(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / cap) * cap

        return softcap
    device = inputs.q.device
    slopes = alibi_slopes(case.H).to(device)
    if isinstance(inputs, RaggedInputs):
        query, key = _key_positions(inputs)

        def ragged_alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (query(q_idx) - key(q_idx, kv_idx)).abs()

        return ragged_alibi
    positions = torch.as_tensor(query_positions(case), device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (positions[b, q_idx] - kv_idx).abs()

    return alibi


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """flex's keys-only output `[B, H, S, d]` with each head's sink logit joined to its rows' denominators (the docstring's identity)."""
    share = torch.sigmoid(lse.float() - sinks.to(lse.device, torch.float32)[None, :, None])
    return (out.float() * share[..., None]).to(out.dtype)
