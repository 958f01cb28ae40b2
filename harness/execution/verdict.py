"""The verdict on a pair's calls: each call's result against the float64 reference, and what two calls in a row say.

A row's output is judged as the timed call returned it (its dtype before any conversion of the adapter's),
and two consecutive calls are judged, never one: a backend right only on its first call, or wrong on
alternate calls, carries state across calls and times something else from its second call on.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.attention.numerics import Agreement, check_backward, check_forward, check_ragged_forward
from harness.attention.ragged_backward import check_ragged_backward, padding_note
from harness.attention.reference import ReferenceCache
from harness.backends.base import Backend, Prepared
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, output_dtype


def check_result(case: Case, prepared: Prepared, inputs: AttentionInputs, result: Any, references: ReferenceCache | None = None) -> Agreement:
    """Agreement of one step's result (output, or gradients in backward modes) with the float64 reference."""
    if prepared.check is not None:
        return prepared.check(result)
    if case.ragged and case.mode != "fwd":  # packed dQ, dK, dV, judged request by request; a padded batch's padding shown
        checked = prepared.grads_to_packed(result) if prepared.grads_to_packed else list(result)
        agreement = check_ragged_backward(case, inputs, checked, references)
        written = prepared.padding_gradients(result) if prepared.padding_gradients else None
        agreement = padding_note(agreement, written)
    elif case.ragged:  # the packed [T_q, H, d_v] output
        checked = [prepared.to_bhsd(result)]
        agreement = check_ragged_forward(case, inputs, checked[0], references)
    elif case.mode == "fwd":
        checked = [prepared.to_bhsd(result)]
        agreement = check_forward(case, inputs, checked[0], references)
    else:
        checked = [prepared.to_bhsd(g) for g in result]
        agreement = check_backward(case, inputs, checked, references)
    problem = returned_dtype_problem(case, result, checked)
    return agreement.disagreeing(problem) if problem else agreement


def returned_dtype_problem(case: Case, result: Any, checked: list[torch.Tensor]) -> str | None:
    """Why what the timed call itself returned is not in the case's dtype, or None.

    The verdict on the checked tensors sees them after the adapter's `to_bhsd`, which may cast: a kernel
    that computes and returns fp32 for a bf16 case, cast back by its adapter, would pass as a bf16 kernel.
    Each checked tensor is traced to the returned tensor it came from: a gradient to its own, an output
    to the tensor of the same element count among those returned (a tuple such as (out, lse) holds more).
    """
    wanted = output_dtype(case)
    if isinstance(result, torch.Tensor):
        returned = [result]
    elif isinstance(result, (tuple, list)):
        returned = [t for t in result if isinstance(t, torch.Tensor)]
    else:
        return None
    if case.mode != "fwd" and len(returned) == len(checked):
        sources: list[torch.Tensor | None] = returned
    else:
        sources = [_returned_source(returned, c, wanted) for c in checked]
    bad = next((t for t in sources if t is not None and t.dtype != wanted), None)
    if bad is None:
        return None
    return (f"the call returned {str(bad.dtype).removeprefix('torch.')}, not the case's {str(wanted).removeprefix('torch.')} "
            "(its adapter's conversion cast it)")


def _returned_source(returned: list[torch.Tensor], checked: torch.Tensor, wanted: torch.dtype) -> torch.Tensor | None:
    """The returned tensor `checked` was made from: of its element count, in the wanted dtype where one is; else (a padded
    batch's output, whose padding the adapter drops) the largest of its head width holding at least as many elements."""
    same_size = [t for t in returned if t.numel() == checked.numel()]
    if not same_size:
        same_size = sorted((t for t in returned if t.dim() and checked.dim() and t.shape[-1] == checked.shape[-1]
                            and t.numel() > checked.numel() and t.is_floating_point()), key=lambda t: -t.numel())[:1]
    return next((t for t in same_size if t.dtype == wanted), same_size[0] if same_size else None)


def agreement_of(case: Case, backend: Backend, prepared: Prepared, inputs: AttentionInputs, result: Any, check: bool,
                 references: ReferenceCache | None) -> Agreement:
    """The verdict on one call's result: compared with the float64 reference, or why it was not."""
    if not backend.computes_attention:
        return Agreement(None, None, None, None, f"not checked: {backend.name} does not compute attention")
    if check:
        return check_result(case, prepared, inputs, result, references)
    return Agreement(None, None, None, None, "not checked")


#: How `both_calls` names the two calls of `attnbench check` (two untimed calls) and of a timed row.
UNTIMED_CALLS = ("first of two calls", "second of two calls; the first agreed")
TIMED_CALLS = ("the last timed call", "the call after the timed ones; the last timed call agreed")


def both_calls(first: Agreement, second: Agreement, names: tuple[str, str] = UNTIMED_CALLS) -> Agreement:
    """The verdict on two calls in a row: the first one's failure, or the second's named as such, else the second's numbers."""
    if first.agree is False:
        return first.with_note(names[0])
    if second.agree is False and first.agree:
        return second.with_note(f"{names[1]}, so the backend carries state across calls")
    return second
