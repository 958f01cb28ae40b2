"""Test-only backends that are subtly wrong: the agreement check must catch every one of them.

Never registered in the built-in registry. Tests add them to a registry by hand (`add_all`), and
`attnbench check` sees them through `ATTNBENCH_BACKENDS=tests.wrong_backends:add_all`.
"""

from __future__ import annotations

import math

import torch

from harness.backends.base import Backend, Prepared
from harness.measure.eager import naive_attention
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.measure.reference import poisoned_like


class ScaleOffBackend(Backend):
    """Softmax scale 1 % too large: 1.01/√d_k instead of 1/√d_k."""

    name = "wrong-scale"
    family = "test-wrong"
    description = "softmax scale off by 1 %"
    native_gqa = True

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Eager attention with the wrong scale."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        scale = 1.01 / math.sqrt(case.d_k)
        return Prepared(fn=lambda: naive_attention(q, k, v, mask, scale=scale), leaves=(q, k, v))


def leak_one(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask with its first hidden position (in row-major order of batch 0) made visible."""
    if mask is None or bool(mask.all()):
        return mask
    leaked = mask.clone()
    flat = leaked.view(-1)
    flat[int((~flat).nonzero()[0])] = True
    return leaked


class LeakedMaskBackend(Backend):
    """One position the mask hides (the first one: query 0 sees key 1 under a square causal mask) is visible."""

    name = "wrong-mask"
    family = "test-wrong"
    description = "one masked position leaked"
    native_gqa = True

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Eager attention with one hidden (query, key) pair let through."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = leak_one(visible_mask(case, device=q.device))
        return Prepared(fn=lambda: naive_attention(q, k, v, mask), leaves=(q, k, v))


class WrongGqaBackend(Backend):
    """GQA with K/V heads expanded by `repeat` (h → h mod H_kv) instead of `repeat_interleave` (h → h // g)."""

    name = "wrong-gqa"
    family = "test-wrong"
    description = "K/V heads grouped in the wrong order"

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Expand K/V the wrong way, then run eager MHA."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        g = case.group_size
        return Prepared(fn=lambda: naive_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), mask), leaves=(q, k, v))


class PartialWriteBackend(Backend):
    """Writes its output into a caller-style buffer from `poisoned_like` but never writes the last query row."""

    name = "wrong-unwritten"
    family = "test-wrong"
    description = "leaves one output row unwritten"
    supports_backward = False

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Allocate the output buffer poisoned, as an adapter for an `out=` kernel must, and fill all but one row."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        out = poisoned_like(torch.empty(case.B, case.H, case.S_q, case.d_v, dtype=q.dtype, device=q.device))

        def fn() -> torch.Tensor:
            full = naive_attention(q, k, v, mask)
            out[:, :, :-1].copy_(full[:, :, :-1])
            return out

        return Prepared(fn=fn, leaves=(q, k, v))


WRONG_BACKENDS = (ScaleOffBackend, LeakedMaskBackend, WrongGqaBackend, PartialWriteBackend)


def add_all(registry) -> None:
    """Add every wrong backend to `registry` (the `ATTNBENCH_BACKENDS` hook)."""
    for cls in WRONG_BACKENDS:
        registry.add(cls())
