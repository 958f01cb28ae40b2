"""Training-shaped batches backward: packed and padded documents, each request's dQ, dK, dV against its own float64 reference.

The CPU backends run for real (naive, sdpa, sdpa-math); FlashAttention's and xFormers' backward are held to their
libraries' sources (their varlen autograd Functions define a backward; xFormers' cutlass backward takes both
block-diagonal biases) and their adapters' leaves are checked through a differentiable stand-in of the kernel.
"""

from __future__ import annotations

import ast
import sys
import types

import pytest
import torch

from harness.attention import theory
from harness.attention.ragged_backward import ragged_gradient_slices
from harness.backends.flashattention.adapter import FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.registry import load_registry
from harness.checks.correctness import check_pair
from harness.execution.execute import build_step
from harness.execution.verdict import check_result
from harness.suite.batch_axes import ragged_case
from harness.suite.ragged import make_ragged_inputs
from tests import wrong_ragged_gradients as wg
from tests.flash_attn_sources import source
from tests.library_contracts import flash_emulator
from tests.xformers_real import real_fmha

#: Documents of a packed pretraining sequence: long and short side by side, one very short.
DOCUMENTS = "1x40 + 1x9 + 1x33 + 1x3"


def _case(layout: str, mode: str, dtype: str = "fp32", H_kv: int = 2, causal: bool = True, **fields):
    return ragged_case(DOCUMENTS, layout, H=4, H_kv=H_kv, d_k=16, dtype=dtype, causal=causal, mode=mode, **fields)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "sdpa-math"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("H_kv", [4, 2], ids=["MHA", "GQA"])
def test_the_cpu_backends_agree_on_every_request_of_a_training_batch(backend, layout, mode, dtype, H_kv, one_thread):
    result = check_pair(_case(layout, mode, dtype, H_kv), load_registry().get(backend))
    assert result.verdict == "agree", result


def test_every_request_gets_a_slice_before_any_gets_a_second(monkeypatch):
    import harness.attention.ragged_backward as rb

    case = _case("packed", "bwd")
    assert len(ragged_gradient_slices(case)) == 4 * 2  # under the budget: every (request, K/V head)
    # A budget of one long document's slice and a bit: every request is still covered once, the rest sampled.
    monkeypatch.setattr(rb, "MAX_REFERENCE_SCORES", 2 * 40 * 40 + 2 * (9 * 9 + 33 * 33 + 3 * 3))
    picked = ragged_gradient_slices(case)
    assert {i for i, _ in picked} == {0, 1, 2, 3} and len(picked) < 8


def test_a_gradient_wrong_for_one_short_document_is_caught_and_named(one_thread):
    case = _case("packed", "fwd_bwd")
    wrong = check_pair(case, wg.WrongDkOfOneShortDocument())
    assert wrong.verdict == "disagree"
    assert "request 3" in wrong.reason and "dk" in wrong.reason and "dq" not in wrong.reason and "dv" not in wrong.reason
    assert check_pair(case, NaiveBackend()).verdict == "agree"  # the same batch, honestly differentiated


def test_padding_rows_gradients_are_shown_never_judged_and_nan_there_never_agrees(one_thread):
    case = _case("padded", "bwd")
    honest = check_pair(case, NaiveBackend())
    assert honest.verdict == "agree" and honest.agreement.masked_rows_max_abs == 0.0
    written = check_pair(case, wg.WritesIntoPadding())
    assert written.verdict == "agree" and written.agreement.masked_rows_max_abs == 7.0
    assert "padding rows" in written.reason
    poisoned = check_pair(case, wg.WritesNanIntoPadding())
    assert poisoned.verdict == "disagree" and "NaN" in poisoned.reason


def test_what_has_no_ragged_backward_says_why():
    paged = _case("paged", "bwd", page_size=8)
    assert "paged KV cache" in check_pair(paged, NaiveBackend()).reason
    flex = check_pair(_case("packed", "bwd"), load_registry().get("flex"))
    assert flex.verdict == "unsupported" and "CPU" in flex.reason

    class ForwardOnly(NaiveBackend):
        name = "forward-only-ragged"
        ragged_backward = frozenset()

    reason = ForwardOnly().supports(_case("padded", "fwd_bwd"))
    assert reason == "forward-only-ragged's adapter does not differentiate padded batches (its padded batches are forward only)"


@pytest.mark.parametrize("mode, factor", [("bwd", 2.5), ("fwd_bwd", 3.5)])
def test_flops_are_the_forwards_times_the_modes_factor_on_real_tokens_in_either_layout(mode, factor):
    forward = theory.flops(_case("packed", "fwd"))
    assert theory.flops(_case("packed", mode)) == theory.flops(_case("padded", mode)) == round(forward * factor)


# -- FlashAttention and xFormers: their libraries' own code --


def _autograd_class_of(text: str, function: str) -> ast.ClassDef:
    """The autograd Function class whose `.apply` the library's `function` returns."""
    tree = ast.parse(text)
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    applied = {node.func.value.id for node in ast.walk(body) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "apply" and isinstance(node.func.value, ast.Name)}
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in applied]
    assert len(classes) == 1, (function, applied)
    return classes[0]


@pytest.mark.parametrize("generation", [2, 3, 4])
def test_flash_attn_varlen_func_is_differentiable_in_the_real_library(generation):
    cls = _autograd_class_of(source(generation), "flash_attn_varlen_func")
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert {"forward", "backward"} <= methods, (cls.name, methods)


def test_xformers_cutlass_backward_takes_both_block_diagonal_biases():
    fmha = real_fmha()
    from xformers.ops.fmha import cutlass  # imported by fmha itself: real_fmha has loaded it

    supported = set(cutlass.BwOp.SUPPORTED_ATTN_BIAS_TYPES)
    assert {fmha.attn_bias.BlockDiagonalMask, fmha.attn_bias.BlockDiagonalCausalFromBottomRightMask} <= supported


@pytest.mark.parametrize("backend_cls", [FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend])
def test_flash_packed_backward_differentiates_the_packed_inputs(monkeypatch, backend_cls):
    """The adapter's leaves are the packed rows: through a differentiable stand-in kernel, every request's gradients agree."""
    fake = types.ModuleType(backend_cls.module)
    fake.flash_attn_varlen_func = lambda *args, **kwargs: flash_emulator("flash_attn_varlen_func", args, kwargs).float()
    monkeypatch.setitem(sys.modules, backend_cls.module, fake)
    case = _case("packed", "fwd_bwd", causal=True).replace(device="cpu")
    inputs = make_ragged_inputs(case)
    for t in (inputs.q, inputs.k, inputs.v):
        t.requires_grad_(True)
    prepared = backend_cls().prepare(case, inputs)
    assert prepared.leaves == (inputs.q, inputs.k, inputs.v)
    agreement = check_result(case, prepared, inputs, build_step(case, prepared, inputs)())
    assert agreement.agree, agreement


def test_xformers_packed_backward_differentiates_the_packed_inputs(monkeypatch):
    """xFormers' leaves are the packed rows lifted to one sequence per call: every request's gradients agree through a stand-in."""
    from types import SimpleNamespace

    import harness.backends.xformers.adapter as xf
    from tests.library_contracts import xformers_emulator

    fmha = real_fmha()

    class FakeOp:
        NAME = "fake"

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None, op=None):
        return xformers_emulator(SimpleNamespace(q=q, k=k, v=v, attn_bias=attn_bias, scale=scale, view=lambda *t: t)).to(q.dtype)

    monkeypatch.setattr(xf, "import_xformers", lambda: (SimpleNamespace(memory_efficient_attention=memory_efficient_attention), None))
    monkeypatch.setattr(fmha.dispatch, "_dispatch_fw", lambda inp, needs_gradient: FakeOp)
    monkeypatch.setattr(fmha.dispatch, "_dispatch_bw", lambda inp, varlen_lse_packed: FakeOp)
    case = _case("packed", "bwd", H_kv=4)
    inputs = make_ragged_inputs(case)
    for t in (inputs.q, inputs.k, inputs.v):
        t.requires_grad_(True)
    prepared = xf.XformersBackend().prepare(case, inputs)
    assert prepared.leaves == (inputs.q, inputs.k, inputs.v) and prepared.notes["attn_bias"] == "BlockDiagonalCausalFromBottomRightMask"
    agreement = check_result(case, prepared, inputs, build_step(case, prepared, inputs)())
    assert agreement.agree, agreement


@pytest.mark.compile
def test_check_of_the_train_suite_on_the_cpu_agrees_on_its_packed_and_padded_documents(one_thread, capsys):
    from harness.cli.main import main

    assert main(["check", "--suite", "train", "--backends", "naive,sdpa,sdpa-math,flex", "--only", "longtail", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert {(r["dtype"], r["mode"]) for r in rows} == {(d, m) for d in ("fp32", "bf16") for m in ("bwd", "fwd_bwd")}
    verdicts = {(r["backend"], r["verdict"]) for r in rows}
    assert verdicts == {("naive", "agree"), ("sdpa", "agree"), ("sdpa-math", "agree"), ("flex", "unsupported")}, verdicts
    assert any("packed" in r["case_id"] for r in rows) and any("padded" in r["case_id"] for r in rows)


@pytest.mark.parametrize("variant", [{"softcap": 30.0}, {"sinks": True}, {"alibi": True}, {"scale": 0.0625}], ids=str)
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_naive_differentiates_each_score_variant_over_a_training_batch(variant, layout, one_thread):
    assert check_pair(_case(layout, "fwd_bwd", **variant), NaiveBackend()).verdict == "agree"
