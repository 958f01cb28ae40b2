"""The inputs a pair gets, shared by the backends of one case, and the guard against a backend that writes into them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.attention.numerics import Agreement
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, make_case_inputs

#: The tensors of AttentionInputs (and of a ragged batch's RaggedInputs) a backend is handed and must leave as they were drawn.
GUARDED = ("q", "k", "v", "kv_lens", "grad_out", "cu_seqlens_q", "cu_seqlens_kv", "k_pages", "v_pages", "block_table")
#: Elements compared per step when a host copy is checked against a device tensor: bounds the device memory the
#: comparison borrows (64 Mi bytes of bf16 per chunk) instead of copying a whole input of a large case back at once.
CHUNK_ELEMENTS = 2**25


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as integers of its element size: compared bit for bit, so NaN equals NaN and −0 differs from 0."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@dataclass(frozen=True)
class KeptInputs:
    """An exact copy of a case's inputs as drawn, on the host, to tell whether a backend changed them.

    A sum or a norm cannot: a permutation (q reversed along S_q, heads swapped) leaves both unchanged.
    The copy costs the inputs' size again in host memory, never device memory: at the top of `default`
    (B 8, S 16384, H 32, d_k 128, bf16) about 3 GiB of RAM, beside the device's 141 GB left to the backends.
    """

    tensors: dict[str, torch.Tensor]

    @classmethod
    def of(cls, inputs: AttentionInputs) -> "KeptInputs":
        """A host copy of every guarded tensor of `inputs`."""
        with torch.no_grad():
            return cls({name: getattr(inputs, name).detach().to("cpu", copy=True) for name in GUARDED if getattr(inputs, name, None) is not None})

    def changed(self, inputs: AttentionInputs) -> list[str]:
        """The names of the guarded tensors of `inputs` that are no longer bit for bit the kept ones (shape, dtype or any element)."""
        return [name for name in GUARDED if not self._same(self.tensors.get(name), getattr(inputs, name, None))]

    @staticmethod
    def _same(kept: torch.Tensor | None, now: torch.Tensor | None) -> bool:
        if kept is None or now is None:
            return kept is None and now is None
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

    Safe because every pair compares its inputs with the kept copy after its calls: a backend that wrote
    into them fails its agreement, and the cache is dropped so the next backend gets freshly drawn ones.
    """

    def __init__(self) -> None:
        self._case: Case | None = None
        self._inputs: AttentionInputs | None = None
        self._kept: KeptInputs | None = None

    def get(self, case: Case) -> tuple[AttentionInputs, KeptInputs]:
        """The case's inputs (with q, k, v requiring grad in backward modes) and the copy of them as drawn."""
        if self._case != case or self._inputs is None or self._kept is None:
            self.drop()
            inputs = make_case_inputs(case)
            if case.mode != "fwd":
                for t in (inputs.q, inputs.k, inputs.v):
                    t.requires_grad_(True)
            self._case, self._inputs, self._kept = case, inputs, KeptInputs.of(inputs)
        return self._inputs, self._kept

    def drop(self) -> None:
        """Forget the inputs and their copy (their memory goes with them)."""
        self._case, self._inputs, self._kept = None, None, None
