"""The naive backend and every SDPA kernel available here agree with the float64 reference, MHA, GQA and MQA."""

import pytest
import torch

from harness.attention.eager import naive_attention
from harness.attention.numerics import check_forward
from harness.backends.base import expand_kv
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.registry import Registry, load_registry
from harness.errors import Unsupported, UserError
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs

REGISTRY = load_registry()
CORE = ["naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"]


def test_registry_lists_every_core_backend_with_availability():
    rows = {r.name: r for r in REGISTRY.describe()}
    assert set(CORE) <= set(rows)
    for name in ("naive", "sdpa", "sdpa-math", "sdpa-flash"):
        assert rows[name].available, rows[name].reason
    if not torch.cuda.is_available():
        for name in ("sdpa-efficient", "sdpa-cudnn"):
            assert not rows[name].available
            assert "CUDA" in rows[name].reason


def test_unsupported_reasons_are_sentences_for_cpu_cases():
    case = Case(B=1, S_q=64, S_kv=64, H=4, H_kv=4, d_k=32, d_v=32)
    for name in ("sdpa-efficient", "sdpa-cudnn"):
        reason = REGISTRY.get(name).supports(case)
        assert reason and "CPU" in reason


def test_registry_rejects_duplicates_and_unknown_names():
    registry = Registry()
    registry.add(REGISTRY.get("naive"))
    with pytest.raises(ValueError, match="registered twice"):
        registry.add(REGISTRY.get("naive"))
    with pytest.raises(UserError, match="unknown backend 'nope'"):
        registry.get("nope")


CASES = [
    Case(B=2, S_q=96, S_kv=96, H=8, H_kv=8, d_k=32, d_v=32),
    Case(B=2, S_q=96, S_kv=96, H=8, H_kv=2, d_k=32, d_v=32, causal=True),
    Case(B=1, S_q=33, S_kv=130, H=8, H_kv=1, d_k=64, d_v=64, causal=True),
    Case(B=2, S_q=64, S_kv=64, H=6, H_kv=3, d_k=16, d_v=16, dtype="bf16"),
    Case(B=3, S_q=80, S_kv=80, H=4, H_kv=1, d_k=32, d_v=32, dtype="fp16", causal=True, padding=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("name", ["naive", "sdpa", "sdpa-math", "sdpa-flash"])
def test_cpu_backends_agree_with_float64(case, name):
    backend = REGISTRY.get(name)
    inputs = make_inputs(case)
    try:
        prepared = backend.prepare(case, inputs)
    except Unsupported as exc:  # a kernel may refuse a dtype on CPU; that must be said, not hidden
        assert str(exc)
        return
    with torch.no_grad():
        out = prepared.to_bhsd(prepared.fn())
    assert out.shape == (case.B, case.H, case.S_q, case.d_v)
    agreement = check_forward(case, inputs, out)
    assert agreement.agree, agreement


def test_gqa_is_native_in_naive_and_matches_explicit_expansion():
    case = Case(B=1, S_q=40, S_kv=40, H=8, H_kv=2, d_k=16, d_v=16)
    x = make_inputs(case)
    grouped = naive_attention(x.q, x.k, x.v)
    expanded = naive_attention(x.q, expand_kv(x.k, 4), expand_kv(x.v, 4))
    torch.testing.assert_close(grouped, expanded)
    # Query head 5 reads K/V head 5 // 4 = 1, which `repeat` (instead of repeat_interleave) would get wrong.
    wrong = naive_attention(x.q, x.k.repeat(1, 4, 1, 1), x.v.repeat(1, 4, 1, 1))
    assert not torch.allclose(wrong, grouped)


def test_sdpa_records_whether_it_expanded_kv():
    case = Case(B=1, S_q=32, S_kv=32, H=8, H_kv=2, d_k=16, d_v=16)
    prepared = REGISTRY.get("sdpa-math").prepare(case, make_inputs(case))
    assert prepared.notes["kv_expanded"] is False  # enable_gqa serves it natively in torch ≥ 2.5


def test_projections_refuse_mla_cases():
    """H·d_k of an absorbed-MLA case (128 × 576) is no model's width: 4 weights of 73728² would be 87 GB."""
    mla = Case(B=1, S_q=1, S_kv=128, H=128, H_kv=1, d_k=576, d_v=512, mla=True)
    reason = REGISTRY.get("projections").supports(mla)
    assert reason and "MLA" in reason
    assert REGISTRY.get("projections").supports(mla.replace(mla=False, d_k=64, d_v=64, H_kv=128)) is None


class _ScalesQueriesInPlace(NaiveBackend):
    """Correct on its first call, then it has scaled q in place: later calls time other inputs."""

    name = "test-inplace"

    def prepare(self, case, inputs):
        prepared = super().prepare(case, inputs)
        inner = prepared.fn

        def fn():
            out = inner()
            inputs.q.mul_(1.5)
            return out

        prepared.fn = fn
        return prepared


def test_a_backend_that_writes_into_its_inputs_never_agrees():
    from harness.execution.execute import execute

    case = Case(B=1, S_q=32, S_kv=32, H=4, H_kv=4, d_k=16, d_v=16)
    record = execute(case, _ScalesQueriesInPlace())
    assert record.status == "ok"
    assert record.agree is False
    assert "modified its inputs in place (q)" in record.reason
    assert execute(case, REGISTRY.get("naive")).agree is True


def test_a_runner_shares_a_cases_inputs_across_backends_until_one_writes_into_them():
    from harness.execution.execute import PairRunner, execute
    from harness.measure.timing import Budget

    runner = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.001, min_rounds=1, max_rounds=2))
    case = Case(B=1, S_q=32, S_kv=32, H=4, H_kv=4, d_k=16, d_v=16)
    first, _ = runner.inputs.get(case)
    assert execute(case, REGISTRY.get("naive"), runner).agree is True
    shared = runner.inputs.get(case)[0]
    assert shared is not first and shared.q is first.q  # the same tensors for the next backend of the case, in a copy of its own
    # A backend that writes into the shared inputs disagrees, and the next backend gets fresh, correct ones.
    assert execute(case, _ScalesQueriesInPlace(), runner).agree is False
    again, _ = runner.inputs.get(case)
    assert again.q is not first.q and torch.equal(again.q, make_inputs(case).q)
    assert execute(case, REGISTRY.get("sdpa"), runner).agree is True
    other = case.replace(S_q=64, S_kv=64)
    assert runner.inputs.get(other)[0].q.shape[2] == 64  # another case: drawn for it


class _WrongAfterItsFirstCall(NaiveBackend):
    """Right on its first call, then off by 1 %: what an autotuner switching kernels after warm-up would look like."""

    name = "test-wrong-later"

    def prepare(self, case, inputs):
        prepared = super().prepare(case, inputs)
        inner, calls = prepared.fn, []

        def fn():
            calls.append(1)
            out = inner()
            return out if len(calls) == 1 else out * 1.01

        prepared.fn = fn
        return prepared


def test_the_output_checked_is_the_timed_kernels_not_the_first_calls():
    from dataclasses import replace

    from harness.execution.execute import PairRunner, execute
    from harness.measure.timing import QUICK_BUDGET

    case = Case(B=1, S_q=32, S_kv=32, H=4, H_kv=4, d_k=16, d_v=16)
    # Six samples whatever a call costs: a busy machine can make one call dearer than the budget, never fewer calls here.
    runner = PairRunner(budget=replace(QUICK_BUDGET, fewest_rounds=None))
    record = execute(case, _WrongAfterItsFirstCall(), runner)
    assert record.status == "ok" and record.samples >= 6
    assert record.agree is False and record.max_abs_err > record.err_bound


@pytest.mark.parametrize("name", ["sdpa", "sdpa-math"])
def test_kernels_torch_never_refuses_are_prepared_without_a_call(name, monkeypatch):
    import torch.nn.functional as F

    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    case = Case(B=1, S_q=32, S_kv=32, H=4, H_kv=2, d_k=16, d_v=16, causal=True)
    backend = REGISTRY.get(name)
    prepared = backend.prepare(case, make_inputs(case))
    assert calls == [] and prepared.notes["kv_expanded"] is False  # enable_gqa, unprobed
    prepared.fn()
    assert calls == [1]
    flash = REGISTRY.get("sdpa-flash")
    flash.prepare(case, make_inputs(case))
    assert calls == [1, 1]  # a kernel that may refuse is probed once
