"""The 2025-2026 model presets (harness/suite/presets.py): their numbers are the published configs', their layer kinds
become cases, tensor parallelism gives each GPU's share of the heads, and the models-2026 suite builds on a CPU."""

from __future__ import annotations

import math

import pytest

from harness.errors import UserError
from harness.suite.catalog import load_suite
from harness.suite.cases import CASE_FIELDS
from harness.suite.presets import MODELS_2026, PRESETS, get_preset, model_cases, tp_heads
from tests.cli_runs import refused

#: (H, H_kv, d_k, d_v, D, context, layers) as read from each model's config.json (the URL is in the preset's source).
PUBLISHED = {
    "gpt-oss-20b": (64, 8, 64, 64, 2880, 131072, 24),
    "gpt-oss-120b": (64, 8, 64, 64, 2880, 131072, 36),
    "gemma2-9b": (16, 8, 256, 256, 3584, 8192, 42),
    "gemma2-27b": (32, 16, 128, 128, 4608, 8192, 46),
    "gemma3-27b": (32, 16, 128, 128, 5376, 131072, 62),
    "qwen3-8b": (32, 8, 128, 128, 4096, 40960, 36),
    "qwen3-30b-a3b": (32, 4, 128, 128, 2048, 40960, 48),
    "llama4-scout": (40, 8, 128, 128, 5120, 10485760, 48),
    "kimi-k2": (64, 64, 192, 128, 7168, 131072, 61),
    "mistral-nemo-12b": (32, 8, 128, 128, 5120, 128000, 40),
}
#: Each model's layer kinds: (name, layers, window, softcap, sinks, scale).
KINDS = {
    "gpt-oss-20b": {("sliding", 12, 128, None, True, None), ("full", 12, None, None, True, None)},
    "gpt-oss-120b": {("sliding", 18, 128, None, True, None), ("full", 18, None, None, True, None)},
    "gemma2-9b": {("sliding", 21, 4096, 50.0, False, None), ("global", 21, None, 50.0, False, None)},
    "gemma2-27b": {("sliding", 23, 4096, 50.0, False, 144**-0.5), ("global", 23, None, 50.0, False, 144**-0.5)},
    "gemma3-27b": {("local", 52, 1024, None, False, 168**-0.5), ("global", 10, None, None, False, 168**-0.5)},
    "llama4-scout": {("global-nope", 12, None, None, False, None)},
}


@pytest.mark.parametrize("name", MODELS_2026)
def test_each_new_preset_holds_the_published_numbers_and_names_its_config(name):
    p = get_preset(name)
    assert (p.H, p.H_kv, p.d_k, p.d_v, p.D, p.context, p.layers) == PUBLISHED[name]
    assert p.source.startswith("https://huggingface.co/") and p.source.split(" ")[0].endswith("/config.json")
    if name in KINDS:
        assert {(k.name, k.layers, k.window, k.softcap, k.sinks, k.scale) for k in p.kinds} == KINDS[name]
    # Every layer is counted once, but where a kind is left out (Llama 4's chunked layers), which the note says.
    counted = sum(k.layers for k in p.kinds)
    assert counted == p.layers or (name == "llama4-scout" and counted == 12 and "chunked_attention" in p.note)


def test_kimi_k2_is_mla_as_deepseek_v3_is():
    kimi, deepseek = get_preset("kimi-k2"), get_preset("deepseek-v3")
    assert kimi.mla and (kimi.d_c, kimi.d_rope) == (deepseek.d_c, deepseek.d_rope) == (512, 64)
    decode = [c for c in model_cases(kimi, [1024]) if c.S_q == 1]
    assert [(c.H, c.H_kv, c.d_k, c.d_v, c.mla) for c in decode] == [(64, 1, 576, 512, True)]


def test_each_layer_kind_becomes_its_own_prefill_and_decode_cases():
    cases = model_cases(get_preset("gpt-oss-20b"), [4096])
    assert {(c.S_q, c.window) for c in cases} == {(4096, 128), (4096, None), (1, 128), (1, None)}
    assert len(model_cases(get_preset("gemma2-9b"), [16384])) == 0  # past its 8192-token context


@pytest.mark.skipif(not {"softcap", "sinks", "scale"} <= set(CASE_FIELDS), reason="the Case has no score-variant fields yet")
def test_cases_carry_sinks_softcap_and_scale():
    oss = model_cases(get_preset("gpt-oss-120b"), [1024])
    assert all(c.sinks for c in oss) and {c.window for c in oss} == {128, None}
    gemma2 = model_cases(get_preset("gemma2-9b"), [1024])
    assert all(c.softcap == 50.0 and c.scale is None for c in gemma2) and {c.window for c in gemma2} == {4096, None}
    gemma3 = model_cases(get_preset("gemma3-27b"), [1024])
    assert all(c.softcap is None and c.scale == pytest.approx(168**-0.5) for c in gemma3)
    # The presets that came before keep their cases exactly: no variant is set on them (DeepSeek-V3 carries its own scale).
    assert all(not c.sinks and c.softcap is None and c.scale == p.scale for p in PRESETS.values() if p.name not in MODELS_2026
               for c in model_cases(p, [1024]))
    assert [p.name for p in PRESETS.values() if p.name not in MODELS_2026 and p.scale is not None] == ["deepseek-v3"]


def test_tp8_of_a_gqa_model_gives_each_gpu_an_eighth_of_the_heads():
    assert tp_heads(get_preset("llama3-70b"), 8) == (8, 1)
    assert tp_heads(get_preset("gemma2-27b"), 8) == (4, 2)
    assert {(c.H, c.H_kv) for c in model_cases(get_preset("gpt-oss-20b"), [1024], tp=8)} == {(8, 1)}


def test_tp_past_the_kv_heads_replicates_one_kv_head_per_gpu_and_says_so():
    assert tp_heads(get_preset("qwen3-30b-a3b"), 8) == (4, 1)
    suite = load_suite("model:qwen3-30b-a3b:1024:tp=1,8")
    assert {(c.H, c.H_kv) for c in suite.cases} == {(32, 4), (4, 1)}
    assert "H_kv 4 < TP 8: one KV head replicated per GPU" in suite.description and suite.name.endswith("-tp1-8")


def test_mla_under_tp_splits_the_heads_and_replicates_the_latent_cache():
    cases = model_cases(get_preset("kimi-k2"), [1024], tp=8)
    assert {(c.S_q, c.H, c.H_kv, c.mla) for c in cases} == {(1024, 8, 8, False), (1, 8, 1, True)}


@pytest.mark.parametrize("argv, words", [
    (["--model", "llama3-8b", "--tp", "3"], ["TP 3 does not divide llama3-8b's 32 query heads"]),
    (["--model", "gpt2-xl", "--tp", "2"], ["TP 2 does not divide gpt2-xl's 25 query heads"]),
    (["--model", "llama3-8b", "--tp", "x"], ["--tp takes positive integers"]),
    (["--model", "llama3-8b", "--tp", "0,8"], ["--tp takes positive integers"]),
    (["--suite", "quick", "--tp", "8"], ["--tp goes with --model"]),
], ids=["not-dividing", "odd-heads", "word", "zero", "no-model"])
def test_a_bad_tp_is_one_line(capsys, tmp_path, argv, words):
    refused(capsys, ["run", *argv, "--device", "cpu", "--out", str(tmp_path), "--quiet"], words)


def test_models_2026_cpu_variant_loads_small_and_its_cases_build():
    suite = load_suite("models-2026")
    cpu = suite.on_device("cpu").cases
    assert cpu and all(c.device == "cpu" and c.dtype == "fp32" and c.S_kv <= 256 for c in cpu)
    assert {(c.H, c.H_kv) for c in cpu} >= {(64, 8), (8, 1), (4, 1)}  # TP 1 and 8, the replicated KV head among them
    assert len(cpu) <= 40  # each softcapped or sinked case and its plain twin
    cuda = suite.cases
    assert {c.H for c in cuda if c.d_k == 64} == {64, 8}  # gpt-oss at TP 1 and 8
    assert any(c.mla for c in cuda) and all(c.dtype == "bf16" and c.device == "cuda" for c in cuda)
    assert "qwen3-30b-a3b TP 8" in suite.description and "replicated" in suite.description


@pytest.mark.parametrize("name, factor", [("deepseek-v3", 40.0), ("kimi-k2", 32.0)])
def test_mla_presets_carry_the_models_own_scale_in_every_case(name, factor):
    """DeepSeek-V3 and Kimi-K2 scale by 1/√192 (128 + 64 q-k head) × mscale², mscale = 0.1·ln(factor) + 1 (their YaRN
    rope_scaling, mscale_all_dim 1.0): prefill (d_k 192) and the absorbed decode (d_k 576) alike, never 1/√576."""
    preset = get_preset(name)
    mscale = 0.1 * math.log(factor) + 1.0
    expected = 192 ** -0.5 * mscale ** 2
    assert preset.scale == pytest.approx(expected) and abs(expected - 576 ** -0.5) > 0.01
    cases = model_cases(preset, [1024], modes=("fwd", "bwd"))
    assert {(c.mla, c.mode) for c in cases} == {(False, "fwd"), (False, "bwd"), (True, "fwd")}
    assert all(c.scale == pytest.approx(expected) and c.softmax_scale == pytest.approx(expected) for c in cases)
    decode = next(c for c in cases if c.mla)
    assert decode.d_k == 576 and f"{decode.scale:g}"[:5] in decode.id  # the case says which scale it uses


def test_an_mla_case_at_the_models_scale_agrees_on_the_cpu(one_thread):
    """The absorbed MLA baseline computes at the case's scale, and the reference judges it at the same one."""
    from harness.backends.registry import load_registry
    from harness.checks.correctness import check_pair

    preset = get_preset("deepseek-v3")
    decode = next(c for c in model_cases(preset, [64], device="cpu", prefill=False) if c.mla).replace(H=4)
    assert check_pair(decode, load_registry().get("mla")).verdict == "agree"
    assert check_pair(decode.replace(scale=None), load_registry().get("mla")).verdict == "agree"
