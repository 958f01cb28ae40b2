"""What the CPU backends compute a ragged batch on: its padded rectangle, its requests one by one, its pages gathered.

Built in `prepare` (untimed) from a `RaggedInputs`; each backend's timed call then runs on them, and
`packed_output` turns a padded result back into the packed `[T_q, H, d_v]` rows the check compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from harness.backends.layouts import pack, unpack
from harness.suite.ragged import RaggedInputs, gather_pages, padded_mask, page_rows, sequence_mask

if TYPE_CHECKING:
    from harness.backends.base import Prepared


@dataclass(frozen=True)
class Padded:
    """The batch padded to its longest request, `[B, H, S, d]`, with the mask that hides every request's padding.

    In backward modes q, k and v are the leaves (a padded training batch holds its rectangle): their gradients
    come back padded, the real rows are packed for the check, and the padding rows are reported, never judged.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    seq_lens_q: tuple[int, ...]
    seq_lens_kv: tuple[int, ...] = ()

    def packed_output(self, out_bhsd: torch.Tensor) -> torch.Tensor:
        """A padded `[B, H, S_q, d_v]` output as the packed `[T_q, H, d_v]` rows of the real queries."""
        return pack(out_bhsd.transpose(1, 2), np.asarray(self.seq_lens_q))

    def padded_grad_out(self, grad_packed: torch.Tensor) -> torch.Tensor:
        """The packed upstream gradient `[T_q, H, d_v]` as the rectangle's `[B, H, S_q, d_v]`, zero in the padding."""
        return unpack(grad_packed.detach(), np.asarray(self.seq_lens_q), self.q.shape[2]).transpose(1, 2).contiguous()

    def packed_gradients(self, grads) -> list[torch.Tensor]:
        """dQ, dK, dV of the rectangle as the packed rows of the real tokens: `[T_q, H, d_k]`, `[T_kv, H_kv, d_k]`, `[T_kv, H_kv, d_v]`."""
        lengths = (self.seq_lens_q, self.seq_lens_kv, self.seq_lens_kv)
        return [pack(g.transpose(1, 2), np.asarray(n)) for g, n in zip(grads, lengths)]

    def padding_gradients(self, grads) -> float:
        """The largest |value| the gradients hold in the padding rows (inf when one is not finite): what the backend wrote there."""
        worst = 0.0
        for g, lengths in zip(grads, (self.seq_lens_q, self.seq_lens_kv, self.seq_lens_kv)):
            real = torch.zeros(g.shape[0], g.shape[2], dtype=torch.bool, device=g.device)
            for i, n in enumerate(lengths):
                real[i, :n] = True
            pad = g.detach().transpose(1, 2)[~real]
            if pad.numel():
                values = pad.double().abs()
                worst = max(worst, float(values.max()) if bool(torch.isfinite(values).all()) else float("inf"))
        return worst


def padded(inputs: RaggedInputs, window: int | None, *, requires_grad: bool = False) -> Padded:
    """The padded rectangle of a batch (zeros in the padding, which the mask hides); its tensors leaves when `requires_grad`."""
    S_q, S_kv = max(inputs.seq_lens_q), max(inputs.seq_lens_kv)

    def rectangle(t: torch.Tensor, lengths: tuple[int, ...], S: int) -> torch.Tensor:
        return unpack(t.detach(), np.asarray(lengths), S).transpose(1, 2).contiguous().requires_grad_(requires_grad)

    return Padded(rectangle(inputs.q, inputs.seq_lens_q, S_q), rectangle(inputs.k, inputs.seq_lens_kv, S_kv),
                  rectangle(inputs.v, inputs.seq_lens_kv, S_kv), padded_mask(inputs, window, inputs.q.device), inputs.seq_lens_q,
                  inputs.seq_lens_kv)


def padded_prepared(rect: Padded, prepared: "Prepared", backward: bool) -> "Prepared":
    """`prepared` (a call on the rectangle) made to speak packed rows: its output, and in backward modes its leaves and gradients."""
    prepared.to_bhsd = rect.packed_output
    if backward:
        prepared.leaves = (rect.q, rect.k, rect.v)
        prepared.from_bhsd = rect.padded_grad_out
        prepared.grads_to_packed = rect.packed_gradients
        prepared.padding_gradients = rect.padding_gradients
    return prepared


@dataclass(frozen=True)
class Request:
    """One request's slices of the packed tensors, `[1, H, S, d]` views, and its mask (None: it sees every key)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None


def request_masks(inputs: RaggedInputs, window: int | None) -> list[torch.Tensor | None]:
    """Each request's own mask `[1, 1, q_len, kv_len]` (built once, untimed), None where it sees every key."""
    masks = [sequence_mask(q_len, kv_len, inputs.causal, window, inputs.q.device)
             for q_len, kv_len in zip(inputs.seq_lens_q, inputs.seq_lens_kv)]
    return [None if m is None else m[None, None] for m in masks]


def offsets(lengths: tuple[int, ...]) -> list[int]:
    """The cumulative offsets `[0, l0, l0 + l1, …]` of a batch's lengths, as Python ints (what cu_seqlens holds, read nowhere)."""
    return [0, *accumulate(lengths)]


def requests(inputs: RaggedInputs, k: torch.Tensor, v: torch.Tensor, masks: list[torch.Tensor | None]) -> list[Request]:
    """Every request of the batch as views over packed keys and values `k`, `v` (the inputs' own, or gathered from pages)."""
    # The offsets come from the Python lengths, never from cu_seqlens: a paged step calls this in the
    # timed call, where reading a device tensor's values is a host sync (and forbids CUDA-graph capture).
    cu_q, cu_kv = offsets(inputs.seq_lens_q), offsets(inputs.seq_lens_kv)

    def view(t: torch.Tensor, starts: list[int], i: int) -> torch.Tensor:
        return t[starts[i]:starts[i + 1]].transpose(0, 1).unsqueeze(0)

    return [Request(view(inputs.q, cu_q, i), view(k, cu_kv, i), view(v, cu_kv, i), mask) for i, mask in enumerate(masks)]


def per_request(attend: Callable[[Request], torch.Tensor], batch: list[Request]) -> torch.Tensor:
    """Each request's `[1, H, q_len, d_v]` output from `attend`, concatenated into the packed `[T_q, H, d_v]`."""
    return torch.cat([attend(r)[0].transpose(0, 1) for r in batch])


def paged_gather(inputs: RaggedInputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The gather a paged baseline times: its pages read, through the block table, into packed K and V."""
    rows = page_rows(inputs)
    return lambda: (gather_pages(inputs.k_pages, rows), gather_pages(inputs.v_pages, rows))
