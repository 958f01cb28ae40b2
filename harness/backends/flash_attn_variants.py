"""The score variants each FlashAttention generation has, as its own Python interface names them.

- FA2 (flash-attn 2.8.3, flash_attn/flash_attn_interface.py): `softmax_scale`, `softcap` ("Anything > 0
  activates softcapping attention"), `alibi_slopes` ("(nheads,) or (batch_size, nheads), fp32. A bias of
  (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added": the harness's −slope·|pos(i) − j|, bottom-right)
  on flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache; no attention sink.
- FA3 (hopper/flash_attn_interface.py at v2.8.3): `softmax_scale` and `softcap`; no alibi_slopes, no sink.
- FA4 (flash-attn-4 4.0.0b36, flash_attn/cute/interface.py): `softmax_scale`, `softcap` (a pre-mask score_mod
  c·tanh(s/c) on the scaled scores) and `learnable_sink` (shape (num_head,), fp16/bf16/fp32, natural-log units,
  not multiplied by softmax_scale); no alibi_slopes. Its Sm80 forward kernel, which sm120 inherits, asserts
  "Learnable sink is not supported in this kernel"; its backward takes a sink on SM90 and SM100/SM110 only, and
  not in SM100's dedicated head_dim=256 kernel; a softcap backward is a score_mod backward, "not supported on SM 12.0".

Plain functions of a case; tests/test_gpu_variants.py binds what they return to the real signatures.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.suite.cases import Case

#: What each generation computes exactly.
SCORE_VARIANTS = {2: frozenset({"softcap", "alibi", "scale"}), 3: frozenset({"softcap", "scale"}),
                  4: frozenset({"softcap", "sinks", "scale"})}
#: Why a generation lacks a variant: its interface has no such parameter.
VARIANT_REASONS = {
    2: {"sinks": "flash_attn_func has no attention-sink parameter (it takes softcap and alibi_slopes)"},
    3: {"alibi": "hopper's flash_attn_func has no alibi_slopes (it takes softcap only)",
        "sinks": "hopper's flash_attn_func has no attention-sink parameter"},
    4: {"alibi": "flash_attn.cute's flash_attn_func has no alibi_slopes (it takes softcap, learnable_sink and score_mod; "
                 "an ALiBi score_mod would be the adapter's code, not the library's)"},
}


def arch_refusal(generation: int, case: Case, major: int | None) -> str | None:
    """Why FA `generation` cannot compute the case's variants on a GPU of compute capability `major`.x (None: unknown), or None."""
    if generation != 4 or major is None:
        return None
    backward = case.mode != "fwd"
    if case.sinks and major in (8, 12):
        return f'has no learnable_sink on sm{major}x (its Sm80 kernel asserts "Learnable sink is not supported in this kernel")'
    if case.sinks and backward and major in (10, 11) and case.d_k == case.d_v == 256:
        return 'has no learnable_sink backward at head dim 256 on sm100 ("SM100 backward with head_dim=256 does not support learnable_sink")'
    if case.softcap is not None and backward and major == 12:
        return 'has no softcap backward on sm12x (softcap is a score_mod: "score_mod backward not supported on SM 12.0")'
    return None


def variant_kwargs(generation: int, case: Case, sinks: torch.Tensor | None, device: torch.device) -> dict[str, Any]:
    """The keyword arguments that give FA `generation` the case's scale and score variants (untimed: slopes and sinks copied here)."""
    kwargs: dict[str, Any] = {"softmax_scale": case.softmax_scale}
    if case.softcap is not None:
        kwargs["softcap"] = float(case.softcap)
    if case.alibi and generation == 2:
        from harness.attention.variants import alibi_slopes

        kwargs["alibi_slopes"] = alibi_slopes(case.H).to(device=device, dtype=torch.float32).contiguous()  # (nheads,), fp32
    if case.sinks and generation == 4:
        if sinks is None:
            raise ValueError("a sinks case whose inputs have no sinks")
        kwargs["learnable_sink"] = sinks.detach().to(device=device, dtype=torch.float32).contiguous()  # (num_head,)
    return kwargs
