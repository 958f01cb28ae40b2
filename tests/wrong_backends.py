"""Test-only backends that are subtly wrong: the agreement check must catch every one of them.

Never registered in the built-in registry. Tests add them to a registry by hand (`add_all`), and
`attnbench check` sees them through `ATTNBENCH_BACKENDS=tests.wrong_backends:add_all`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.backends.base import Backend, Prepared
from harness.attention.eager import naive_attention
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.attention.reference import poisoned_like


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


class _Eager(Backend):
    """Eager attention (right) with a hook that does one wrong thing: the base of the guard's wrong backends below."""

    family = "test-wrong"
    native_gqa = True

    def wrong(self, case: Case, inputs: AttentionInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """What the backend does around its `call`-th call (from 1); returns the output it hands back."""
        raise NotImplementedError

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Eager attention on whatever `inputs` hold at call time, passed through `wrong`."""
        mask = visible_mask(case, device=inputs.q.device)
        calls = [0]

        def fn() -> torch.Tensor:
            calls[0] += 1
            self.before(case, inputs, calls[0])
            return self.wrong(case, inputs, calls[0], naive_attention(inputs.q, inputs.k, inputs.v, mask))

        return Prepared(fn=fn, leaves=(inputs.q, inputs.k, inputs.v))

    def before(self, case: Case, inputs: AttentionInputs, call: int) -> None:
        """What the backend does to its inputs before its `call`-th call (nothing by default)."""


def _once(call: int, t: torch.Tensor, change) -> None:
    """Apply `change` to `t` in place on the first call only, without autograd seeing it (a kernel writing its own buffer)."""
    if call == 1:
        with torch.no_grad():
            t.copy_(change(t.detach().clone()))


class _InputWriter(_Eager):
    """Changes one input in place on its first call, in a way that keeps its sum and absolute sum, then attends to it."""

    tensor = "q"

    def change(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def before(self, case: Case, inputs: AttentionInputs, call: int) -> None:
        """Rewrite the input on the first call."""
        _once(call, getattr(inputs, self.tensor), self.change)

    def wrong(self, case: Case, inputs: AttentionInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """The output on the rewritten inputs, which is right for them and wrong for the case."""
        return out


class ReversesQueriesInPlace(_InputWriter):
    """Reverses q along S_q in place (the issue's example): a sum and an absolute sum stay the same."""

    name = "wrong-reverse-q"

    def change(self, t):
        return t.flip(2)


class SwapsKeyHeadsInPlace(_InputWriter):
    """Swaps the K heads in place (needs H_kv ≥ 2)."""

    name = "wrong-swap-k-heads"
    tensor = "k"

    def change(self, t):
        return t.flip(1)


class RollsValuesInPlace(_InputWriter):
    """Rolls v by one position along S_kv in place."""

    name = "wrong-roll-v"
    tensor = "v"

    def change(self, t):
        return t.roll(1, dims=2)


class SwapsTwoQueryElements(_InputWriter):
    """Swaps two elements of one query row in place: the smallest change a sum cannot see."""

    name = "wrong-swap-two-q"

    def change(self, t):
        t[0, 0, 0, 0], t[0, 0, 0, 1] = t[0, 0, 0, 1].clone(), t[0, 0, 0, 0].clone()
        return t


class PermutesUpstreamGradient(_InputWriter):
    """Reverses the upstream gradient along S_q in place (backward modes): the old guard never looked at it."""

    name = "wrong-reverse-grad-out"
    tensor = "grad_out"

    def before(self, case: Case, inputs: AttentionInputs, call: int) -> None:
        """Rewrite grad_out on the first call, if the case has one."""
        if inputs.grad_out is not None:
            _once(call, inputs.grad_out, lambda t: t.flip(2))


class RightOnFirstCallOnly(_Eager):
    """Adds 1e-2 to its output from its second call on (state carried across calls)."""

    name = "wrong-after-first-call"

    def wrong(self, case, inputs, call, out):
        return out if call == 1 else out + 1e-2


class AccumulatesIntoItsBuffer(_Eager):
    """Adds each call's output into one buffer it never clears: the first call is right, the second is twice it."""

    name = "wrong-accumulates"

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """A zeroed buffer, then `buffer += attention` per call."""
        prepared = super().prepare(case, inputs)
        inner, buffer = prepared.fn, []

        def fn() -> torch.Tensor:
            out = inner()
            if not buffer:
                buffer.append(torch.zeros_like(out))
            buffer[0].add_(out)
            return buffer[0]

        prepared.fn = fn
        return prepared

    def wrong(self, case, inputs, call, out):
        return out


class LeaksMaskAfterFirstCall(_Eager):
    """From its second call on, lets one masked position through (a mask cached and corrupted across calls)."""

    name = "wrong-mask-after-first-call"

    def wrong(self, case, inputs, call, out):
        if call == 1:
            return out
        return naive_attention(inputs.q, inputs.k, inputs.v, leak_one(visible_mask(case, device=inputs.q.device)))


class _OtherDtype(_Eager):
    """Returns its (right) output in another dtype than the case's: agreement in float64 alone would not see it."""

    #: What each case dtype is answered in (not `dtypes`: that is what a Backend declares it computes in).
    returned_dtypes: dict[str, torch.dtype] = {}

    def wrong(self, case, inputs, call, out):
        return out.to(self.returned_dtypes.get(case.dtype, torch.float64))


class UpcastsToFloat32(_OtherDtype):
    """bf16/fp16 cases answered in float32 (fp32 ones in float64)."""

    name = "wrong-dtype-fp32"
    returned_dtypes = {"bf16": torch.float32, "fp16": torch.float32}


class AnswersFp16ForBf16(_OtherDtype):
    """bf16 cases answered in fp16 (more mantissa, so closer to the reference), fp32 in float64."""

    name = "wrong-dtype-fp16"
    returned_dtypes = {"bf16": torch.float16, "fp16": torch.float32}


#: Backends the guard on inputs and `attnbench check`'s two calls and dtype rule must catch.
GUARD_BACKENDS = (ReversesQueriesInPlace, SwapsKeyHeadsInPlace, RollsValuesInPlace, SwapsTwoQueryElements, PermutesUpstreamGradient,
                  RightOnFirstCallOnly, AccumulatesIntoItsBuffer, LeaksMaskAfterFirstCall, UpcastsToFloat32, AnswersFp16ForBf16)


def add_guarded(registry) -> None:
    """Add the guard's wrong backends to `registry` (`ATTNBENCH_BACKENDS=tests.wrong_backends:add_guarded`)."""
    for cls in GUARD_BACKENDS:
        registry.add(cls())


class _WritesADescaleInPlace:
    """The honest eager-fp8, which doubles one FP8 descale of its inputs in place after its first call (a kernel updating
    its own scale state), or rebinds it in the descales dict: the dict itself is the same object either way."""

    descale = "k"
    rebind = False

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """The honest call, then the write."""
        honest = super().prepare(case, inputs)
        descales, calls = inputs.descales, [0]

        def fn() -> torch.Tensor:
            out = honest.fn()
            calls[0] += 1
            if calls[0] == 1:
                if self.rebind:
                    descales[self.descale] = descales[self.descale] * 2.0
                else:
                    descales[self.descale].mul_(2.0)
            return out

        return dataclasses.replace(honest, fn=fn)


def fp8_descale_writers() -> list[type]:
    """The wrong FP8 backends (built on the registry's eager-fp8, imported here only when asked for)."""
    from harness.backends.pytorch.eager_fp8 import EagerFp8Backend

    class DoublesKeyDescaleInPlace(_WritesADescaleInPlace, EagerFp8Backend):
        name = "wrong-double-k-descale"

    class RebindsValueDescale(_WritesADescaleInPlace, EagerFp8Backend):
        name = "wrong-rebind-v-descale"
        descale, rebind = "v", True

    return [DoublesKeyDescaleInPlace, RebindsValueDescale]


class ShiftsSinksInPlace(_InputWriter):
    """Adds 1 to the sink logits in place on its first call (sinks cases)."""

    name = "wrong-shift-sinks"
    tensor = "sinks"
    score_variants = frozenset({"sinks"})

    def change(self, t):
        return t + 1.0
