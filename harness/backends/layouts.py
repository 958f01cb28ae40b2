"""Argument translation for the GPU-only adapters (FlashAttention, xFormers), as plain functions.

The harness hands every backend `[B, H, S, d]` tensors; FlashAttention and xFormers want
`[B, S, H, d]` (BSHD), packed variable-length rows with cumulative sequence lengths, or xFormers'
5-D `[B, M, G, H, K]` for grouped heads. These translations run on any device, so the CPU tests
check them exactly even though the kernels they feed cannot run here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.suite.cases import Case
from harness.suite.inputs import kv_lengths, q_lengths


def to_bshd(t: torch.Tensor) -> torch.Tensor:
    """`[B, H, S, d]` → a contiguous `[B, S, H, d]` copy (the layout FlashAttention and xFormers read)."""
    return t.transpose(1, 2).contiguous()


def from_bshd(t: torch.Tensor) -> torch.Tensor:
    """`[B, S, H, d]` → `[B, H, S, d]` (a view)."""
    return t.transpose(1, 2)


def cu_seqlens(lengths: np.ndarray | torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
    """Cumulative sequence lengths `[0, l0, l0+l1, …]` as int32 on `device` (FlashAttention's varlen offsets)."""
    lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.int64)
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(lengths, 0).to(torch.int32)
    return out.to(device)


def row_index(lengths: np.ndarray, S: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Flat indices into `B·S` rows of the first `lengths[b]` rows of each sequence, in order."""
    idx = np.concatenate([b * S + np.arange(n, dtype=np.int64) for b, n in enumerate(lengths)]) if len(lengths) else np.zeros(0, np.int64)
    return torch.as_tensor(idx, device=device)


def pack(t_bshd: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    """`[B, S, H, d]` → `[Σ lengths, H, d]`: the real rows of every sequence, concatenated (a copy)."""
    B, S = t_bshd.shape[:2]
    return t_bshd.reshape(B * S, *t_bshd.shape[2:]).index_select(0, row_index(lengths, S, t_bshd.device))


def unpack(t_packed: torch.Tensor, lengths: np.ndarray, S: int) -> torch.Tensor:
    """`[Σ lengths, H, d]` → `[B, S, H, d]` with zeros in the padded rows (the inverse of `pack`)."""
    B = len(lengths)
    out = t_packed.new_zeros(B * S, *t_packed.shape[1:])
    out.index_copy_(0, row_index(lengths, S, t_packed.device), t_packed)
    return out.view(B, S, *t_packed.shape[1:])


@dataclass(frozen=True)
class Varlen:
    """The variable-length description of a padded case: per-sequence lengths and their offsets.

    `q_packed` is True for self-attention over a right-padded batch (S_q = S_kv): its padded query
    rows are dropped by packing. Otherwise every query row is real and packing only flattens.
    """

    q_lens: np.ndarray
    kv_lens: np.ndarray
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    q_packed: bool


def varlen(case: Case, device: str | torch.device = "cpu") -> Varlen:
    """Lengths and cumulative offsets of a case's real query and key rows (harness.suite.inputs' definition)."""
    q_lens, kv_lens = q_lengths(case), kv_lengths(case)
    return Varlen(
        q_lens, kv_lens, cu_seqlens(q_lens, device), cu_seqlens(kv_lens, device), int(q_lens.max()), int(kv_lens.max()),
        q_packed=case.padding and case.S_q == case.S_kv,
    )


def window_size(case: Case, *, none: int | None = -1) -> tuple[int | None, int | None]:
    """FlashAttention's `(left, right)` window for a case: `(w − 1, 0)` for a window of w keys ending at the query.

    `none` is what "unbounded" is spelled as: −1 in FlashAttention 2 and 3, None in 4.
    """
    if case.window is None:
        return (none, none)
    return (case.window - 1, 0)


def is_causal(case: Case) -> bool:
    """Whether the kernel's causal flag is set: causal, or a sliding window (causal by construction in the harness)."""
    return case.causal or case.window is not None


def to_bmghk(q_bhsd: torch.Tensor, H_kv: int) -> torch.Tensor:
    """Queries `[B, H, S, d]` → xFormers' 5-D `[B, S, G, g, d]` (G = H_kv groups of g heads), a contiguous copy.

    Query head h is group h // g, member h % g: the grouping `repeat_interleave` gives, which is how
    FlashAttention and the reference pair query heads with K/V heads.
    """
    B, H, S, d = q_bhsd.shape
    return to_bshd(q_bhsd).view(B, S, H_kv, H // H_kv, d)


def kv_to_bmghk(kv_bshd: torch.Tensor, g: int) -> torch.Tensor:
    """K or V `[B, S, H_kv, d]` → `[B, S, H_kv, g, d]` by a stride-0 expand: no copy of K/V."""
    B, S, H_kv, d = kv_bshd.shape
    return kv_bshd.unsqueeze(3).expand(B, S, H_kv, g, d)


def from_bmghk(o: torch.Tensor) -> torch.Tensor:
    """xFormers' 5-D output `[B, S, G, g, d]` → `[B, H, S, d]` with H = G·g."""
    B, S, G, g, d = o.shape
    return o.reshape(B, S, G * g, d).transpose(1, 2)
