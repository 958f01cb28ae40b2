"""What each FlashAttention generation accepts, restated from the checks in its own source.

- FA2 (flash-attn 2.8.3): `csrc/flash_attn/flash_api.cpp` checks `head_size <= 256` (:393, :604,
  :830, :1269), v's shape against q's `head_size` (:418, :1295: d_v = d_k), and a paged block size
  `page_block_size % 256 == 0` (:583, :1264); `flash_attn/flash_attn_interface.py` pads a head dim
  that is not a multiple of 8 itself (:830, :921), so any d ≤ 256 is served.
- FA3 (`hopper/flash_api.cpp` at v2.8.3): forward `head_size <= max_headdim` (256, :745), head dims
  multiples of 8 for fp16/bf16 and of 16 for FP8 e4m3 (:820, `int const alignment = q_type ==
  torch::kFloat8_e4m3fn ? 16 : 8; TORCH_CHECK(head_size % alignment == 0, ...)`, head_size_v alike), d_v ≠ d_k only for d_k in (128, 192] with d_v in (96, 128],
  or d_k ≤ 64 with d_v ≤ 512 (:747-751), and only on Hopper (:752); its backward checks
  `max(head_size, head_size_v) <= 256` (:1301). Its default build has sm80 and sm90 kernels.
- FA4 (flash-attn-4 4.0.0b36, `flash_attn/cute/interface.py`): `_validate_head_dims` (:121) per
  GPU: sm90 both dims in [8, 256]; sm100/sm110 both in [8, 128], or (192, 128), (64, 512),
  (512, 512), (256, 256); dims divisible by 8 (16 bytes of fp16/bf16); sm80/sm120 unchecked. The
  forward runs on 8.x-12.x (:845) but has no paged KV on sm80 or sm120 (:1611, :1754); the
  backward needs 9.x-12.x (:2288).

Plain functions of integers and strings; tests/test_flash_attn_library.py checks them against those sources.

The score variants each FlashAttention generation has, as its own Python interface names them.

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


#: FA3's words for its d_v ≠ d_k rule (hopper/flash_api.cpp:750-751).
FA3_DV_RULE = "we only support Q/K headdim in (128, 192] and V headdim in (96, 128], or (Q/K <= 64 and V <= 512)"

#: How FlashAttention words a configuration its build or kernels refuse, lower-cased (FA3 built without
#: paged KV: "This flash attention build does not support paged KV."; its d_v rule: "we only support
#: Q/K headdim in …"; "Only Hopper supports different V headdim"; FA4: "… is not supported on SM100"),
#: as opposed to a failure (an illegal memory access), which stays one.
REFUSALS = ("not support", "only support", "only hopper supports", "unsupported compute capability",
            "should be a multiple of", "block size must be divisible by")


def is_refusal(message: str) -> bool:
    """Whether an exception's message is FlashAttention refusing the configuration, not failing on it."""
    lowered = message.lower()
    return any(words in lowered for words in REFUSALS)


def fa4_head_dims_ok(d_k: int, d_v: int, major: int) -> bool:
    """Whether flash-attn-4's `_validate_head_dims` passes (d_k, d_v) on a GPU of compute capability `major`.x (fp16/bf16)."""
    aligned = d_k % 8 == 0 and d_v % 8 == 0
    if major == 9:
        return aligned and 8 <= d_k <= 256 and 8 <= d_v <= 256
    if major in (10, 11):
        standard = 8 <= d_k <= 128 and 8 <= d_v <= 128
        special = (d_k, d_v) in ((192, 128), (256, 256)) or (d_v == 512 and d_k in (64, 512))
        return aligned and (standard or special)
    return True  # sm80 and sm120: the interface checks no head dims there


def head_dim_refusal(generation: int, d_k: int, d_v: int, *, backward: bool, major: int | None, fp8: bool = False) -> str | None:
    """Why FlashAttention `generation` refuses these head dims (in its own words), or None; `major` None: GPU unknown; `fp8`: e4m3 inputs."""
    if generation == 2:
        if d_v != d_k:
            return "needs d_v = d_k (flash_api.cpp checks v's head_size against q's)"
        if d_k > 256:
            return 'supports head dims up to 256 ("FlashAttention forward only supports head dimension at most 256")'
        return None
    if generation == 3:
        return _fa3_refusal(d_k, d_v, backward, major, fp8)
    return _fa4_refusal(d_k, d_v, backward, major)


def _fa3_refusal(d_k: int, d_v: int, backward: bool, major: int | None, fp8: bool = False) -> str | None:
    alignment = 16 if fp8 else 8  # hopper/flash_api.cpp: `q_type == torch::kFloat8_e4m3fn ? 16 : 8`, for head_size and head_size_v
    if d_k % alignment or d_v % alignment:
        return (f'needs {"FP8 " if fp8 else ""}head dims that are multiples of {alignment} '
                f'("head_size should be a multiple of {alignment}")')
    if d_k > 256:
        return 'supports head dims up to 256 ("FlashAttention forward only supports head dimension at most 256")'
    if d_v != d_k:
        if not ((128 < d_k <= 192 and 96 < d_v <= 128) or (d_k <= 64 and d_v <= 512)):
            return f'takes d_v ≠ d_k only for 128 < d_k ≤ 192 with 96 < d_v ≤ 128, or d_k ≤ 64 with d_v ≤ 512 ("{FA3_DV_RULE}")'
        if major is not None and major != 9:
            return f'takes d_v ≠ d_k on Hopper only ("Only Hopper supports different V headdim"; this GPU is sm{major}x)'
    if backward and max(d_k, d_v) > 256:
        return "has a backward for head dims up to 256 only (it checks max(head_size, head_size_v) <= 256)"
    return None


def _fa4_refusal(d_k: int, d_v: int, backward: bool, major: int | None) -> str | None:
    if backward and major == 8:
        return 'has no backward on sm8x ("Unsupported compute capability. Supported: 9.x, 10.x, 11.x, 12.x")'
    if major in (9, 10, 11):
        if fa4_head_dims_ok(d_k, d_v, major):
            return None
        if major == 9:
            return "supports head dims between 8 and 256, divisible by 8, on sm90 (its _validate_head_dims)"
        return ("supports head dims between 8 and 128, divisible by 8, or (d_k, d_v) = (192, 128), (64, 512), (512, 512) "
                f"or (256, 256) on sm100/sm110 (its _validate_head_dims; this GPU is sm{major}x)")
    # GPU unknown (or sm80/sm120, unchecked by the interface): what sm90 or sm100 would take.
    if fa4_head_dims_ok(d_k, d_v, 9) or fa4_head_dims_ok(d_k, d_v, 10):
        return None
    return ("supports head dims between 8 and 256 divisible by 8 (sm90), or up to 128, (192, 128), (64, 512), (512, 512) "
            "and (256, 256) (sm100) (its _validate_head_dims)")


def paged_refusal(generation: int, page_size: int, major: int | None) -> str | None:
    """Why FlashAttention `generation` refuses a paged KV cache with pages of `page_size` tokens, or None."""
    if generation == 2 and page_size % 256:
        return ('needs a paged KV block size that is a multiple of 256 ("Paged KV cache block size must be divisible by 256"; '
                f"case has page_size={page_size})")
    if generation == 4 and major in (8, 12):
        return f"has no paged KV cache on sm{major}x (its interface asserts page_table is None there)"
    return None
