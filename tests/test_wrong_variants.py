"""A backend that gets a score variant wrong disagrees with the float64 reference: each plausible misreading, one backend.

Each wrong backend is the eager computation with one mistake (no variant at all, the softcap applied after the
mask, the sink logit scaled like a score, the ALiBi slopes in reverse head order): the check must catch every one.
"""

from __future__ import annotations

import pytest
import torch

from harness.attention.variants import alibi_slopes
from harness.backends.base import Backend, Prepared
from harness.checks.correctness import check_pair
from harness.suite.cases import Case
from harness.suite.inputs import query_positions, visible_mask

BASE = dict(B=1, S_q=24, S_kv=24, H=4, H_kv=2, d_k=16, d_v=16)


def _attend(case: Case, inputs, *, mistake: str) -> torch.Tensor:
    """softmax over scaled scores with the case's variants, written out; `mistake` names the one thing done wrong."""
    q, k, v = inputs.q, inputs.k, inputs.v
    g = case.H // case.H_kv
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scale = case.softmax_scale
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    mask = visible_mask(case, device=q.device)
    if case.softcap is not None and mistake != "ignore":
        if mistake == "softcap-after-mask":
            s = s.masked_fill(~mask, float("-inf")) if mask is not None else s
        s = case.softcap * torch.tanh(s / case.softcap)
    if case.alibi and mistake != "ignore":
        slopes = alibi_slopes(case.H).to(q.device, q.dtype)
        if mistake == "reversed-slopes":
            slopes = slopes.flip(0)
        pos = torch.as_tensor(query_positions(case)).to(q.device, q.dtype)  # [B, S_q]
        j = torch.arange(case.S_kv, device=q.device, dtype=q.dtype)
        s = s - slopes[None, :, None, None] * (pos[:, None, :, None] - j).abs()
    if mask is not None and mistake != "softcap-after-mask":  # capped after the mask, a hidden score is −c, not −∞: seen
        s = s.masked_fill(~mask, float("-inf"))
    if case.sinks and mistake != "ignore":
        sink = inputs.sinks.to(q.dtype)
        if mistake == "scaled-sink":
            sink = sink * scale
        sink = sink[None, :, None, None].expand(*s.shape[:3], 1)
        w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        w = torch.softmax(s, dim=-1)
    return torch.matmul(w.nan_to_num(0.0), v)


def wrong(mistake: str) -> Backend:
    """A backend that declares every variant and makes `mistake` (or none: 'right')."""
    class Wrong(Backend):
        name = f"wrong-{mistake}"
        family = "test"
        score_variants = frozenset({"softcap", "sinks", "alibi", "scale"})

        def prepare(self, case, inputs):
            return Prepared(fn=lambda: _attend(case, inputs, mistake=mistake), leaves=(inputs.q, inputs.k, inputs.v))

    return Wrong()


CASES = {
    "ignore": [Case(**BASE, softcap=2.0), Case(**BASE, sinks=True, causal=True), Case(**BASE, alibi=True)],
    "softcap-after-mask": [Case(**BASE, softcap=2.0, causal=True)],
    "scaled-sink": [Case(**BASE, sinks=True, window=8)],
    "reversed-slopes": [Case(**BASE, alibi=True, causal=True)],
}


@pytest.mark.parametrize("mistake, case", [(m, c) for m, cases in CASES.items() for c in cases], ids=lambda x: getattr(x, "id", x))
def test_a_backend_that_misreads_a_variant_disagrees_while_the_right_one_agrees(mistake, case):
    right, bad = check_pair(case, wrong("right")), check_pair(case, wrong(mistake))
    assert right.status == "ok" and right.agreement.agree is True, right.reason
    assert bad.status == "ok" and bad.agreement.agree is False, f"{mistake} passed the check on {case.id}"


def test_softcap_after_the_mask_is_a_different_function_only_where_rows_are_masked():
    # Unmasked, capping before or after a (non-existent) mask is the same thing: the mistake needs a mask to show.
    case = Case(**BASE, softcap=2.0)
    assert check_pair(case, wrong("softcap-after-mask")).agreement.agree is True
