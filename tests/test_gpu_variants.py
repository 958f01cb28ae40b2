"""The GPU adapters' score variants against the real libraries: what prepare passes binds to the real signature, the rest is refused.

FlashAttention 2/3 from flash-attn 2.8.3's sdist and FA4 from flash-attn-4's installed source (tests.flash_attn_sources'
`real_signature`), FlashInfer's installed wrappers read with ast (tests.flashinfer_sources' `bind`), xFormers imported on
the CPU (tests.xformers_fixtures' stand-in operators). No kernel runs: the GPU paths stay unverified until gpu-check.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
import types
from pathlib import Path
from typing import Optional

import pytest
import torch

import harness.backends.flashattention.adapter as fa
import harness.backends.flashinfer.adapter as fi
from harness.attention.variants import alibi_slopes
from harness.backends.flashattention.rules import SCORE_VARIANTS
from harness.backends.xformers.adapter import MAX_HEAD_DIM
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from tests.flash_attn_sources import BACKENDS, fa4_text, real_signature
from tests.flashinfer_sources import SOURCE, bind, needs_source, prepared_calls
from tests.ragged_fixtures import ragged_batch, serving_case
from tests.real_signatures import function_from_source
from tests.xformers_fixtures import Bound, xf  # noqa: F401 - the fixture

VARIANT_FIELDS = {"softcap": {"softcap": 30.0}, "alibi": {"alibi": True, "causal": True}, "sinks": {"sinks": True}, "scale": {"scale": 0.3}}
#: The keyword each variant reaches FlashAttention through.
FLASH_KEYWORD = {2: {"softcap": "softcap", "alibi": "alibi_slopes"}, 3: {"softcap": "softcap"},
                 4: {"softcap": "softcap", "sinks": "learnable_sink"}}


def dense(variant: str, **fields) -> Case:
    """A small dense fp32 case using one variant."""
    return Case(**{"B": 2, "S_q": 5, "S_kv": 7, "H": 4, "H_kv": 2, "d_k": 16, "d_v": 16, **VARIANT_FIELDS[variant], **fields})


def on_cuda(case: Case) -> Case:
    """The case as `supports` is asked it on a GPU box."""
    return case.replace(device="cuda", dtype="bf16", d_k=64, d_v=64)


def _flash_library(generation: int, calls: list):
    """A stand-in FlashAttention module: every call bound to the real signature and recorded, the output zeros."""
    def function(name):
        signature = real_signature(generation, name)

        def call(*args, **kwargs):
            calls.append(signature.bind(*args, **kwargs).arguments)  # a TypeError: a call the library would not take
            q, v = args[0], args[2]
            return torch.zeros(*q.shape[:-1], v.shape[-1]), None
        return call
    names = ["flash_attn_func", "flash_attn_varlen_func"] + (["flash_attn_with_kvcache"] if generation != 4 else [])
    return types.SimpleNamespace(**{n: function(n) for n in names})


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("variant", ["softcap", "alibi", "sinks", "scale"])
@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_flash_attention_passes_each_variant_it_declares_as_its_real_keyword(monkeypatch, generation, variant, layout):
    if variant not in SCORE_VARIANTS[generation]:
        pytest.skip(f"FA{generation} has no {variant}")
    case = dense(variant)
    calls: list = []
    backend = BACKENDS[generation]()
    monkeypatch.setattr(backend, "_import", lambda: _flash_library(generation, calls))
    if layout == "dense":
        inputs = make_inputs(case)
    else:
        case = serving_case(layout="packed", H=4, H_kv=2, **VARIANT_FIELDS[variant])
        inputs = ragged_batch([3, 1], [5, 4], H=4, H_kv=2, causal=True, seed=2)
        inputs.sinks = torch.randn(4) if case.sinks else None
    backend.prepare(case, inputs)
    arguments = calls[0]
    assert arguments["softmax_scale"] == pytest.approx(case.softmax_scale)
    keyword = FLASH_KEYWORD[generation].get(variant)
    if variant == "softcap":
        assert arguments[keyword] == 30.0
    if variant == "alibi":  # (nheads,), fp32: Press et al.'s slopes
        assert arguments[keyword].dtype == torch.float32 and torch.equal(arguments[keyword], alibi_slopes(case.H))
    if variant == "sinks":  # (num_head,), a dtype it takes (fp16/bf16/fp32)
        assert arguments[keyword].shape == (case.H,) and arguments[keyword].dtype == torch.float32
        assert torch.equal(arguments[keyword], inputs.sinks)


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("variant", ["softcap", "alibi", "sinks"])
def test_flash_attention_refuses_a_variant_its_interface_has_no_parameter_for(generation, variant):
    parameters = set(real_signature(generation, "flash_attn_func").parameters)
    has = variant in SCORE_VARIANTS[generation]
    # The declaration is the signature's: a parameter for each declared variant, none for the others.
    named = {"softcap": {"softcap"}, "alibi": {"alibi_slopes"}, "sinks": {p for p in parameters if "sink" in p}}[variant]
    assert bool(named & parameters) == has, (generation, variant, sorted(parameters))
    reason = BACKENDS[generation]().supports(on_cuda(dense(variant)))
    if has:
        assert reason is None or variant not in reason
    else:
        assert reason and f"does not support {variant}" in reason


@pytest.mark.parametrize("major, mode, variant, words", [
    (8, "fwd", "sinks", "Learnable sink is not supported in this kernel"), (12, "fwd", "sinks", "Learnable sink"),
    (12, "bwd", "softcap", "score_mod backward not supported on SM 12.0"),
])
def test_fa4_refuses_a_variant_on_the_gpus_its_kernels_lack_it(monkeypatch, major, mode, variant, words):
    monkeypatch.setattr(fa, "cuda_capability", lambda: (major, 0))
    case = on_cuda(dense(variant, mode=mode))
    assert words in fa.FlashAttn4Backend().supports(case)
    monkeypatch.setattr(fa, "cuda_capability", lambda: (9, 0))
    assert fa.FlashAttn4Backend().supports(case) is None


def test_fa4_words_for_those_gpus_are_its_own():
    import importlib.util

    text = fa4_text()
    spec = importlib.util.find_spec("flash_attn.cute")
    if spec is None:
        pytest.skip("flash-attn-4 is not installed: its kernel sources are not here")
    kernels = Path(spec.submodule_search_locations[0])
    assert "Learnable sink is not supported in this kernel" in (kernels / "flash_fwd.py").read_text()
    assert "score_mod backward not supported on SM 12.0" in text and "SM100 backward with head_dim=256 does not support learnable_sink" in text
    assert "class FlashAttentionForwardSm120(FlashAttentionForwardSm80)" in (kernels / "flash_fwd_sm120.py").read_text()


# -- FlashInfer --


@needs_source
@pytest.mark.parametrize("variant", ["softcap", "alibi", "scale"])
@pytest.mark.parametrize("shape", ["prefill", "decode"])
def test_flashinfer_plans_each_variant_with_the_real_plan_arguments(monkeypatch, variant, shape):
    case = dense(variant, **({"S_q": 1, "S_kv": 32} if shape == "decode" else {}))
    log, _ = prepared_calls(monkeypatch, case, make_inputs(case))
    (wrapper, _, _, _), (_, _, args, plan) = log[0], log[1]
    assert wrapper == (fi.PAGED_DECODE if shape == "decode" else fi.RAGGED_PREFILL)
    bind(wrapper, "plan", args, plan)  # a TypeError: a keyword plan() does not take
    assert plan["sm_scale"] == pytest.approx(case.softmax_scale)
    assert plan.get("logits_soft_cap") == case.softcap and (plan.get("pos_encoding_mode") == "ALIBI") == case.alibi


@needs_source
def test_flashinfer_alibi_slopes_are_the_harness_ones():
    get = function_from_source((SOURCE / "utils.py").read_text(), "get_alibi_slopes", {"math": math, "torch": torch, "Optional": Optional})
    for H in (1, 4, 6, 12, 32, 40):
        assert torch.allclose(get(H), alibi_slopes(H), rtol=1e-6, atol=0), H


@needs_source
def test_flashinfer_refuses_sinks_and_a_non_causal_alibi_it_would_compute_otherwise():
    backend = fi.FlashinferBackend()
    assert "does not support sinks" in backend.supports(on_cuda(dense("sinks")))
    assert "class BatchAttentionWithAttentionSinkWrapper" in (SOURCE / "attention" / "_core.py").read_text()
    assert "non-causal" in backend.supports(on_cuda(dense("alibi", causal=False)))
    assert backend.supports(on_cuda(dense("alibi", causal=False, S_q=1))) is None  # one query sees no later key
    variants = (SOURCE / "data" / "include" / "flashinfer" / "attention" / "variants.cuh").read_text()
    assert "params.maybe_alibi_slopes[qo_head_idx] * float(int(kv_idx) - int(qo_idx))" in variants  # linear, not |·|


# -- xFormers --


def test_xformers_passes_the_case_scale_and_refuses_the_variants_it_lacks(xf, monkeypatch):  # noqa: F811
    calls: dict = {}
    xops = sys.modules["xformers.ops"]
    monkeypatch.setattr(xf.adapter, "import_xformers", lambda: (Bound(xops, "xops", calls), None))
    case = dense("scale")
    xf.adapter.XformersBackend().prepare(case, make_inputs(case))
    assert calls["xops.memory_efficient_attention"].arguments["scale"] == 0.3
    parameters = set(inspect.signature(xops.memory_efficient_attention).parameters)
    assert not {p for p in parameters if re.search("softcap|soft_cap|alibi|sink", p)}
    for variant in ("softcap", "alibi", "sinks"):
        assert f"does not support {variant}" in xf.adapter.XformersBackend().supports(on_cuda(dense(variant)))


def test_xformers_head_dim_limit_is_its_widest_operator(xf):  # noqa: F811
    from xformers.ops.fmha import cutlass

    assert cutlass.FwOp.SUPPORTED_MAX_K == MAX_HEAD_DIM
    backend = xf.adapter.XformersBackend()
    assert backend.supports(Case(B=1, S_q=2, S_kv=2, H=1, H_kv=1, d_k=256, d_v=256, device="cuda", dtype="bf16")) is None
