"""The inputs a pair gets, shared by the backends of one case, and the guard against a backend that changes them."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from harness.attention.numerics import Agreement
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, input_leaves
from harness.suite.ragged import make_case_inputs

#: Elements compared per step when a host copy is checked against a device tensor: bounds the device memory the
#: comparison borrows (64 Mi bytes of bf16 per chunk) instead of copying a whole input of a large case back at once.
CHUNK_ELEMENTS = 2**25


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as integers of its element size: compared bit for bit, so NaN equals NaN and −0 differs from 0."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@dataclass(frozen=True)
class KeptInputs:
    """An exact copy of a case's inputs as drawn, on the host, to tell whether a backend changed them.

    Every field of the inputs is kept, down to its leaves (`input_leaves`: the FP8 descales in their dict, the
    sinks, a ragged batch's lengths): tensors bit for bit (a sum or a norm cannot tell: a permutation, q reversed
    along S_q or heads swapped, leaves both unchanged), the rest by value, copied (a dict kept by reference would
    compare an in-place write with itself). The copy costs the inputs' size again in host memory, never device
    memory: at the top of `default` (B 8, S 16384, H 32, d_k 128, bf16) about 3 GiB of RAM.
    """

    tensors: dict[str, torch.Tensor]
    values: dict[str, Any]

    @classmethod
    def of(cls, inputs: Any) -> "KeptInputs":
        """A host copy of every leaf of `inputs` (an AttentionInputs or a RaggedInputs)."""
        tensors, values = {}, {}
        with torch.no_grad():
            for path, value in input_leaves(inputs):
                if isinstance(value, torch.Tensor):
                    tensors[path] = value.detach().to("cpu", copy=True)
                else:
                    values[path] = copy.deepcopy(value)
        return cls(tensors, values)

    def changed(self, inputs: Any) -> list[str]:
        """The leaves of `inputs` that are no longer the kept ones (a tensor's shape, dtype or any bit, another value), or are new or gone."""
        now = dict(input_leaves(inputs))
        changed = []
        for path in [*self.tensors, *self.values, *(p for p in now if p not in self.tensors and p not in self.values)]:
            if path not in now:
                changed.append(path)
            elif path in self.tensors:
                if not (isinstance(now[path], torch.Tensor) and self._same(self.tensors[path], now[path])):
                    changed.append(path)
            elif path in self.values:
                kept = self.values[path]
                if isinstance(now[path], torch.Tensor) or type(now[path]) is not type(kept) or now[path] != kept:
                    changed.append(path)
            else:
                changed.append(path)
        return changed

    @staticmethod
    def _same(kept: torch.Tensor, now: torch.Tensor) -> bool:
        if now.shape != kept.shape or now.dtype != kept.dtype:
            return False
        with torch.no_grad():
            now_flat, kept_flat = _bits(now.detach()).reshape(-1), _bits(kept).reshape(-1)
            if now.device.type == "cpu":
                return torch.equal(now_flat, kept_flat)
            for start in range(0, kept_flat.numel(), CHUNK_ELEMENTS):
                piece = slice(start, start + CHUNK_ELEMENTS)
                if not torch.equal(now_flat[piece], kept_flat[piece].to(now.device)):
                    return False
        return True


def modified_inputs(kept: KeptInputs, inputs: AttentionInputs, when: str = "") -> Agreement | None:
    """A failed agreement when any input changed since it was drawn (the calls then ran on inputs nobody drew), else None.

    Nothing is compared with a reference then; otherwise the inputs are bit for bit the drawn ones, so the
    reference computed from them is the reference of the inputs as generated.
    """
    changed = kept.changed(inputs)
    if not changed:
        return None
    return Agreement(None, None, None, False, f"backend modified its inputs in place ({', '.join(changed)}){when}")


class InputsCache:
    """The last case's inputs, handed to the next backend of the same case (loops run cases outer, backends inner).

    Safe because each pair gets its own copy of the inputs object (a field it rebinds, a ragged batch's
    lengths or page size, stays its own) and compares it with the kept copy after its calls: a backend
    that wrote into a tensor or rebound a field fails its agreement, and the cache is dropped so the
    next backend gets freshly drawn ones.
    """

    def __init__(self) -> None:
        self._case: Case | None = None
        self._inputs: AttentionInputs | None = None
        self._kept: KeptInputs | None = None

    def get(self, case: Case) -> tuple[AttentionInputs, KeptInputs]:
        """A copy of the case's inputs for one pair (q, k, v requiring grad in backward modes; the tensors shared) and the copy as drawn."""
        if self._case != case or self._inputs is None or self._kept is None:
            self.drop()
            inputs = make_case_inputs(case)
            if case.mode != "fwd":
                for t in (inputs.q, inputs.k, inputs.v):
                    t.requires_grad_(True)
            self._case, self._inputs, self._kept = case, inputs, KeptInputs.of(inputs)
        return dataclasses.replace(self._inputs), self._kept

    def drop(self) -> None:
        """Forget the inputs and their copy (their memory goes with them)."""
        self._case, self._inputs, self._kept = None, None, None
