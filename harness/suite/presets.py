"""Attention shapes of published models, and the cases that benchmark them.

Each preset is the attention layer of one published configuration (paper or released config file):
model width D, query heads H, K/V heads H_kv, head dims, context length, and a sliding window or
MLA's latent widths where the model has them. A model whose layers differ (sliding-window layers
beside global ones, a logit softcap, attention sinks, a softmax scale that is not 1/√d_k) lists them
as layer kinds, each with how many layers have it. `model_cases` turns a preset and sequence lengths
into cases: prefill (S_q = S_kv = S, causal) and decoding (S_q = 1 against a KV cache of S tokens),
one set per layer kind, at a tensor-parallel degree (`tp_heads`). No estimated or unpublished
configurations are included; a layer kind the Case cannot express is named in the preset's `note`
and left out, never approximated.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Iterable

from harness.suite.cases import CASE_FIELDS, Case
from harness.errors import UserError


@dataclass(frozen=True)
class LayerKind:
    """One kind of attention layer of a model: the Case fields it sets beyond the preset's heads, and how many layers have it."""

    name: str
    #: How many of the model's layers are of this kind (None: every layer; the count is not recorded).
    layers: int | None = None
    window: int | None = None
    softcap: float | None = None
    sinks: bool = False
    scale: float | None = None
    #: Which of the model's layers are of this kind, as its config says ("even layers 0, 2, …"); '' where it is every layer.
    which: str = ""

    def case_fields(self) -> dict:
        """The kind's Case fields that differ from a plain causal layer (only those the Case has)."""
        fields = {"window": self.window, "softcap": self.softcap, "sinks": self.sinks, "scale": self.scale}
        # Only set values: a plain layer builds the same Case as before the score variants existed.
        return {k: v for k, v in fields.items() if v not in (None, False) and k in CASE_FIELDS}


@dataclass(frozen=True)
class ModelPreset:
    """One model's attention shapes. For MLA models, `d_c` and `d_rope` describe the latent cache."""

    name: str
    source: str
    D: int
    H: int
    H_kv: int
    d_k: int
    d_v: int
    context: int
    window: int | None = None
    #: MLA (DeepSeek): latent width (kv_lora_rank), decoupled RoPE width, and the decompressed head dims.
    d_c: int | None = None
    d_rope: int | None = None
    #: The model's layer count and its kinds of attention layer; empty: one kind, every layer, with `window`.
    layers: int | None = None
    layer_kinds: tuple[LayerKind, ...] = ()
    #: What the preset leaves out and why (a layer kind no Case field expresses, a constant not carried).
    note: str = ""
    #: The model's own softmax scale where it is not 1/√d_k (a layer kind's `scale` overrides it): every case it makes,
    #: MLA's absorbed decode included, says so in its `scale`.
    scale: float | None = None

    @property
    def mla(self) -> bool:
        """True for a model with multi-head latent attention."""
        return self.d_c is not None

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        """The model's kinds of attention layer (one, with the preset's window, where it lists none)."""
        return self.layer_kinds or (LayerKind("all", self.layers, window=self.window),)

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes per token per layer: `H_kv·(d_k + d_v)` elements, or `d_c + d_rope` for MLA."""
        if self.mla:
            return (self.d_c + self.d_rope) * bytes_per_element
        return self.H_kv * (self.d_k + self.d_v) * bytes_per_element


def _hf(repo: str, fields: str) -> str:
    """A source line: the official Hugging Face config.json of `repo` and the fields read from it."""
    return f"https://huggingface.co/{repo}/blob/main/config.json ({fields})"


_GQA_FIELDS = "hidden_size, num_attention_heads, num_key_value_heads, head_dim, num_hidden_layers, max_position_embeddings"
_GPT_OSS_NOTE = ("sinks: one learned logit per query head (`sinks`, shape [num_attention_heads], in openai/gpt-oss "
                 "gpt_oss/torch/model.py AttentionBlock); sliding_window 128 on the layer_types 'sliding_attention' layers")
_GEMMA2 = "attn_logit_softcapping, sliding_window, query_pre_attn_scalar (scale = query_pre_attn_scalar^-0.5)"
_LLAMA4_NOTE = ("layer_types 'chunked_attention' (attention_chunk_size 8192, the RoPE layers: 3 of every 4, no_rope_layer_interval 4) "
                "is left out: a query sees the keys of its own 8192-token chunk, which no Case field expresses (a window slides, a chunk does not). "
                "The NoPE global layers are plain causal GQA; their attn_temperature_tuning scales the queries before attention")
_MLA_NOTE = "scale: 1/√(qk_nope_head_dim + qk_rope_head_dim) × YaRN's mscale² (rope_scaling factor, mscale_all_dim)"


def yarn_mla_scale(qk_head_dim: int, factor: float, mscale_all_dim: float = 1.0) -> float:
    """DeepSeek's MLA softmax scale: qk_head_dim^-0.5 × mscale², mscale = 0.1·mscale_all_dim·ln(factor) + 1 (its yarn_get_mscale)."""
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0
    return qk_head_dim ** -0.5 * mscale * mscale


def _gpt_oss(name: str, layers: int) -> ModelPreset:
    """gpt-oss: alternating 128-token sliding-window and full layers, both with attention sinks."""
    half = layers // 2
    return ModelPreset(
        name, _hf(f"openai/{name}", _GQA_FIELDS + ", layer_types, sliding_window"), D=2880, H=64, H_kv=8, d_k=64, d_v=64,
        context=131072, layers=layers, note=_GPT_OSS_NOTE,
        layer_kinds=(LayerKind("sliding", half, window=128, sinks=True, which="even layers 0, 2, … (layer_types)"),
                     LayerKind("full", layers - half, sinks=True, which="odd layers 1, 3, … (layer_types)")))


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("transformer-base", "Vaswani et al. 2017, Table 3 (base)", D=512, H=8, H_kv=8, d_k=64, d_v=64, context=512),
        ModelPreset("gpt2-xl", "Radford et al. 2019; released config (n_embd 1600, n_head 25)", D=1600, H=25, H_kv=25, d_k=64, d_v=64, context=1024),
        ModelPreset("gpt3-175b", "Brown et al. 2020, Table 2.1", D=12288, H=96, H_kv=96, d_k=128, d_v=128, context=2048),
        ModelPreset("llama2-7b", "Touvron et al. 2023, Table 1; released config (32 heads, MHA)", D=4096, H=32, H_kv=32, d_k=128, d_v=128, context=4096),
        ModelPreset("llama2-70b", "Touvron et al. 2023; released config (8 KV heads)", D=8192, H=64, H_kv=8, d_k=128, d_v=128, context=4096),
        ModelPreset("llama3-8b", "Meta Llama 3 8B released config", D=4096, H=32, H_kv=8, d_k=128, d_v=128, context=8192),
        ModelPreset("llama3-70b", "Meta Llama 3 70B released config (8 KV heads)", D=8192, H=64, H_kv=8, d_k=128, d_v=128, context=8192),
        ModelPreset("llama3-405b", "Llama 3.1 405B (Dubey et al. 2024, Table 3)", D=16384, H=128, H_kv=8, d_k=128, d_v=128, context=131072),
        ModelPreset("mistral-7b", "Jiang et al. 2023 (sliding window 4096)", D=4096, H=32, H_kv=8, d_k=128, d_v=128, context=32768, window=4096),
        # DeepSeek-V3 released config: hidden 7168, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64,
        # qk_nope_head_dim 128, v_head_dim 128. Decompressed (prefill/training): d_k = 128 + 64 = 192, d_v = 128.
        # Its scale: 1/√192 × mscale², rope_scaling {type yarn, factor 40, mscale_all_dim 1.0}.
        ModelPreset("deepseek-v3", "DeepSeek-AI 2024, released config (MLA)", D=7168, H=128, H_kv=128, d_k=192, d_v=128, context=163840, d_c=512, d_rope=64,
                    scale=yarn_mla_scale(192, 40.0), note=_MLA_NOTE),
        # 2025-2026 models, each from its official config.json (the fields read are named in its source).
        _gpt_oss("gpt-oss-20b", 24),
        _gpt_oss("gpt-oss-120b", 36),
        # Gemma 2: layer i slides when i is even; 9B's query_pre_attn_scalar 256 = head_dim, so its scale is 1/√d_k.
        ModelPreset("gemma2-9b", _hf("google/gemma-2-9b", f"{_GQA_FIELDS}, {_GEMMA2}"), D=3584, H=16, H_kv=8, d_k=256, d_v=256,
                    context=8192, layers=42, layer_kinds=(LayerKind("sliding", 21, window=4096, softcap=50.0, which="even layers 0, 2, …"),
                                                          LayerKind("global", 21, softcap=50.0, which="odd layers 1, 3, …"))),
        ModelPreset("gemma2-27b", _hf("google/gemma-2-27b", f"{_GQA_FIELDS}, {_GEMMA2}"), D=4608, H=32, H_kv=16, d_k=128, d_v=128,
                    context=8192, layers=46, layer_kinds=(LayerKind("sliding", 23, window=4096, softcap=50.0, scale=144**-0.5, which="even layers 0, 2, …"),
                                                          LayerKind("global", 23, softcap=50.0, scale=144**-0.5, which="odd layers 1, 3, …"))),
        # Gemma 3: every sixth layer (sliding_window_pattern 6) is global, the other five slide over 1024; no softcap.
        ModelPreset("gemma3-27b", _hf("google/gemma-3-27b-pt", f"text_config: {_GQA_FIELDS}, sliding_window, sliding_window_pattern, "
                                      "attn_logit_softcapping (null), query_pre_attn_scalar"), D=5376, H=32, H_kv=16, d_k=128, d_v=128,
                    context=131072, layers=62, layer_kinds=(LayerKind("local", 52, window=1024, scale=168**-0.5, which="every layer but each sixth"),
                                 LayerKind("global", 10, scale=168**-0.5, which="each sixth layer: 5, 11, … (sliding_window_pattern 6)"))),
        ModelPreset("qwen3-8b", _hf("Qwen/Qwen3-8B", _GQA_FIELDS), D=4096, H=32, H_kv=8, d_k=128, d_v=128, context=40960, layers=36),
        ModelPreset("qwen3-30b-a3b", _hf("Qwen/Qwen3-30B-A3B", _GQA_FIELDS), D=2048, H=32, H_kv=4, d_k=128, d_v=128, context=40960, layers=48),
        ModelPreset("llama4-scout", _hf("meta-llama/Llama-4-Scout-17B-16E", f"text_config: {_GQA_FIELDS}, attention_chunk_size, no_rope_layers"),
                    D=5120, H=40, H_kv=8, d_k=128, d_v=128, context=10485760, layers=48, note=_LLAMA4_NOTE,
                    layer_kinds=(LayerKind("global-nope", 12, which="each fourth layer: 3, 7, … (no_rope_layer_interval 4)"),)),
        ModelPreset("kimi-k2", _hf("moonshotai/Kimi-K2-Instruct", "hidden_size, num_attention_heads, kv_lora_rank, qk_rope_head_dim, "
                                   "qk_nope_head_dim, v_head_dim, num_hidden_layers, max_position_embeddings, rope_scaling"),
                    D=7168, H=64, H_kv=64, d_k=192, d_v=128, context=131072, d_c=512, d_rope=64, layers=61, note=_MLA_NOTE,
                    scale=yarn_mla_scale(192, 32.0)),  # rope_scaling {type yarn, factor 32, mscale_all_dim 1.0}
        ModelPreset("mistral-nemo-12b", _hf("mistralai/Mistral-Nemo-Base-2407", _GQA_FIELDS + ", sliding_window (null)"),
                    D=5120, H=32, H_kv=8, d_k=128, d_v=128, context=128000, layers=40),
    )
}

#: The presets added for the 2026 suite (suites/models_2026.py), in its order.
MODELS_2026 = ("gpt-oss-20b", "gpt-oss-120b", "gemma2-9b", "gemma2-27b", "gemma3-27b", "qwen3-8b", "qwen3-30b-a3b",
               "llama4-scout", "kimi-k2", "mistral-nemo-12b")


def get_preset(name: str) -> ModelPreset:
    """The preset called `name`, or a UserError that lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError.unknown("model", name, PRESETS, f"known models are {', '.join(PRESETS)}") from None


def tp_heads(preset: ModelPreset, tp: int) -> tuple[int, int]:
    """Per-GPU (query heads, KV heads) at tensor-parallel degree `tp`: H/tp and H_kv/tp, or one replicated KV head when H_kv < tp.

    This is how vLLM and SGLang shard a GQA layer; an MLA model's latent cache is one head on every GPU (see `model_cases`).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UserError(f"tensor parallel degree must be a positive integer, got {tp!r}")
    if preset.H % tp:
        raise UserError(f"TP {tp} does not divide {preset.name}'s {preset.H} query heads: TP must divide H")
    if preset.H_kv >= tp and preset.H_kv % tp:
        raise UserError(f"TP {tp} does not divide {preset.name}'s {preset.H_kv} KV heads")
    if preset.H_kv < tp and tp % preset.H_kv:
        raise UserError(f"{preset.name}'s {preset.H_kv} KV heads cannot be replicated evenly over TP {tp}")
    return preset.H // tp, max(preset.H_kv // tp, 1)


def tp_note(preset: ModelPreset, tp: int) -> str:
    """How `tp` shards the preset, for a suite's description: 'TP 8: H 64→8, H_kv 8→1 per GPU' (replication said)."""
    H, H_kv = tp_heads(preset, tp)
    if tp == 1:
        return f"TP 1: H {H}, " + ("the MLA latent cache" if preset.mla else f"H_kv {H_kv}")
    if preset.mla:
        return f"TP {tp}: H {preset.H}→{H} per GPU, the MLA latent cache replicated (one head per GPU)"
    replicated = f" (H_kv {preset.H_kv} < TP {tp}: one KV head replicated per GPU)" if preset.H_kv < tp else ""
    return f"TP {tp}: H {preset.H}→{H}, H_kv {preset.H_kv}→{H_kv} per GPU{replicated}"


def model_cases(
    preset: ModelPreset, S: Iterable[int], *, B: int = 1, dtype: str = "bf16", device: str = "cuda",
    prefill: bool = True, decode: bool = True, modes: Iterable[str] = ("fwd",), tp: int = 1,
) -> list[Case]:
    """Cases for a model at the given sequence lengths (capped at its context), per layer kind, on one GPU of `tp`.

    Prefill: S_q = S_kv = S, causal, with the kind's window, softcap, sinks and scale, in each of `modes`.
    Decoding: S_q = 1 against a cache of S tokens (forward only). MLA models prefill in the decompressed form
    (H heads, d_k = d_nope + d_rope, d_v) and decode in the absorbed form (`mla=True`: H_kv = 1,
    d_k = d_c + d_rope, d_v = d_c, one shared latent cache). Under tensor parallelism each GPU holds H/tp
    query heads and H_kv/tp KV heads (`tp_heads`); MLA's latent cache is replicated, one head per GPU.
    """
    H, H_kv = tp_heads(preset, tp)
    cases: list[Case] = []
    for s in S:
        if s > preset.context:
            continue
        for kind in preset.kinds:
            extra = kind.case_fields()
            if preset.scale is not None and "scale" not in extra:
                extra["scale"] = preset.scale
            if prefill:
                for mode in modes:
                    cases.append(Case(B=B, S_q=s, S_kv=s, H=H, H_kv=H_kv, d_k=preset.d_k, d_v=preset.d_v,
                                      dtype=dtype, device=device, causal=True, mode=mode, **extra))
            if decode:
                if preset.mla:
                    # The absorbed form's 576-wide head keeps the model's scale (its 192-wide q-k head's), never 1/√576.
                    cases.append(Case(B=B, S_q=1, S_kv=s, H=H, H_kv=1, d_k=preset.d_c + preset.d_rope, d_v=preset.d_c,
                                      dtype=dtype, device=device, causal=True, mla=True, scale=extra.get("scale")))
                else:
                    cases.append(Case(B=B, S_q=1, S_kv=s, H=H, H_kv=H_kv, d_k=preset.d_k, d_v=preset.d_v,
                                      dtype=dtype, device=device, causal=True, **extra))
    return list(dict.fromkeys(cases))


def tp_degrees(preset: ModelPreset, candidates: Iterable[int] = (1, 2, 4, 8)) -> list[int]:
    """The degrees among `candidates` that shard the preset's heads (`tp_heads` accepts them)."""
    out = []
    for tp in candidates:
        try:
            tp_heads(preset, tp)
        except UserError:
            continue
        out.append(tp)
    return out


def describe(preset: ModelPreset) -> dict:
    """What `attnbench models --json` prints for one preset: its heads, head dims, layer kinds (window, sinks, softcap, scale), MLA dims, TP."""
    kinds = [{"name": k.name, "layers": k.layers, "which": k.which or "every layer", "window": k.window, "sinks": k.sinks,
              "softcap": k.softcap, "scale": k.scale} for k in preset.kinds]
    return {"name": preset.name, "source": preset.source, "D": preset.D, "H": preset.H, "H_kv": preset.H_kv, "d_k": preset.d_k,
            "d_v": preset.d_v, "context": preset.context, "layers": preset.layers, "layer_kinds": kinds, "mla": preset.mla,
            "d_c": preset.d_c, "d_rope": preset.d_rope,
            "tp": {str(tp): dict(zip(("H", "H_kv"), tp_heads(preset, tp))) for tp in tp_degrees(preset)}, "note": preset.note}


#: Sequence lengths a model suite runs when none are given: on CUDA, and on a CPU (same heads, short sequences).
DEFAULT_SEQ = (1024, 4096, 16384)
CPU_SEQ = (128,)
