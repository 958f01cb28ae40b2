"""Score variants (softcap, sinks, ALiBi, a model's own scale): Case fields, seeded sinks, the float64 reference, and the backends."""

from __future__ import annotations

import json

import math

import numpy as np
import pytest
import torch

from harness.attention import reference
from harness.attention.numerics import weights_violations
from harness.attention.variants import VARIANTS, alibi_slopes, variants_of
from harness.backends.pytorch.flex import FlexBackend
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.registry import load_registry
from harness.checks.correctness import check_pair
from harness.errors import UserError
from harness.suite.batch_axes import ragged_case
from harness.suite.cases import Case, case_from_fields, grid, parse_case_id
from harness.suite.inputs import make_inputs
from harness.suite.ragged import make_ragged_inputs

BASE = dict(B=2, S_q=6, S_kv=9, H=4, H_kv=2, d_k=8, d_v=8)
ONE_EACH = {"softcap": dict(softcap=2.5), "sinks": dict(sinks=True), "alibi": dict(alibi=True), "scale": dict(scale=0.75)}


def case(**changes) -> Case:
    return Case(**{**BASE, **changes})


# --- fields, ids, records ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, token", [
    (dict(softcap=30), "-cap30"), (dict(softcap=30.5), "-cap30.5"), (dict(softcap=0.0001), "-cap0.0001"),
    (dict(sinks=True), "-sinks"), (dict(alibi=True, causal=True, window=4), "-win4-alibi"),
    (dict(scale=0.125), "-scale0.125"), (dict(softcap=50.0, sinks=True, scale=1.0 / 3, mode="bwd"), "-cap50-sinks-scale0.3333333333333333-bwd"),
])
def test_ids_name_the_variants_and_round_trip(changes, token):
    c = case(**changes)
    assert token in c.id
    assert parse_case_id(c.id) == c
    unset = {"softcap", "scale", "window", "page_size"}  # a CSV row's numeric columns: NaN where unset
    fields = {name: (float("nan") if value is None and name in unset else value) for name, value in c.fields().items()}
    assert case_from_fields(fields) == c


def test_a_float_survives_its_text_exactly():
    c = case(scale=0.1 + 0.2, softcap=123456.789)
    assert parse_case_id(c.id).scale == 0.1 + 0.2
    assert case_from_fields({**c.fields(), "softcap": float(repr(c.softcap))}) == c
    assert case(softcap=30).softcap == 30.0 and isinstance(case(softcap=30).softcap, float)


@pytest.mark.parametrize("changes, words", [
    (dict(softcap=0), "softcap must be a number in [0.0001, 1e+06]"), (dict(softcap=-1.0), "softcap must be"),
    (dict(softcap=2e6), "softcap must be"), (dict(softcap=float("nan")), "softcap must be"), (dict(softcap=True), "softcap must be"),
    (dict(softcap="30"), "softcap must be"), (dict(scale=1e-5), "scale must be a number in [0.0001, 100]"), (dict(scale=101), "scale must be"),
    (dict(sinks=1), "sinks must be true or false"),
    (dict(alibi=True, softcap=30.0), "alibi with softcap"), (dict(alibi=True, sinks=True), "alibi with sinks"),
    (dict(H_kv=1, d_v=4, mla=True, softcap=30.0), "an MLA case has no softcap"), (dict(H_kv=1, d_v=4, mla=True, alibi=True), "MLA"),
    (dict(H_kv=1, d_v=4, mla=True, sinks=True), "MLA"),  # a scale it takes: DeepSeek scales by its own (test_presets_2026)
])
def test_values_and_combinations_no_definition_covers_are_refused(changes, words):
    with pytest.raises(UserError, match=None) as raised:
        case(**changes)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_the_softmax_scale_is_the_cases_own_or_one_over_root_dk():
    assert case().softmax_scale == 1 / math.sqrt(8)
    assert case(scale=0.5).softmax_scale == 0.5
    assert reference.default_scale(case(scale=0.5)) == 0.5


def test_grid_passes_the_variant_fields_through():
    cases = grid(B=1, S=8, H=2, d_k=8, softcap=[None, 30.5], sinks=[False, True], scale=0.5, causal=True)
    stem = "B1-Sq8-Skv8-H2-Hkv2-dk8-fp32-causal"
    assert [c.id for c in cases] == [f"{stem}-scale0.5", f"{stem}-sinks-scale0.5", f"{stem}-cap30.5-scale0.5", f"{stem}-cap30.5-sinks-scale0.5"]


def test_variants_of_a_case_and_their_descriptions():
    assert variants_of(case()) == frozenset()
    assert variants_of(case(softcap=1.0, sinks=True, scale=2.0)) == {"softcap", "sinks", "scale"}
    assert variants_of(case(alibi=True)) == {"alibi"}
    assert set(VARIANTS) == {"softcap", "sinks", "alibi", "scale"}


def test_alibi_slopes_are_press_et_al():
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4).tolist() == [2.0 ** -(2 * i) for i in range(1, 5)]
    # 12 heads: the 8 of H=8, then every other slope of H=16 (2^-0.5, 2^-1.5, ...), as the ALiBi paper's code.
    want = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(want, dtype=torch.float32), rtol=0, atol=0)
    assert alibi_slopes(12).dtype == torch.float32


# --- seeded sinks ------------------------------------------------------------------------------------------------------

def test_sinks_are_their_own_stream_and_leave_q_k_v_unchanged():
    plain, sunk = make_inputs(case(mode="fwd_bwd")), make_inputs(case(mode="fwd_bwd", sinks=True))
    assert plain.sinks is None
    assert sunk.sinks.shape == (4,) and sunk.sinks.dtype == torch.float32
    for name in ("q", "k", "v", "grad_out"):
        assert torch.equal(getattr(plain, name), getattr(sunk, name)), name
    assert sunk.sinks.std() > 0.1 and not torch.equal(sunk.sinks, make_inputs(case(sinks=True, seed=1)).sinks)
    assert torch.equal(sunk.sinks, make_inputs(case(sinks=True)).sinks)


def test_ragged_inputs_carry_the_same_sinks():
    c = ragged_case("2x5 + 1x1@7", "packed", H=4, H_kv=2, d_k=8, sinks=True)
    plain = make_ragged_inputs(c.replace(sinks=False))
    sunk = make_ragged_inputs(c)
    assert plain.sinks is None and torch.equal(sunk.q, plain.q) and torch.equal(sunk.k, plain.k)
    assert torch.equal(sunk.sinks, make_inputs(case(sinks=True)).sinks)  # one stream per seed, whatever the layout


# --- the float64 reference against a hand-written formula ---------------------------------------------------------------

def by_hand(c: Case, inputs, rows=None) -> np.ndarray:
    """Attention of every (b, h, i) from the definitions, one query row at a time, in float64 numpy."""
    q, k, v = (t.double().numpy() for t in (inputs.q, inputs.k, inputs.v))
    rows = range(c.S_q) if rows is None else rows
    out = np.zeros((c.B, c.H, len(rows), c.d_v))
    slopes = alibi_slopes(c.H).double().numpy()
    for b in range(c.B):
        for h in range(c.H):
            kv = h // c.group_size
            for n, i in enumerate(rows):
                pos = i + c.S_kv - c.S_q
                s = np.array([q[b, h, i] @ k[b, kv, j] for j in range(c.S_kv)]) * c.softmax_scale
                if c.softcap is not None:
                    s = c.softcap * np.tanh(s / c.softcap)
                if c.alibi:
                    s = s - slopes[h] * np.abs(pos - np.arange(c.S_kv))
                if c.causal:
                    s = np.where(np.arange(c.S_kv) <= pos, s, -np.inf)
                e = np.exp(s - s.max())
                denominator = e.sum() + (math.exp(float(inputs.sinks[h]) - s.max()) if c.sinks else 0.0)
                out[b, h, n] = (e / denominator) @ v[b, kv]
    return out


@pytest.mark.parametrize("variant", list(ONE_EACH))
@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_definition(variant, causal):
    c = case(causal=causal, **ONE_EACH[variant])
    inputs = make_inputs(c)
    got = reference.forward(c, inputs, reference.reference_kernel(c.softmax_scale, c.softcap), torch.float64, torch.device("cpu"), None)
    without = case(causal=causal)
    plain = reference.forward(without, inputs, reference.reference_kernel(without.softmax_scale), torch.float64, torch.device("cpu"), None)
    np.testing.assert_allclose(got.numpy(), by_hand(c, inputs), rtol=1e-12, atol=1e-12)
    assert (got - plain).abs().max() > 1e-3  # the variant changes the answer: this inputs' draw can tell it apart


def test_sampled_rows_keep_their_own_alibi_positions():
    c = case(alibi=True)
    inputs = make_inputs(c)
    rows = torch.tensor([1, 4])
    got = reference.forward(c, inputs, reference.reference_kernel(c.softmax_scale), torch.float64, torch.device("cpu"), rows)
    np.testing.assert_allclose(got.numpy(), by_hand(c, inputs, rows=[1, 4]), rtol=1e-12, atol=1e-12)


def test_sinks_take_a_share_of_every_row():
    c = case(sinks=True)
    inputs = make_inputs(c)
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    terms = reference.Terms(sinks=inputs.sinks)
    _, weights = reference.reference_attention(q, k, v, None, c.softmax_scale, return_weights=True, terms=terms)
    sums = weights.sum(-1)
    assert bool((sums < 1 - 1e-3).all()) and bool((sums > 0).all())
    assert weights_violations(c, weights) == []
    assert weights_violations(c, weights * 2)  # more than 1 is still wrong


def test_reference_gradients_flow_through_softcap():
    c = case(softcap=0.5, mode="bwd")
    inputs = make_inputs(c)
    slices = reference.all_slices(c)
    capped = reference.gradients(c, inputs, reference.reference_kernel(c.softmax_scale, 0.5), torch.float64, torch.device("cpu"), slices)
    plain = reference.gradients(c, inputs, reference.reference_kernel(c.softmax_scale), torch.float64, torch.device("cpu"), slices)
    assert all(bool(torch.isfinite(g).all()) for g in capped)
    assert (capped[0] - plain[0]).abs().max() > 1e-3


# --- backends through the real check path -------------------------------------------------------------------------------

AGREEING = [
    ("naive", dict(softcap=2.5)), ("naive", dict(sinks=True)), ("naive", dict(alibi=True)), ("naive", dict(scale=0.75)),
    ("naive", dict(sinks=True, softcap=3.0, scale=0.5, causal=True)), ("naive", dict(alibi=True, causal=True, window=3)),
    ("naive", dict(alibi=True, causal=True, padding=True, S_q=9)), ("naive", dict(sinks=True, causal=True, padding=True, S_q=9)),
    ("sdpa", dict(alibi=True)), ("sdpa", dict(scale=0.75)), ("sdpa", dict(alibi=True, causal=True, window=3, scale=0.3)),
    ("sdpa-math", dict(alibi=True, causal=True)), ("sdpa-math", dict(scale=0.75)), ("sdpa-flash", dict(scale=0.75, causal=True)),
]


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("name, changes", AGREEING, ids=[f"{n}-{'-'.join(c)}" for n, c in AGREEING])
def test_backends_that_declare_a_variant_agree(name, changes, mode):
    backend = NaiveBackend() if name == "naive" else _sdpa(name)
    result = check_pair(case(mode=mode, **changes), backend)
    assert result.verdict == "agree", result.reason


def _sdpa(name: str):
    from harness.backends.pytorch import sdpa

    return {"sdpa": sdpa.SdpaBackend, "sdpa-math": sdpa.SdpaMathBackend, "sdpa-flash": sdpa.SdpaFlashBackend}[name]()


def test_a_wrong_variant_disagrees():
    class NoCap(NaiveBackend):
        """Declares softcap and ignores it."""

        name = "no-cap"

        def prepare(self, c, inputs):
            return super().prepare(c.replace(softcap=None), inputs)

    assert check_pair(case(softcap=0.5), NoCap()).verdict == "disagree"


def test_flex_on_cpu_refuses_sinks_with_the_reason():
    reason = FlexBackend().supports(case(sinks=True))
    assert reason.startswith("flex does not support sinks on CPU") and "return_lse" in reason


def test_sdpa_refuses_softcap_and_sinks_saying_sdpa_has_none():
    sdpa = _sdpa("sdpa")
    assert sdpa.supports(case(softcap=30.0)) == "sdpa does not support softcap (SDPA has no softcap: scores cannot be transformed before the softmax)"
    assert sdpa.supports(case(sinks=True)).startswith("sdpa does not support sinks (SDPA has no sink")
    assert _sdpa("sdpa-flash").supports(case(alibi=True)).startswith("sdpa-flash does not support alibi (")


def test_every_backend_refuses_the_variants_it_does_not_declare():
    registry = load_registry()
    refused = 0
    for backend in registry:
        for variant, changes in ONE_EACH.items():
            if variant in backend.score_variants:
                continue
            c = case(device="cuda" if "cuda" in backend.devices else "cpu", **changes)
            reasons = [r for r in backend.refusals(c) if r.startswith(f"{backend.name} does not support {variant} (")]
            assert len(reasons) == 1 and reasons[0].endswith(")"), backend.refusals(c)
            assert reasons[0] in backend.supports(c), (backend.name, variant)
            refused += 1
    assert refused > 10


def test_a_packed_batch_with_alibi_agrees_through_naive():
    c = ragged_case("2x5 + 1x1@7 + 1x3@6", "packed", H=4, H_kv=2, d_k=8, alibi=True, causal=True)
    result = check_pair(c, NaiveBackend())
    assert result.verdict == "agree", result.reason

    class IgnoresAlibi(NaiveBackend):
        """Serves the batch as if it had no ALiBi."""

        name = "ignores-alibi"

        def prepare(self, case_, inputs):
            return super().prepare(case_.replace(alibi=False), inputs)

    assert check_pair(c, IgnoresAlibi()).verdict == "disagree"


@pytest.mark.parametrize("layout", ["padded", "paged"])
def test_other_ragged_layouts_with_alibi_and_sinks_agree_through_naive(layout):
    for changes in (dict(alibi=True), dict(sinks=True, softcap=2.0)):
        c = ragged_case("2x5 + 1x1@7", layout, H=4, H_kv=2, d_k=8, causal=True, page_size=4 if layout == "paged" else None, **changes)
        assert check_pair(c, NaiveBackend()).verdict == "agree", (layout, changes)


@pytest.mark.compile
@pytest.mark.parametrize("layout", ["packed", "paged"])
def test_flex_computes_alibi_per_request_in_a_ragged_batch(layout):
    c = ragged_case("2x5 + 1x1@7 + 1x3@6", layout, H=4, H_kv=2, d_k=8, alibi=True, causal=True, page_size=4 if layout == "paged" else None)
    result = check_pair(c, FlexBackend())
    assert result.verdict == "agree", result.reason


def test_sinks_cost_their_logits_in_bytes_and_variants_no_flops():
    from harness.attention import theory

    plain = case(causal=True)
    assert theory.min_bytes(plain.replace(sinks=True)) == theory.min_bytes(plain) + 4 * plain.H
    for changes in ONE_EACH.values():
        assert theory.flops(plain.replace(**changes)) == theory.flops(plain)


def test_flex_sinks_identity_on_flexs_own_log_sum_exp():
    # CPU inductor has no return_lse, but flex's eager path does: its lse is natural-log and the rescale is the definition.
    from torch.nn.attention.flex_attention import flex_attention

    from harness.backends.pytorch.flex import with_sinks

    c = case(sinks=True)
    inputs = make_inputs(c)
    q, k, v = inputs.q, inputs.k, inputs.v
    out, lse = flex_attention(q, k, v, scale=c.softmax_scale, enable_gqa=True, return_lse=True)
    want = reference.forward(c, inputs, reference.reference_kernel(c.softmax_scale), torch.float64, torch.device("cpu"), None)
    assert (with_sinks(out, lse, inputs.sinks).double() - want).abs().max() < 1e-5
    assert (out.double() - want).abs().max() > 1e-2  # without the rescale the sinks are missing


def test_a_record_written_before_the_variant_fields_is_read_with_their_defaults(tmp_path):
    from harness.results.store import read_records
    from tests.synthetic_runs import synthetic_record

    row = synthetic_record(Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=8, d_v=8), "naive", 1.0).to_dict()
    for name in ("softcap", "sinks", "alibi", "scale"):
        del row[name]  # as yesterday's attnbench wrote it
    (tmp_path / "records.jsonl").write_text(json.dumps(row) + "\n")
    (record,) = read_records(tmp_path / "records.jsonl").records
    assert record["case_id"] == "B1-Sq8-Skv8-H2-Hkv2-dk8-fp32"
    from harness.results.record import Record

    case = Record.from_dict(record, where="r").case
    assert (case.softcap, case.sinks, case.alibi, case.scale) == (None, False, False, None)
