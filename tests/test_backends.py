"""Every backend's answer on this CPU machine, and every CPU-capable one against the float64 reference.

Causal, padding, window and decoding cases in forward; gradients in bwd and fwd_bwd; MLA and the
whole layer on their own cases; the compiled backends (flex, naive-compiled) on a couple of tiny
cases only, since each compile costs seconds. The decode, train and models suites' CPU variants
run end to end on a slice.
"""

import pytest
import torch

from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.execution.execute import PairRunner, execute
from harness.suite.catalog import load_suite
from harness.measure.timing import Budget

REGISTRY = load_registry(plugins=False)
FAST = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.005, min_sample_s=0.0, min_rounds=1, max_rounds=3))
GPU_ONLY = ("xformers", "flash-attn2", "flash-attn3", "flash-attn4", "sdpa-efficient", "sdpa-cudnn")
EAGER = ("naive", "sdpa", "sdpa-math", "sdpa-flash")


def test_every_issue_backend_is_registered():
    names = set(REGISTRY.names())
    assert {"xformers", "flash-attn2", "flash-attn3", "flash-attn4", "flex", "naive-compiled", "mha-layer", "mla"} <= names


def test_each_registry_has_its_own_backend_instances():
    """A backend's state (a probed kernel, a compiled step) set through one registry never shows in another."""
    first, second = load_registry(plugins=False), load_registry(plugins=False)
    assert first.names() == second.names()
    shared = [name for name in first.names() if first.get(name) is second.get(name)]
    assert shared == []


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_backends_are_unavailable_on_cpu_with_a_reason(name):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    reason = REGISTRY.get(name).available()
    assert reason and ("CUDA" in reason or "not installed" in reason)
    record = execute(Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, dtype="bf16"), REGISTRY.get(name), FAST)
    assert record.status == "unsupported" and record.reason == reason


def test_supports_answers_for_every_backend():
    cases = [Case(B=1, S_q=4, S_kv=4, H=2, H_kv=1, d_k=8, d_v=8, dtype=d, mode=m) for d in ("fp32", "bf16", "fp64") for m in ("fwd", "bwd")]
    for backend in REGISTRY:
        for case in cases:
            answer = backend.supports(case)
            assert answer is None or (isinstance(answer, str) and answer.strip()), (backend.name, case.id)


def test_limits_are_said_in_words():
    flash, flex, layer, mla = (REGISTRY.get(n) for n in ("flash-attn2", "flex", "mha-layer", "mla"))
    cuda = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, device="cuda")
    assert "no fp32 kernel (it computes in bf16, fp16)" in flash.supports(cuda)
    assert "256" in flash.supports(cuda.replace(dtype="bf16", d_k=320, d_v=320))
    assert "d_v = d_k" in flash.supports(cuda.replace(dtype="bf16", d_v=8))
    assert "backward on CPU" in flex.supports(cuda.replace(device="cpu", mode="bwd"))
    assert "GQA" in layer.supports(cuda.replace(device="cpu", H_kv=1))
    assert "latent" in mla.supports(cuda.replace(device="cpu"))


def run_ok(name, case):
    record = execute(case, REGISTRY.get(name), FAST)
    assert record.status == "ok", (name, case.id, record.reason)
    assert record.agree is True, (name, case.id, record.max_abs_err, record.err_bound, record.reason)
    return record


MASKED = [
    Case(B=2, S_q=12, S_kv=12, H=4, H_kv=2, d_k=16, d_v=16, causal=True),
    Case(B=2, S_q=5, S_kv=13, H=4, H_kv=1, d_k=16, d_v=16, causal=True),
    Case(B=3, S_q=12, S_kv=12, H=4, H_kv=2, d_k=16, d_v=16, padding=True, seed=3),
    Case(B=3, S_q=12, S_kv=12, H=4, H_kv=4, d_k=16, d_v=16, causal=True, padding=True, seed=1),
    Case(B=2, S_q=12, S_kv=12, H=4, H_kv=2, d_k=16, d_v=16, window=4),
    Case(B=3, S_q=1, S_kv=40, H=4, H_kv=1, d_k=16, d_v=16, padding=True, seed=2),
    Case(B=3, S_q=4, S_kv=40, H=4, H_kv=2, d_k=16, d_v=16, causal=True, padding=True, seed=2, dtype="bf16"),
]


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("case", MASKED, ids=lambda c: c.id)
def test_masks_and_decoding_agree_with_the_reference(name, case):
    run_ok(name, case)


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("case", [MASKED[1], MASKED[3], MASKED[4]], ids=lambda c: c.id)
@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_gradients_agree_with_the_reference(name, case, mode):
    record = run_ok(name, case.replace(mode=mode))
    assert record.flops == pytest.approx({"bwd": 2.5, "fwd_bwd": 3.5}[mode] * execute(case, REGISTRY.get("naive"), FAST).flops)


@pytest.mark.parametrize("case", [
    Case(B=2, S_q=1, S_kv=40, H=8, H_kv=1, d_k=24, d_v=16, mla=True, padding=True),
    Case(B=2, S_q=3, S_kv=40, H=8, H_kv=1, d_k=24, d_v=16, mla=True, causal=True, dtype="bf16"),
], ids=lambda c: c.id)
def test_mla_agrees_and_records_its_latent_cache(case):
    record = run_ok("mla", case)
    assert record.notes["kv_cache_bytes_per_token"] == case.d_k * (2 if case.dtype == "bf16" else 4)
    run_ok("sdpa", case)  # the same problem through an MQA kernel that reads K and V separately


def test_mla_refuses_plain_cases_and_backward():
    mla = REGISTRY.get("mla")
    assert execute(MASKED[0], mla, FAST).status == "unsupported"
    assert execute(Case(B=1, S_q=1, S_kv=8, H=4, H_kv=1, d_k=24, d_v=16, mla=True, mode="bwd"), mla, FAST).status == "unsupported"


@pytest.mark.parametrize("case", [
    Case(B=2, S_q=16, S_kv=16, H=4, H_kv=4, d_k=16, d_v=16, causal=True, padding=True, seed=1),
    Case(B=2, S_q=12, S_kv=12, H=4, H_kv=4, d_k=8, d_v=8, window=3, mode="bwd"),
    Case(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=16, d_v=16, mode="fwd_bwd", dtype="bf16"),
], ids=lambda c: c.id)
def test_mha_layer_agrees_with_its_own_float64_reference(case):
    record = run_ok("mha-layer", case)
    D = case.H * case.d_k
    assert record.flops > 8 * case.B * case.S_q * D * D  # projections included


def test_mha_layer_check_can_fail():
    case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=8, d_v=8, causal=True)
    layer = REGISTRY.get("mha-layer")
    from harness.suite.inputs import make_inputs

    prepared = layer.prepare(case, make_inputs(case))
    out = prepared.fn().detach()
    assert prepared.check(out).agree is True
    wrong = out.clone()
    wrong[0, 3] += 1e-3  # one query row off
    assert prepared.check(wrong).agree is False


@pytest.mark.compile
@pytest.mark.parametrize("name", ["flex", "naive-compiled"])
def test_compiled_backends_agree_and_record_compile_time(name):
    case = Case(B=2, S_q=16, S_kv=16, H=4, H_kv=2, d_k=16, d_v=16, causal=True, padding=True, seed=1)
    record = run_ok(name, case)
    assert record.compile_s is not None and record.compile_s >= 0


CPU_CAPABLE = ("naive", "sdpa", "sdpa-math", "sdpa-flash", "mla", "mha-layer")


@pytest.mark.parametrize("suite", ["decode", "train", "models"])
def test_suites_run_on_cpu_for_every_cpu_capable_backend(suite):
    cases = load_suite(suite).on_device("cpu").cases
    assert cases and all(c.device == "cpu" for c in cases)
    for name in CPU_CAPABLE:
        served = [c for c in cases if REGISTRY.get(name).supports(c) is None]
        for case in served[:2]:
            record = execute(case, REGISTRY.get(name), FAST)
            assert record.status == "ok" and record.agree is not False, (suite, name, case.id, record.reason)


def test_cuda_suites_cover_the_issue_grid():
    decode = load_suite("decode").cases
    assert {c.H_kv for c in decode if c.H == 32} == {32, 8, 1}
    assert {c.B for c in decode} >= {1, 16, 64}
    assert min(c.S_kv for c in decode) == 1024 and max(c.S_kv for c in decode) == 128 * 1024
    train = load_suite("train").cases
    assert {c.mode for c in train} == {"fwd", "bwd", "fwd_bwd"} and all(c.causal and c.dtype == "bf16" for c in train)
    models = load_suite("models")
    assert any(c.mla for c in models.cases) and any(c.window == 4096 for c in models.cases)


def test_model_suite_by_name():
    suite = load_suite("model:llama3-405b:1024,4096")
    assert {(c.H, c.H_kv, c.d_k) for c in suite.cases} == {(128, 8, 128)}
    assert {c.S_kv for c in suite.cases} == {1024, 4096}
    # Lengths asked for by name run on the CPU too (in fp32); without them the CPU runs its short default.
    assert {c.S_kv for c in suite.on_device("cpu").cases} == {1024, 4096}
    assert all(c.S_kv == 128 for c in load_suite("model:llama3-405b").on_device("cpu").cases)


def test_gpu_check_says_no_cuda_and_exits_2(capsys):
    from harness.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert main(["gpu-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]


@pytest.mark.slow
def test_gpu_check_on_cpu_prints_its_table_last(capsys):
    from harness.cli.main import main

    assert main(["gpu-check", "--cpu", "--backends", "naive,xformers"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].startswith("backend") and lines[-2].startswith("naive") and lines[-1].startswith("xformers")
    from harness.checks.gpu import cases_for

    ok, agree, unsupported, failed = lines[-2].split()[1:5]
    # Every check case but the FP8 one (naive has no FP8 kernel) ran and agrees.
    assert (int(ok), int(agree), int(unsupported), int(failed)) == (len(cases_for("naive", "cpu")) - 1,) * 2 + (1, 0), lines[-2]
