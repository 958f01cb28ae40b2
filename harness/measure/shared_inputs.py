"""The inputs a pair gets, shared by the backends of one case, and the guard against a backend that writes into them."""

from __future__ import annotations

import torch

from harness.measure.numerics import Agreement
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, make_inputs


def input_fingerprints(inputs: AttentionInputs) -> list[tuple[float, float]]:
    """Float64 sum and absolute sum of q, k, v: notices a backend writing into its inputs without keeping a copy."""
    with torch.no_grad():
        return [(float(t.detach().sum(dtype=torch.float64)), float(t.detach().abs().sum(dtype=torch.float64)))
                for t in (inputs.q, inputs.k, inputs.v)]


def modified_inputs(drawn: list[tuple[float, float]], inputs: AttentionInputs) -> Agreement | None:
    """A failed agreement when q, k or v changed since `drawn` (the timed calls then ran on inputs nobody drew), else None.

    Nothing is compared with a reference then: the inputs it would be computed from are not the case's.
    """
    changed = [name for name, before, now in zip("qkv", drawn, input_fingerprints(inputs)) if before != now]
    if not changed:
        return None
    return Agreement(None, None, None, False, f"backend modified its inputs in place ({', '.join(changed)})")


class InputsCache:
    """The last case's inputs, handed to the next backend of the same case (loops run cases outer, backends inner).

    Safe because every pair fingerprints its inputs before and after: a backend that wrote into them
    fails its agreement, and the cache is dropped so the next backend gets freshly drawn ones.
    """

    def __init__(self) -> None:
        self._case: Case | None = None
        self._inputs: AttentionInputs | None = None
        self._drawn: list[tuple[float, float]] = []

    def get(self, case: Case) -> tuple[AttentionInputs, list[tuple[float, float]]]:
        """The case's inputs (with q, k, v requiring grad in backward modes) and their fingerprints."""
        if self._case != case or self._inputs is None:
            self.drop()
            inputs = make_inputs(case)
            if case.mode != "fwd":
                for t in (inputs.q, inputs.k, inputs.v):
                    t.requires_grad_(True)
            self._case, self._inputs, self._drawn = case, inputs, input_fingerprints(inputs)
        return self._inputs, self._drawn

    def drop(self) -> None:
        """Forget the inputs (their memory goes with them)."""
        self._case, self._inputs, self._drawn = None, None, []
