"""Numerical agreement: the float64 reference, the rule, poison, weights, the worked example, and wrong backends caught."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.attention import numerics
from harness.backends.base import Backend, Prepared
from harness.backends.pytorch.naive import NaiveBackend
from harness.attention.eager import naive_attention
from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.checks.correctness import check_pair
from harness.suite.inputs import AttentionInputs, make_inputs, visible_mask
from harness.attention import reference
from harness.attention.numerics import check_forward, error_against, weights_violations
from harness.attention.reference import gradient_slices, poisoned_like, query_rows, reference_attention
from harness.execution.execute import PairRunner, execute
from harness.measure.timing import Budget
from tests.wrong_backends import LeakedMaskBackend, PartialWriteBackend, ScaleOffBackend, WrongGqaBackend, leak_one

CPU_BACKENDS = ("naive", "sdpa", "sdpa-math", "sdpa-flash")
DTYPES = ("fp32", "fp16", "bf16")
KINDS = {"MHA": 4, "GQA": 2, "MQA": 1}
MASKS = {"none": {}, "causal": {"causal": True}, "pad": {"padding": True}, "causal-pad": {"causal": True, "padding": True}}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def registry():
    return load_registry(plugins=False)


def small_case(dtype="fp32", kind="GQA", mask="none", **changes) -> Case:
    fields = dict(B=2, S_q=24, S_kv=24, H=4, H_kv=KINDS[kind], d_k=16, d_v=16, dtype=dtype, **MASKS[mask])
    return Case(**{**fields, **changes})


# --- every CPU backend agrees, in every dtype, mask and head layout, forward and backward ---------------------------


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_backends_agree(registry, dtype, kind, mask, mode):
    case = small_case(dtype, kind, mask, mode=mode)
    for backend in CPU_BACKENDS:  # inner loop: the case's float64 reference is computed once and reused
        result = check_pair(case, registry.get(backend))
        assert result.verdict == "agree", (backend, result.verdict, result.reason, result.agreement)
        a = result.agreement
        assert math.isfinite(a.max_abs_err) and a.max_abs_err <= a.err_bound, backend
        assert 0 <= a.rel_err < 0.05, backend


def test_cross_attention_bottom_right_causal_agrees(registry):
    """S_q < S_kv with a causal mask: the reference's bottom-right alignment is the one SDPA's lower-right bias uses."""
    case = Case(B=2, S_q=5, S_kv=40, H=4, H_kv=2, d_k=16, d_v=16, causal=True)
    for name in ("naive", "sdpa", "sdpa-math"):
        assert check_pair(case, registry.get(name)).verdict == "agree", name


# --- the reference itself ---------------------------------------------------------------------------------------------


def loop_attention(case: Case, inputs: AttentionInputs) -> np.ndarray:
    """Attention by explicit loops over batch, head and query, from the mask's definition (an oracle for the reference)."""
    q, k, v = (t.double().numpy() for t in (inputs.q, inputs.k, inputs.v))
    mask = visible_mask(case)
    out = np.zeros((case.B, case.H, case.S_q, case.d_v))
    for b in range(case.B):
        for h in range(case.H):
            hk = h // (case.H // case.H_kv)
            for i in range(case.S_q):
                keys = [j for j in range(case.S_kv) if mask is None or bool(mask[b, 0, i, j])]
                if not keys:
                    continue
                s = np.array([q[b, h, i] @ k[b, hk, j] / math.sqrt(case.d_k) for j in keys])
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ v[b, hk, keys]
    return out


@pytest.mark.parametrize("changes", [
    dict(H_kv=2, causal=True, padding=True),
    dict(H_kv=1, S_q=3, S_kv=11, causal=True),
    dict(H_kv=4, window=3),
    dict(H_kv=2, S_q=9, S_kv=7, causal=True),  # S_q > S_kv: the first rows see no key
])
def test_reference_matches_an_explicit_loop(changes):
    case = Case(**{**dict(B=2, S_q=7, S_kv=7, H=4, H_kv=4, d_k=8, d_v=8, dtype="fp64"), **changes})
    inputs = make_inputs(case)
    ref = reference_attention(inputs.q, inputs.k, inputs.v, visible_mask(case), 1 / math.sqrt(case.d_k))
    np.testing.assert_allclose(ref.numpy(), loop_attention(case, inputs), rtol=1e-12, atol=1e-12)


def test_reference_gradients_are_finite_on_rows_that_see_nothing():
    case = Case(B=1, S_q=6, S_kv=4, H=2, H_kv=1, d_k=8, d_v=8, causal=True, mode="fwd_bwd")
    inputs = make_inputs(case)
    grads = reference.gradients(case, inputs, reference.reference_kernel(0.25), torch.float64, torch.device("cpu"), gradient_slices(case))
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert bool((grads[0][0, :, :2] == 0).all())  # queries 0 and 1 see no key: no gradient


def test_scale_is_one_over_sqrt_dk():
    assert reference.default_scale(small_case(d_k=64)) == 0.125


# --- the rule ---------------------------------------------------------------------------------------------------------


def test_rule_is_twice_eager_error_plus_atol():
    ref = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    lp = ref + torch.tensor([1e-3, 0.0, 0.0], dtype=torch.float64)
    bound = 2e-3 + numerics.atol("bf16", 2.0)
    ok = error_against(ref + torch.tensor([0.0, bound * 0.99, 0.0], dtype=torch.float64), ref, lp, "bf16")
    bad = error_against(ref + torch.tensor([0.0, bound * 1.01, 0.0], dtype=torch.float64), ref, lp, "bf16")
    assert ok.agree and ok.err_bound == pytest.approx(bound)
    assert not bad.agree and bad.max_abs_err == pytest.approx(bound * 1.01)


def test_atol_is_one_rounding_of_the_largest_element_plus_a_floor():
    assert numerics.atol("bf16", 3.0) == pytest.approx(1e-5 + 3 * 2**-8)
    assert numerics.atol("fp16", 3.0) == pytest.approx(1e-5 + 3 * 2**-11)
    assert numerics.atol("fp32", 3.0) < 2e-5
    assert numerics.atol("bf16", 9.0) > numerics.atol("bf16", 3.0)  # gradients can exceed the values' magnitude



@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_rules_cpu_eager_is_torchs_own_low_precision_eager_but_for_summation_order(dtype):
    # On the CPU the rule's `lp` multiplies in fp32 and rounds back, as a low-precision GEMM with fp32 accumulation
    # does: it must land where torch's own bf16/fp16 eager lands (same rounding points), not at fp32's accuracy.
    case = small_case(dtype, causal=True, S_q=96, S_kv=96)
    inputs = make_inputs(case)
    scale, mask = reference.default_scale(case), visible_mask(case)
    lp = reference.forward(case, inputs, reference.eager_kernel(scale), inputs.q.dtype, inputs.q.device, None)
    native = naive_attention(inputs.q, inputs.k, inputs.v, mask, scale=scale)
    assert lp.dtype == native.dtype == inputs.q.dtype
    ulp = torch.finfo(inputs.q.dtype).eps
    assert float((lp.double() - native.double()).abs().max()) <= 2 * ulp * float(native.double().abs().max())
    assert float((lp == native).double().mean()) > 0.99  # an fp32 product left unrounded lands on other values
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_never_agrees(bad_value):
    ref = torch.zeros(4, dtype=torch.float64)
    out = torch.zeros(4)
    out[2] = bad_value
    result = error_against(out, ref, ref.clone(), "fp32")
    assert result.agree is False and "non-finite" in result.check_note


def test_wrong_shape_never_agrees():
    case = small_case()
    inputs = make_inputs(case)
    out = naive_attention(inputs.q, inputs.k, inputs.v).transpose(1, 2)  # [B, S, H, d]: layout not converted back
    assert check_forward(case, inputs, out).agree is False


# --- poison and fresh inputs ------------------------------------------------------------------------------------------


def test_poisoned_like_is_all_nan():
    buf = poisoned_like(torch.zeros(2, 3, dtype=torch.bfloat16))
    assert buf.shape == (2, 3) and buf.dtype == torch.bfloat16 and bool(buf.isnan().all())
    with pytest.raises(TypeError):
        poisoned_like(torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_unwritten_output_element_is_caught(dtype):
    """A kernel that writes into a harness-style poisoned `out` but skips a row leaves NaN there: it disagrees."""
    result = check_pair(small_case(dtype, "GQA", "causal"), PartialWriteBackend())
    assert result.verdict == "disagree" and "non-finite" in result.reason


def test_unwritten_reference_slices_are_a_loud_harness_error():
    """The reference's own buffers are poisoned too: comparing a slice it never computed raises instead of agreeing."""
    case = small_case(kind="GQA", mode="fwd_bwd")
    inputs = make_inputs(case)
    ref = reference.gradients(case, inputs, reference.reference_kernel(0.25), torch.float64, torch.device("cpu"), gradient_slices(case)[:1])
    with pytest.raises(RuntimeError, match="non-finite"):
        error_against(ref[0].float(), ref[0], ref[0], "fp32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_are_seeded_random_never_constant(dtype):
    case = small_case(dtype, mode="fwd_bwd", seed=7)
    a, b = make_inputs(case), make_inputs(case)
    for name in ("q", "k", "v", "grad_out"):
        t = getattr(a, name).float()
        assert float(t.std()) > 0.5 and t.unique().numel() > t.numel() // 4, name
        assert torch.equal(getattr(a, name), getattr(b, name)), name  # the recorded seed reproduces them
    assert not torch.equal(make_inputs(case.replace(seed=8)).q, a.q)


def test_a_backend_that_modifies_its_inputs_disagrees():
    class Mutating(NaiveBackend):
        name = "mutating"

        def prepare(self, case, inputs):
            prepared = super().prepare(case, inputs)

            def fn():
                out = prepared.fn()
                inputs.q.mul_(2.0)
                return out

            return type(prepared)(fn=fn, leaves=prepared.leaves)

    result = check_pair(small_case(), Mutating())
    assert result.verdict == "disagree" and "modified its inputs" in result.reason


def test_kept_reference_is_only_reused_for_equal_inputs():
    """Two checks of one case on different inputs: the second must not be judged against the first's reference."""
    case = small_case(kind="GQA", mask="causal")
    for seed in (1, 2):
        inputs = make_inputs(case, seed=seed)
        assert check_forward(case, inputs, naive_attention(inputs.q, inputs.k, inputs.v, visible_mask(case))).agree


# --- large cases: sampled rows and slices -----------------------------------------------------------------------------


def test_query_rows_sample_includes_first_and_last(monkeypatch):
    monkeypatch.setattr(reference, "MAX_REFERENCE_SCORES", 1000)
    monkeypatch.setattr(reference, "SAMPLED_ROWS", 10)
    case = small_case(S_q=64, S_kv=64)
    rows = query_rows(case).tolist()
    assert rows[0] == 0 and rows[-1] == 63 and rows == sorted(set(rows)) and len(rows) <= 10
    assert query_rows(small_case()) is not None and query_rows(small_case(S_q=8, S_kv=8)) is None


def test_sampled_checks_still_catch_a_wrong_backend(monkeypatch, registry):
    """With the reference budget shrunk so that rows (forward) and slices (backward) are sampled, wrong stays wrong."""
    monkeypatch.setattr(reference, "MAX_REFERENCE_SCORES", 2 * 24 * 24 * 2)
    monkeypatch.setattr(reference, "SAMPLED_ROWS", 8)
    fwd, bwd = small_case(kind="GQA", mask="causal"), small_case(kind="GQA", mask="causal", mode="fwd_bwd")
    assert len(gradient_slices(bwd)) < bwd.B * bwd.H_kv
    for case in (fwd, bwd):
        good = check_pair(case, registry.get("sdpa"))
        assert good.verdict == "agree" and "checked" in good.reason
        assert check_pair(case, WrongGqaBackend()).verdict == "disagree"


def test_gradients_too_large_to_check_are_marked_unchecked(monkeypatch, registry):
    monkeypatch.setattr(reference, "MAX_REFERENCE_SCORES", 10)
    result = check_pair(small_case(mode="fwd_bwd"), registry.get("naive"))
    assert result.verdict == "not checked" and result.agreement.agree is None


# --- wrong backends are caught ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_scale_off_by_one_percent_is_caught(dtype, kind, mask, mode):
    assert check_pair(small_case(dtype, kind, mask, mode=mode), ScaleOffBackend()).verdict == "disagree"


def test_bf16_cannot_resolve_one_percent_so_the_check_grid_pairs_it_with_fp32():
    """In bf16 eager itself is about as far from float64 as a 1 % scale error (numerics' docstring): the
    principled fix is the dtype the check includes, not a tighter bf16 bound. Every bf16 shape of the
    default check grid has an fp32 twin, and checking bf16 alone warns."""
    from harness.checks.correctness import default_cases, resolution_warning

    cases = default_cases()
    shapes = {c.replace(dtype="fp32") for c in cases if c.dtype == "fp32"}
    assert all(c.replace(dtype="fp32") in shapes for c in cases if c.dtype == "bf16")
    assert resolution_warning([c for c in cases if c.dtype == "bf16"]) is not None
    assert resolution_warning(cases) is None
    # The claim, measured: in bf16 the wrong scale's error is within an order of magnitude of eager bf16's own error,
    # while in fp32 it is thousands of times eager fp32's.
    ratios = {}
    for dtype in ("bf16", "fp32"):
        case = small_case(dtype, "MHA")
        inputs = make_inputs(case)
        ref = reference_attention(*(t.double() for t in (inputs.q, inputs.k, inputs.v)), None, reference.default_scale(case))
        eager = float((naive_attention(inputs.q, inputs.k, inputs.v).double() - ref).abs().max())
        wrong = float((ScaleOffBackend().prepare(case, inputs).fn().double() - ref).abs().max())
        ratios[dtype] = wrong / eager
    assert ratios["bf16"] < 10 and ratios["fp32"] > 1000, ratios


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_leaked_causal_position_is_caught(dtype, kind, mode):
    assert check_pair(small_case(dtype, kind, "causal", mode=mode), LeakedMaskBackend()).verdict == "disagree"


def test_one_leaked_padding_position_is_caught():
    assert check_pair(small_case("fp32", "MHA", "pad"), LeakedMaskBackend()).verdict == "disagree"


def test_leak_backend_is_right_when_nothing_is_masked():
    """Control: without a mask there is nothing to leak, so the failures above come from the leak alone."""
    assert check_pair(small_case("fp32", "MHA", "none"), LeakedMaskBackend()).verdict == "agree"
    mask = visible_mask(small_case(mask="causal"))
    assert int((leak_one(mask) != mask).sum()) == 1


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_wrong_gqa_grouping_is_caught(dtype, mask, mode):
    assert check_pair(small_case(dtype, "GQA", mask, mode=mode), WrongGqaBackend()).verdict == "disagree"


@pytest.mark.parametrize("kind", ["MHA", "MQA"])
def test_wrong_gqa_grouping_is_harmless_without_groups(kind):
    """Control: with one K/V head, or one query head per K/V head, `repeat` and `repeat_interleave` coincide."""
    assert check_pair(small_case("fp32", kind, "causal"), WrongGqaBackend()).verdict == "agree"


def test_backward_note_names_the_disagreeing_gradients():
    case = small_case("fp32", "GQA", "causal", mode="fwd_bwd")
    result = check_pair(case, WrongGqaBackend())
    assert result.verdict == "disagree" and "disagreeing: dq, dk, dv" in result.reason


def test_a_backend_that_computes_no_attention_is_not_checked_nor_failed():
    class NotAttention(NaiveBackend):
        name = "not-attention"
        computes_attention = False

    result = check_pair(small_case(), NotAttention())
    assert result.verdict == "not checked" and not result.failed


def test_records_carry_the_verdict(registry):
    """The benchmark record of a wrong backend says agree False, an honest one's True, with err and bound."""
    options = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.0, min_rounds=1, max_rounds=1, max_iterations=1))
    case = small_case("fp32", "GQA", "causal")
    wrong, right = execute(case, WrongGqaBackend(), options), execute(case, registry.get("sdpa"), options)
    assert wrong.status == right.status == "ok"
    assert wrong.agree is False and wrong.max_abs_err > wrong.err_bound
    assert right.agree is True and right.max_abs_err <= right.err_bound and right.rel_err is not None


# --- attention weights ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [*MASKS, "window"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_weights_rows_sum_to_one_and_masked_are_exactly_zero(dtype, kind, mask):
    case = small_case(dtype, kind, "none", window=5) if mask == "window" else small_case(dtype, kind, mask, S_q=10)
    out, weights = NaiveBackend().weights(case, make_inputs(case))
    assert weights.shape == (case.B, case.H, case.S_q, case.S_kv)
    assert weights_violations(case, weights) == []
    m = visible_mask(case)
    if m is not None:
        assert bool((weights[~m.expand_as(weights)] == 0).all())
        seen = m.any(-1).expand(case.B, case.H, case.S_q)
        sums = weights.double().sum(-1)
        assert torch.allclose(sums[seen], torch.ones_like(sums[seen]), atol=numerics.EPS[dtype] + case.S_kv * 2**-23)
        assert bool((sums[~seen] == 0).all())
    else:
        assert torch.allclose(weights.double().sum(-1), torch.ones(1, dtype=torch.float64), atol=numerics.EPS[dtype] + case.S_kv * 2**-23)


def test_weight_violations_are_reported():
    case = small_case("fp32", "MHA", "causal")
    inputs = make_inputs(case)
    mask = visible_mask(case)
    _, leaked = naive_attention(inputs.q, inputs.k, inputs.v, leak_one(mask), return_weights=True)
    assert any("masked positions" in p for p in weights_violations(case, leaked))
    _, weights = naive_attention(inputs.q, inputs.k, inputs.v, mask, return_weights=True)
    assert any("do not sum to 1" in p for p in weights_violations(case, weights * 1.01))
    assert any("shape" in p for p in weights_violations(case, weights[:, :1]))


def test_reference_weights_have_the_same_properties():
    case = small_case("fp64", "GQA", "causal-pad")
    inputs = make_inputs(case)
    _, weights = reference_attention(inputs.q, inputs.k, inputs.v, visible_mask(case), 0.25, return_weights=True)
    assert weights_violations(case, weights) == []


# --- the worked example -----------------------------------------------------------------------------------------------


def worked_example() -> tuple[Case, AttentionInputs]:
    """Two heads, one query over two key positions; d_k = 4 so the scale is exactly 1/2.

    Head 1's query (4,0,0,0) against keys e₁, e₂ scores (4·½, 0) = (2, 0); head 2's (0,4,0,0) scores (0, 2).
    Values are 10 and 0 in both heads.
    """
    case = Case(B=1, S_q=1, S_kv=2, H=2, H_kv=2, d_k=4, d_v=1)
    q = torch.tensor([[[[4.0, 0, 0, 0]], [[0, 4.0, 0, 0]]]])
    k = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]).expand(1, 2, 2, 4).contiguous()
    v = torch.tensor([[10.0], [0.0]]).expand(1, 2, 2, 1).contiguous()
    return case, AttentionInputs(q=q, k=k, v=v)


def test_worked_example_through_the_naive_backend():
    case, inputs = worked_example()
    out, weights = NaiveBackend().weights(case, inputs)
    hi, lo = math.exp(2) / (1 + math.exp(2)), 1 / (1 + math.exp(2))
    assert weights[0, :, 0].flatten().tolist() == pytest.approx([hi, lo, lo, hi], abs=1e-6)
    assert [round(w, 3) for w in weights[0, 0, 0].tolist()] == [0.881, 0.119]
    assert [round(w, 3) for w in weights[0, 1, 0].tolist()] == [0.119, 0.881]
    assert out[0, :, 0, 0].tolist() == pytest.approx([10 * hi, 10 * lo], abs=1e-5)
    assert [round(o, 3) for o in out[0, :, 0, 0].tolist()] == [8.808, 1.192]
    assert torch.equal(NaiveBackend().prepare(case, inputs).fn(), out)
    assert check_forward(case, inputs, out).agree


def test_worked_example_through_sdpa_and_the_reference(registry):
    case, inputs = worked_example()
    ref = reference_attention(*(t.double() for t in (inputs.q, inputs.k, inputs.v)), None, 0.5)
    assert ref[0, :, 0, 0].tolist() == pytest.approx([8.808, 1.192], abs=5e-4)
    out = registry.get("sdpa").prepare(case, inputs).fn()
    assert out[0, :, 0, 0].tolist() == pytest.approx([8.808, 1.192], abs=5e-4)


class _EmptyRowsBackend(Backend):
    """Eager attention, then `fill` written into the query rows that see no key (as cuDNN writes a mean of V)."""

    family = "test-wrong"

    def __init__(self, fill: float) -> None:
        self.fill = fill

    def prepare(self, case: Case, inputs) -> Prepared:
        """Eager output with the empty rows overwritten."""
        from harness.suite.inputs import empty_query_rows

        q, k, v = inputs.q, inputs.k, inputs.v
        empty = empty_query_rows(case)[:, None, :, None]

        def fn():
            out = naive_attention(q, k, v, visible_mask(case))
            return torch.where(empty, torch.full_like(out, self.fill), out)

        return Prepared(fn=fn, leaves=(q, k, v))


PADDED = Case(B=2, S_q=64, S_kv=64, H=4, H_kv=2, d_k=32, d_v=32, causal=True, padding=True)


def test_values_in_fully_masked_rows_are_shown_not_judged():
    from harness.suite.inputs import empty_query_rows

    assert bool(empty_query_rows(PADDED).any())  # the seed pads the second sequence
    result = check_pair(PADDED, _EmptyRowsBackend(0.316))
    assert result.verdict == "agree"
    assert result.agreement.masked_rows_max_abs == pytest.approx(0.316, rel=1e-6)
    assert "writes non-zero into fully masked query rows" in result.reason
    honest = check_pair(PADDED, NaiveBackend())
    assert honest.verdict == "agree" and honest.agreement.masked_rows_max_abs == 0 and "fully masked" not in (honest.reason or "")
    unmasked = check_pair(PADDED.replace(padding=False), NaiveBackend())
    assert unmasked.agreement.masked_rows_max_abs is None  # no such rows: nothing to show


def test_nan_in_fully_masked_rows_never_agrees():
    result = check_pair(PADDED, _EmptyRowsBackend(float("nan")))
    assert result.verdict == "disagree" and "NaN/Inf into query rows that see no key" in result.reason


def test_a_masked_rows_value_reaches_the_record():
    record = execute(PADDED, _EmptyRowsBackend(0.25), PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.0, min_rounds=1, max_rounds=1, max_iterations=1)))
    assert record.agree is True and record.masked_rows_max_abs == pytest.approx(0.25)


class _DeviceTensor:
    """Shaped like a CUDA tensor where the cache looks (device, shape, dtype, detach, cpu, to): its contents live on the host."""

    device = torch.device("cuda")

    def __init__(self, host: torch.Tensor) -> None:
        self.host, self.shape, self.dtype = host, host.shape, host.dtype

    def detach(self) -> "_DeviceTensor":
        return self

    def cpu(self) -> torch.Tensor:
        return self.host

    def to(self, device: str, copy: bool = False) -> torch.Tensor:
        assert device == "cpu", "the cache keeps its copies of CUDA inputs in host memory"
        return self.host.clone() if copy else self.host


def test_a_cuda_cases_reference_is_reused_by_its_next_backend_and_recomputed_for_other_inputs():
    from types import SimpleNamespace

    from harness.attention.reference import ReferenceCache

    case = small_case().replace(device="cuda")
    inputs = SimpleNamespace(**{name: _DeviceTensor(torch.randn(2, 3, generator=torch.Generator().manual_seed(i)))
                                for i, name in enumerate(("q", "k", "v"))}, grad_out=None)
    computed = []

    def compute():
        computed.append(len(computed))
        return f"reference {len(computed)}"

    cache = ReferenceCache()
    assert cache.get(("fwd", case), inputs, compute) == "reference 1"
    assert cache.get(("fwd", case), inputs, compute) == "reference 1"  # the next backend of the case: no second float64 pass
    assert computed == [0]
    inputs.k.host[0, 0] += 1.0  # a backend wrote into its inputs on the device
    assert cache.get(("fwd", case), inputs, compute) == "reference 2"
    assert cache.get(("bwd", case), inputs, compute) == "reference 3"  # another key is another reference
