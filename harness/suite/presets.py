"""Attention shapes of published models, and the cases that benchmark them.

Each preset is the attention layer of one published configuration (paper or released config file):
model width D, query heads H, K/V heads H_kv, head dims, context length, and a sliding window or
MLA's latent widths where the model has them. `model_cases` turns a preset and sequence lengths into
cases: prefill (S_q = S_kv = S, causal) and decoding (S_q = 1 against a KV cache of S tokens).
No estimated or unpublished configurations are included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from harness.suite.cases import Case
from harness.errors import UserError


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

    @property
    def mla(self) -> bool:
        """True for a model with multi-head latent attention."""
        return self.d_c is not None

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes per token per layer: `H_kv·(d_k + d_v)` elements, or `d_c + d_rope` for MLA."""
        if self.mla:
            return (self.d_c + self.d_rope) * bytes_per_element
        return self.H_kv * (self.d_k + self.d_v) * bytes_per_element


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
        ModelPreset("deepseek-v3", "DeepSeek-AI 2024, released config (MLA)", D=7168, H=128, H_kv=128, d_k=192, d_v=128, context=163840, d_c=512, d_rope=64),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called `name`, or a UserError that lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown model {name!r}: known models are {', '.join(PRESETS)}") from None


def model_cases(
    preset: ModelPreset, S: Iterable[int], *, B: int = 1, dtype: str = "bf16", device: str = "cuda",
    prefill: bool = True, decode: bool = True, modes: Iterable[str] = ("fwd",),
) -> list[Case]:
    """Cases for a model at the given sequence lengths (capped at its context).

    Prefill: S_q = S_kv = S, causal, with the model's window, in each of `modes`. Decoding:
    S_q = 1 against a cache of S tokens (forward only). MLA models prefill in the decompressed form
    (H heads, d_k = d_nope + d_rope, d_v) and decode in the absorbed form (`mla=True`: H_kv = 1,
    d_k = d_c + d_rope, d_v = d_c, one shared latent cache).
    """
    cases: list[Case] = []
    for s in S:
        if s > preset.context:
            continue
        if prefill:
            for mode in modes:
                cases.append(Case(B=B, S_q=s, S_kv=s, H=preset.H, H_kv=preset.H_kv, d_k=preset.d_k, d_v=preset.d_v,
                                  dtype=dtype, device=device, causal=True, window=preset.window, mode=mode))
        if decode:
            if preset.mla:
                cases.append(Case(B=B, S_q=1, S_kv=s, H=preset.H, H_kv=1, d_k=preset.d_c + preset.d_rope, d_v=preset.d_c,
                                  dtype=dtype, device=device, causal=True, mla=True))
            else:
                cases.append(Case(B=B, S_q=1, S_kv=s, H=preset.H, H_kv=preset.H_kv, d_k=preset.d_k, d_v=preset.d_v,
                                  dtype=dtype, device=device, causal=True, window=preset.window))
    return list(dict.fromkeys(cases))


#: Sequence lengths a model suite runs when none are given: on CUDA, and on a CPU (same heads, short sequences).
DEFAULT_SEQ = (1024, 4096, 16384)
CPU_SEQ = (128,)
