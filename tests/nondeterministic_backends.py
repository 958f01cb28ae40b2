"""Test-only backends for deterministic cases: one that claims a deterministic backward but is not bitwise repeatable.

Never registered in the built-in registry: `attnbench check` sees them through
`ATTNBENCH_BACKENDS=tests.nondeterministic_backends:add_all`.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import torch

from harness.attention.eager import naive_attention
from harness.backends.base import Backend, Prepared
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask

#: The noise's relative size: far below any dtype's agreement bound, so only bitwise repetition sees it.
NOISE = 1e-7


class _Jitter(torch.autograd.Function):
    """Identity forward; each backward adds seeded noise, a new seed per backward call (as atomics' order changes per launch).

    The seed is drawn in backward, not forward: mode bwd runs many backwards from one saved forward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, seeds: Iterator[int]) -> torch.Tensor:  # noqa: D102 - autograd's protocol
        ctx.seeds = seeds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102 - autograd's protocol
        noise = torch.randn(grad.shape, generator=torch.Generator().manual_seed(next(ctx.seeds)), dtype=torch.float64)
        return grad + (noise * NOISE * grad.abs().max().item()).to(grad.dtype), None


class JitteryBackwardBackend(Backend):
    """Eager attention whose gradients carry per-call noise, while it claims a deterministic backward."""

    name = "jittery-bwd"
    family = "test-nondeterministic"
    description = "eager attention; gradients differ bitwise call to call"
    devices = ("cpu",)
    native_gqa = True
    deterministic_backward = True  # the false claim the bitwise check must catch

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Eager attention with the jitter on q, a fresh seed each call."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        seeds = itertools.count(1)
        return Prepared(fn=lambda: naive_attention(_Jitter.apply(q, seeds), k, v, mask, scale=case.softmax_scale), leaves=(q, k, v))


class NoDeterministicBackend(JitteryBackwardBackend):
    """The same kernel, honest: it has no deterministic backward, and says why."""

    name = "no-det-bwd"
    deterministic_backward = False
    feature_reasons = {"deterministic": "its backward accumulates in launch order"}


def add_all(registry) -> None:
    """Add both backends to `registry` (the `ATTNBENCH_BACKENDS` hook)."""
    registry.add(JitteryBackwardBackend())
    registry.add(NoDeterministicBackend())
