"""Test-only ragged backends that are subtly wrong where the check of a serving batch used to look away.

Each is the naive backend's per-request path with one fault: a field of the batch rebound in prepare
(which poisoned the next backend's inputs), an fp32 kernel cast back by its adapter, a fault on one
request of many (a decode among long prefills), a fault on alternate calls. `attnbench run` and
`attnbench check` must both catch every one, and the honest naive backend must still agree.
Never registered in the built-in registry.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.backends.base import Prepared
from harness.backends.pytorch.naive import NaiveBackend
from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs


class _RaggedWrong(NaiveBackend):
    """naive's ragged path, its output passed through `wrong` on each call (from 1)."""

    family = "test-wrong"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The naive ragged step, then the fault."""
        honest = super().prepare(case, inputs)
        calls = [0]

        def fn() -> torch.Tensor:
            calls[0] += 1
            return self.wrong(case, inputs, calls[0], honest.fn())

        return dataclasses.replace(honest, fn=fn)

    def wrong(self, case: Case, inputs: RaggedInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """The output this backend hands back on its `call`-th call."""
        return out


class _Rebinds(_RaggedWrong):
    """Computes right, but rebinds one field of the batch in prepare: the batch the next backend reads is another."""

    field = ""

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The honest step, then the field rebound."""
        prepared = super().prepare(case, inputs)
        setattr(inputs, self.field, self.rebound(getattr(inputs, self.field)))
        return prepared

    def rebound(self, value):
        """The value the field is rebound to."""
        raise NotImplementedError


class RebindsKvLengths(_Rebinds):
    """Shortens the last request's KV length by one in the shared batch."""

    name = "wrong-rebinds-kv-lengths"
    field = "seq_lens_kv"

    def rebound(self, value):
        """One key fewer for the last request."""
        return (*value[:-1], value[-1] - 1)


class RebindsCausal(_Rebinds):
    """Flips the batch's causal flag."""

    name = "wrong-rebinds-causal"
    field = "causal"

    def rebound(self, value):
        """The other mask."""
        return not value


class RebindsPageSize(_Rebinds):
    """Halves the page size of a paged batch."""

    name = "wrong-rebinds-page-size"
    field = "page_size"

    def rebound(self, value):
        """Half the page size (a paged batch only)."""
        return None if value is None else max(1, value // 2)


class Fp32CastBack(_RaggedWrong):
    """Computes in fp32 and returns fp32; its adapter's conversion casts the output back to the case's dtype."""

    name = "wrong-fp32-cast-back"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The step on fp32 copies; to_bhsd casts back, so the checked output looks right."""
        wide = dataclasses.replace(inputs, q=inputs.q.float(), k=inputs.k.float(), v=inputs.v.float(),
                                   k_pages=None if inputs.k_pages is None else inputs.k_pages.float(),
                                   v_pages=None if inputs.v_pages is None else inputs.v_pages.float())
        prepared = NaiveBackend.prepare(self, case, wide)
        return dataclasses.replace(prepared, to_bhsd=lambda out: out.to(inputs.q.dtype))


class WrongOnOneDecode(_RaggedWrong):
    """Right on every request but one decode in the middle of the batch, whose row is scaled by 1.25."""

    name = "wrong-one-decode"

    def wrong(self, case: Case, inputs: RaggedInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """The middle one-query request's row scaled."""
        decodes = [i for i, n in enumerate(inputs.seq_lens_q) if n == 1]
        row = sum(inputs.seq_lens_q[:decodes[len(decodes) // 2]])
        out = out.clone()
        out[row] *= 1.25
        return out


class WrongInsideALongRequest(_RaggedWrong):
    """Right but for one query row in the middle of the first long request (neither its first nor its last)."""

    name = "wrong-inside-long-request"

    def wrong(self, case: Case, inputs: RaggedInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """Rows 1 .. q_len − 2 of request 0 scaled: all of its interior."""
        out = out.clone()
        out[1:inputs.seq_lens_q[0] - 1] *= 1.25
        return out


class WrongOnEvenCalls(_RaggedWrong):
    """Right on odd calls, every output scaled by 1.25 on even ones."""

    name = "wrong-even-calls"

    def wrong(self, case: Case, inputs: RaggedInputs, call: int, out: torch.Tensor) -> torch.Tensor:
        """Scaled on even calls."""
        return out * 1.25 if call % 2 == 0 else out


class PermutesQueriesAndBack(_RaggedWrong):
    """Reverses q in place before odd calls and back before even ones: even calls are right, on the inputs as drawn."""

    name = "wrong-permutes-and-back"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The step on whatever q holds, q reversed in place before each call."""
        honest = NaiveBackend.prepare(self, case, inputs)

        def fn() -> torch.Tensor:
            with torch.no_grad():
                inputs.q.copy_(inputs.q.flip(0))
            return honest.fn()

        return dataclasses.replace(honest, fn=fn)


REBINDING = (RebindsKvLengths, RebindsCausal, RebindsPageSize)
WRONG_RAGGED = (*REBINDING, Fp32CastBack, WrongOnOneDecode, WrongInsideALongRequest, WrongOnEvenCalls, PermutesQueriesAndBack)


class Fp32CastBackPadded(_RaggedWrong):
    """Computes a padded batch in fp32 and returns the padded fp32 output; its adapter drops the padding and casts back,
    so the checked packed rows are bf16 and of another element count than anything the call returned."""

    name = "wrong-fp32-cast-back-padded"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The step on fp32 copies; to_bhsd unpads (the honest adapter's) and casts back."""
        wide = dataclasses.replace(inputs, q=inputs.q.float(), k=inputs.k.float(), v=inputs.v.float())
        prepared = NaiveBackend.prepare(self, case, wide)
        return dataclasses.replace(prepared, to_bhsd=lambda out: prepared.to_bhsd(out).to(inputs.q.dtype))


class RebindsDecodeLengthWhilePreparing(_RaggedWrong):
    """Rebinds the batch's KV lengths (one key fewer for the middle decode) while it prepares, and puts them back before
    returning: the batch is as drawn whenever the guard looks, and only the output says its kernel read other lengths."""

    name = "wrong-rebinds-lengths-and-back"

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """The naive step planned on the rebound lengths; the drawn ones restored."""
        drawn = inputs.seq_lens_kv
        decodes = [i for i, n in enumerate(inputs.seq_lens_q) if n == 1]
        lengths = list(drawn)
        lengths[decodes[len(decodes) // 2]] -= 1
        inputs.seq_lens_kv = tuple(lengths)
        try:
            return NaiveBackend.prepare(self, case, inputs)
        finally:
            inputs.seq_lens_kv = drawn


WRONG_RAGGED = (*WRONG_RAGGED, Fp32CastBackPadded, RebindsDecodeLengthWhilePreparing)
