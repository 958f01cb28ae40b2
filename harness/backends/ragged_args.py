"""What every serving-layout adapter reads from a RaggedInputs (harness.suite.ragged), in one place.

FlashAttention, xFormers, FlexAttention and FlashInfer each want the same few facts in their own
spelling: per-sequence lengths as int32 tensors, the block table with no -1 in it (a kernel indexes
every entry it is handed), the pages a sequence actually uses, the query length when all sequences
share one. These are plain functions of CPU-runnable torch code, so the CPU tests check them exactly.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence, TypeVar

import torch

from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs

T = TypeVar("T")


def case_layout(case: Case) -> str:
    """The case's batch layout; "dense" for a case made before Case had a `layout` field."""
    return getattr(case, "layout", "dense")


def translation_refusals(backend: Any, case: Case) -> list[str]:
    """What these adapters' ragged translations do not carry (a sliding window, MLA's latent cache), for a layout the backend takes."""
    if case_layout(case) == "dense" or case.layout not in backend.layouts or (case.window is None and not case.mla):
        return []
    return [f"{backend.name}'s {case.layout} translation has no {'sliding window' if case.window is not None else 'MLA latent cache'}"]


def is_paged(inputs: Any) -> bool:
    """Whether the inputs are a paged ragged batch (a block table over scattered KV pages)."""
    return isinstance(inputs, RaggedInputs) and inputs.block_table is not None


def lengths_int32(lengths: Sequence[int], device: str | torch.device) -> torch.Tensor:
    """Per-sequence lengths as an int32 tensor (the dtype every one of these libraries indexes with)."""
    return torch.tensor([int(n) for n in lengths], dtype=torch.int32, device=device)


def uniform_length(lengths: Sequence[int]) -> int | None:
    """The one length every sequence has, or None when they differ."""
    distinct = set(int(n) for n in lengths)
    return distinct.pop() if len(distinct) == 1 else None


def pages_used(inputs: RaggedInputs) -> list[int]:
    """How many pages each sequence's KV occupies: ceil(kv_len / page_size)."""
    return [math.ceil(int(n) / inputs.page_size) for n in inputs.seq_lens_kv]


def kernel_block_table(inputs: RaggedInputs) -> torch.Tensor:
    """The block table as int32 with every unused (-1) entry pointing at page 0.

    A kernel reads only the entries below a sequence's length, but it is handed the whole row and
    some index it (TMA prefetch, xFormers' materialised bias): -1 there would be an out-of-bounds page.
    """
    table = inputs.block_table.to(torch.int32)
    return torch.where(table < 0, torch.zeros_like(table), table).contiguous()


def softmax_scale(inputs: RaggedInputs, case: Case | None = None) -> float:
    """The softmax scale: the case's own `scale` where it is given a case that sets one, else 1/sqrt(d_k) from the query's head dim.

    Without a scale this is `Case.softmax_scale` for the inputs the case makes (d_k is the query's head dim), read from the
    tensors so that a batch built apart from its case is still scaled by the head dim it really has.
    """
    if case is not None and getattr(case, "scale", None) is not None:
        return float(case.scale)
    return 1.0 / math.sqrt(inputs.q.shape[-1])


def timed_setup(setup: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """Run an untimed per-batch set-up (a plan, a BlockMask) and the seconds it took, device work included."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = setup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start
