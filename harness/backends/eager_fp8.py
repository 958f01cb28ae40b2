"""eager-fp8: attention whose two GEMMs read FP8 operands (`torch._scaled_mm`), FlashAttention 3's FP8 recipe in eager PyTorch.

Per (batch, head): S = Q·Kᵀ from FP8 Q and K with their descales, accumulated in fp32; the online softmax in fp32;
the unnormalised weights exp(S − rowmax) quantized to the case's FP8 format (their largest is 1, so no scale is
needed); O = P·V from FP8 P and V, accumulated in fp32, divided by the fp32 row sums, returned in bf16.

On a CPU `torch._scaled_mm` has no FP8 units behind it: its numbers are an FP8 GEMM's (FP8 operands, fp32
accumulation) and its time is torch's CPU implementation's, not an FP8 tensor core's. It is the CPU's honest FP8
row and the baseline the GPU FP8 kernels are checked beside; the profiler names `aten::_scaled_mm` in its trace.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.attention.fp8 import FP8_FORMATS, FP8_OUTPUT_DTYPE
from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v_cols: torch.Tensor, descales: dict[str, torch.Tensor], mask: torch.Tensor | None,
                  scale: float, fmt: str) -> torch.Tensor:
    """FP8 `[B, H, S_q, d_k]` queries over FP8 K `[B, H_kv, S_kv, d_k]` and V (column-major per head), out `[B, H, S_q, d_v]` in bf16.

    `descales` holds q's, k's and v's, and "p": P's, the unit scale (made in prepare)."""
    B, H, S_q, _ = q.shape
    H_kv, d_v = k.shape[1], v_cols.shape[-1]
    g = H // H_kv
    one = descales["p"]
    out = torch.empty(B, H, S_q, d_v, dtype=FP8_OUTPUT_DTYPE, device=q.device)
    p_dtype = FP8_FORMATS[fmt]
    for b in range(B):
        for h in range(H):
            kv = h // g
            scores = torch._scaled_mm(q[b, h], k[b, kv].t(), scale_a=descales["q"], scale_b=descales["k"], out_dtype=torch.float32)
            scores = scores * scale
            if mask is not None:
                scores = scores.masked_fill(~mask[b, 0], float("-inf"))
            top = scores.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            weights = torch.exp(scores - top)
            sums = weights.sum(dim=-1, keepdim=True)
            numerator = torch._scaled_mm(weights.to(p_dtype), v_cols[b, kv], scale_a=one, scale_b=descales["v"], out_dtype=torch.float32)
            out[b, h] = (numerator / torch.where(sums > 0, sums, torch.ones_like(sums))).to(FP8_OUTPUT_DTYPE)
    return out


@register
class EagerFp8Backend(Backend):
    """Both attention GEMMs on FP8 operands through torch._scaled_mm; FP8 cases only."""

    name = "eager-fp8"
    family = "eager"
    description = "Q·Kᵀ and P·V as FP8 GEMMs (torch._scaled_mm, fp32 accumulation), P quantized to FP8, output bf16"
    native_gqa = True
    supports_backward = False
    dtypes = frozenset(FP8_FORMATS)
    #: The operator an FP8 row of this backend must show in the profiler: an FP8 GEMM, never a dequantize and a bf16 matmul.
    fp8_kernels = ("_scaled_mm",)

    def available(self) -> str | None:
        """Needs torch's `_scaled_mm` (FP8 GEMM) and the float8 dtypes."""
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return f"torch {torch.__version__} has no torch._scaled_mm FP8 GEMM"
        return None

    def supports(self, case: Case) -> str | None:
        """FP8 Q, K and V (dtype fp8_e4m3 or fp8_e5m2), forward only, dense, no score variant."""
        if case.dtype not in FP8_FORMATS:
            return f"eager-fp8 computes FP8 cases only (dtype fp8_e4m3 or fp8_e5m2); this case is {case.dtype}"
        return super().supports(case)

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """The mask once, V laid out column-major per head for the second GEMM (both untimed), then the FP8 attention."""
        q, k = inputs.q, inputs.k
        v_cols = inputs.v.transpose(-2, -1).contiguous().transpose(-2, -1)  # [.., S_kv, d_v] with column-major strides
        mask = visible_mask(case, device=q.device)
        # P needs no scale (its largest is 1): the unit descale made here, not in each timed call.
        descales: dict[str, Any] = {**(inputs.descales or {}), "p": torch.ones((), dtype=torch.float32, device=q.device)}
        scale, fmt = case.softmax_scale, case.dtype
        return Prepared(fn=lambda: fp8_attention(q, k, v_cols, descales, mask, scale, fmt), notes={"gemm": "torch._scaled_mm"})
