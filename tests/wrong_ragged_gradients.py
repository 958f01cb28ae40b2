"""Test-only backends whose backward over a training batch is wrong in one place only, or writes into the padding.

Each computes the naive backend's forward unchanged and injects one fault into a gradient through an identity whose
backward is not: dK of the shortest document scaled (beside long ones, so one tensor-wide bound would cover it), and a
padded batch whose dK padding rows hold a finite value or NaN. Never registered in the built-in registry.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.attention.eager import naive_attention
from harness.backends.base import Prepared
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.ragged_views import padded, padded_prepared, per_request, request_masks, requests
from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs


class _GradientFault(torch.autograd.Function):
    """The identity forward; backward hands `fault(grad)` back instead of grad."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, fault: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:  # noqa: D102
        ctx.fault = fault
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        return ctx.fault(grad.clone()), None


class WrongDkOfOneShortDocument(NaiveBackend):
    """Packed: dK of the shortest document scaled by 1.2; every other request, the output, dQ and dV right."""

    name = "wrong-dk-one-short-document"
    family = "test-wrong"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """One eager call per request over K passed through the fault."""
        shortest = min(range(len(inputs.seq_lens_kv)), key=lambda i: inputs.seq_lens_kv[i])
        start = sum(inputs.seq_lens_kv[:shortest])
        rows = slice(start, start + inputs.seq_lens_kv[shortest])

        def fault(grad: torch.Tensor) -> torch.Tensor:
            grad[rows] *= 1.2
            return grad

        masks = request_masks(inputs, case.window)

        def fn() -> torch.Tensor:
            k = _GradientFault.apply(inputs.k, fault)
            return per_request(lambda r: naive_attention(r.q, r.k, r.v, r.mask, scale=case.softmax_scale),
                               requests(inputs, k, inputs.v, masks))

        return Prepared(fn=fn, leaves=(inputs.q, inputs.k, inputs.v))


class _WritesIntoPadding(NaiveBackend):
    """Padded: the honest rectangle, with dK's padding rows set to `value`."""

    family = "test-wrong"
    value = 0.0

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The eager rectangle with K passed through the fault."""
        rect = padded(inputs, case.window, requires_grad=True)
        value = self.value

        def fault(grad: torch.Tensor) -> torch.Tensor:
            for i, n in enumerate(inputs.seq_lens_kv):
                grad[i, :, n:] = value
            return grad

        def fn() -> torch.Tensor:
            k = _GradientFault.apply(rect.k, fault)
            return naive_attention(rect.q, k, rect.v, rect.mask, scale=case.softmax_scale)

        return padded_prepared(rect, Prepared(fn=fn), backward=True)


class WritesIntoPadding(_WritesIntoPadding):
    """Writes 7.0 into dK's padding rows: shown, not judged (no optimizer step reads a padding row's gradient)."""

    name = "writes-into-padding"
    value = 7.0


class WritesNanIntoPadding(_WritesIntoPadding):
    """Writes NaN into dK's padding rows: a NaN gradient poisons the optimizer step, so it never agrees."""

    name = "writes-nan-into-padding"
    value = float("nan")
