"""The check's guard on inputs (issue 19): any change to an input is caught, `check` calls twice, a wrong output dtype disagrees.

Table-driven over the wrong backends of tests/wrong_backends.py (GUARD_BACKENDS): five that change an
input in a way a sum and an absolute sum cannot see, three right only on their first call, two
that answer in another dtype. Each is run through `run_pair` as `attnbench check` runs it, through a
timed run sharing its inputs with the next backend, and through the `attnbench check` command.
"""

from __future__ import annotations

import pytest
import torch

from harness.backends.registry import load_registry
from harness.cli.main import main
from harness.execution.execute import CHECK_ONLY, PairRunner, Phases, run_pair
from harness.attention.reference import ReferenceCache
from harness.execution.shared_inputs import InputsCache, KeptInputs
from harness.measure.timing import Budget
from harness.results.record import Status
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from tests import wrong_backends as wb

pytestmark = pytest.mark.usefixtures("one_thread")

FP32 = Case(B=1, S_q=16, S_kv=16, H=4, H_kv=2, d_k=16, d_v=16, dtype="fp32")
CAUSAL = FP32.replace(causal=True)
BWD = FP32.replace(mode="fwd_bwd")
BF16 = FP32.replace(dtype="bf16")
FP16 = FP32.replace(dtype="fp16")

#: (backend, case, what the reason must say)
WRONG = [
    (wb.ReversesQueriesInPlace, FP32, "modified its inputs in place (q)"),
    (wb.ReversesQueriesInPlace, BWD, "modified its inputs in place (q)"),
    (wb.SwapsKeyHeadsInPlace, FP32, "modified its inputs in place (k)"),
    (wb.RollsValuesInPlace, CAUSAL, "modified its inputs in place (v)"),
    (wb.SwapsTwoQueryElements, FP32, "modified its inputs in place (q)"),
    (wb.PermutesUpstreamGradient, BWD, "modified its inputs in place (grad_out)"),
    (wb.RightOnFirstCallOnly, FP32, "second of two calls"),
    (wb.AccumulatesIntoItsBuffer, FP32, "second of two calls"),
    (wb.LeaksMaskAfterFirstCall, CAUSAL, "second of two calls"),
    (wb.UpcastsToFloat32, BF16, "output dtype float32, expected the case's bfloat16"),
    (wb.UpcastsToFloat32, FP16, "output dtype float32, expected the case's float16"),
    (wb.AnswersFp16ForBf16, BF16, "output dtype float16, expected the case's bfloat16"),
    (wb.UpcastsToFloat32, FP32, "output dtype float64, expected the case's float32"),
]
IDS = [f"{cls.name}-{case.id}" for cls, case, _ in WRONG]


@pytest.mark.parametrize("cls, case, reason", WRONG, ids=IDS)
def test_check_only_run_flags_each_wrong_backend(cls, case, reason):
    outcome = run_pair(case, cls(), CHECK_ONLY, references=ReferenceCache(), inputs=InputsCache())
    assert outcome.status is Status.OK
    assert outcome.agreement.agree is False, outcome.reason
    assert reason in outcome.reason


INPUT_WRITERS = [row for row in WRONG if "modified its inputs" in row[2]]


@pytest.mark.parametrize("cls, case, reason", INPUT_WRITERS, ids=[f"{c.name}-{k.id}" for c, k, _ in INPUT_WRITERS])
def test_a_timed_run_flags_an_input_writer_and_the_next_backend_gets_the_inputs_as_drawn(cls, case, reason):
    runner = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.001, min_rounds=1, max_rounds=2), phases=Phases(memory=False))
    naive = load_registry(plugins=False).get("naive")
    assert runner.run(case, naive).agreement.agree is True
    writer = runner.run(case, cls())
    assert writer.agreement.agree is False and reason in writer.reason
    after, _ = runner.inputs.get(case)
    drawn = make_inputs(case)
    assert all(torch.equal(getattr(after, n).detach(), getattr(drawn, n)) for n in ("q", "k", "v"))
    assert runner.run(case, naive).agreement.agree is True


@pytest.mark.parametrize("change", [
    lambda t: t.flip(2), lambda t: t.flip(1), lambda t: t.roll(1, dims=3), lambda t: t.neg(),
    lambda t: torch.where(t == t.flatten()[5], torch.nextafter(t, torch.full_like(t, 9.0)), t),
], ids=["reverse-S", "reverse-heads", "roll-d", "negate", "one-ulp"])
def test_the_kept_copy_sees_changes_a_sum_cannot(change):
    inputs = make_inputs(FP32)
    kept = KeptInputs.of(inputs)
    assert kept.changed(inputs) == []
    inputs.k.copy_(change(inputs.k.clone()))
    assert kept.changed(inputs) == ["k"]


def test_honest_backends_still_agree_on_both_calls():
    registry = load_registry(plugins=False)
    for name in ("naive", "sdpa", "sdpa-math"):
        for case in (FP32, CAUSAL, BWD, BF16):
            outcome = run_pair(case, registry.get(name), CHECK_ONLY, references=ReferenceCache(), inputs=InputsCache())
            assert outcome.agreement.agree is True, (name, case.id, outcome.reason)


SUITE = """
name = "guard"
device = "cpu"
[[grid]]
B = [1]
S = [16]
H = [4]
H_kv = [2]
d_k = [16]
dtype = ["fp32", "bf16"]
causal = [false, true]
mode = ["fwd", "fwd_bwd"]
"""


def test_the_check_command_exits_1_naming_every_wrong_backend(tmp_path, monkeypatch, capsys):
    suite = tmp_path / "guard.toml"
    suite.write_text(SUITE)
    monkeypatch.setenv("ATTNBENCH_BACKENDS", "tests.wrong_backends:add_guarded")
    names = [cls.name for cls in wb.GUARD_BACKENDS]
    assert main(["check", "--suite", str(suite), "--backends", ",".join(names)]) == 1
    out = capsys.readouterr().out
    failed = {line.split("[")[1].split("]")[0] for line in out.splitlines() if line.startswith("FAILED")}
    assert failed == set(names), out


FP8 = Case(B=1, S_q=32, S_kv=32, H=2, H_kv=2, d_k=32, d_v=32, dtype="fp8_e4m3", causal=True)


@pytest.mark.parametrize("writer", wb.fp8_descale_writers(), ids=lambda c: c.name)
def test_a_backend_writing_an_fp8_descale_is_flagged_and_the_next_honest_one_is_not_blamed(writer):
    """The descales dict was kept by reference, so a write into it compared with itself; the honest eager-fp8 after it
    then read the doubled scale and was judged against a reference cached from q, k, v alone (issue 45, 6 of 6 FP8 cases)."""
    runner = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.001, min_rounds=1, max_rounds=2), phases=Phases(memory=False))
    honest = load_registry(plugins=False).get("eager-fp8")
    assert runner.run(FP8, honest).agreement.agree is True
    wrong = runner.run(FP8, writer())
    assert wrong.agreement.agree is False and f"modified its inputs in place (descales.{writer.descale})" in wrong.reason, wrong.reason
    after, _ = runner.inputs.get(FP8)
    drawn = make_inputs(FP8)
    assert all(torch.equal(after.descales[n], drawn.descales[n]) for n in ("q", "k", "v"))
    assert runner.run(FP8, honest).agreement.agree is True


def test_a_backend_writing_the_sinks_is_flagged():
    case = FP32.replace(sinks=True)
    outcome = run_pair(case, wb.ShiftsSinksInPlace(), CHECK_ONLY, references=ReferenceCache(), inputs=InputsCache())
    assert outcome.agreement.agree is False and "modified its inputs in place (sinks)" in outcome.reason


def test_the_cached_reference_is_keyed_on_everything_it_reads():
    """A descale or the sinks changed in place (the tensors q, k, v unchanged) is a new reference, never the cached one."""
    cache, computed = ReferenceCache(), []

    def compute():
        computed.append(1)
        return len(computed)

    fp8 = make_inputs(FP8)
    assert cache.get(("fwd",), fp8, compute) == 1 and cache.get(("fwd",), fp8, compute) == 1
    fp8.descales["k"].mul_(2.0)
    assert cache.get(("fwd",), fp8, compute) == 2
    fp8.descales["v"] = fp8.descales["v"] * 2.0
    assert cache.get(("fwd",), fp8, compute) == 3
    sinks = make_inputs(FP32.replace(sinks=True))
    assert cache.get(("fwd",), sinks, compute) == 4
    with torch.no_grad():
        sinks.sinks.add_(1.0)
    assert cache.get(("fwd",), sinks, compute) == 5 and cache.get(("fwd",), sinks, compute) == 5
