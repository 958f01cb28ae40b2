"""eager-fp8: attention whose two GEMMs read FP8 operands (`torch._scaled_mm`), FlashAttention 3's FP8 recipe in eager PyTorch.

Per (batch, head): S = Q·Kᵀ from FP8 Q and K with their descales, accumulated in fp32; the online softmax in fp32;
the unnormalised weights exp(S − rowmax) quantized to the case's FP8 format (their largest is 1, so no scale is
needed); O = P·V from FP8 P and V, accumulated in fp32, divided by the fp32 row sums, returned in bf16.

On a CPU `torch._scaled_mm` has no FP8 units behind it: its numbers are an FP8 GEMM's (FP8 operands, fp32
accumulation) and its time is torch's CPU implementation's, not an FP8 tensor core's. It is the CPU's honest FP8
row and the baseline the GPU FP8 kernels are checked beside; the profiler names `aten::_scaled_mm` in its trace.

CUDA's `_scaled_mm` (torch/_meta_registrations.py `_check_scaled_mm_sizes`, aten/src/ATen/native/cuda/Blas.cpp) takes a
row-major A and a column-major B whose K and N are multiples of 16, and refuses two e5m2 operands. So on every device the
operands are laid out that way in prepare (untimed): d_k, d_v and S_kv zero-padded up to multiples of 16 (a zero column
of Q and K adds nothing to Q·Kᵀ, a padded key is masked out, a zero column of V is cut from the output), and an e5m2 case
is refused on CUDA, where Q·Kᵀ would multiply two e5m2 matrices. prepare makes one trial call, so a refusal the rules
above missed is `unsupported` with torch's reason, never an error in the timed call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from harness.attention.fp8 import FP8_FORMATS, FP8_OUTPUT_DTYPE
from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask


#: What CUDA's `_scaled_mm` needs K and N (and B's rows) to be a multiple of (torch/_meta_registrations.py `_check_scaled_mm_sizes`).
SCALED_MM_MULTIPLE = 16
#: CUDA's refusal of two e5m2 operands (aten/src/ATen/native/cuda/Blas.cpp, "Multiplication of two Float8_e5m2 matrices is not supported").
E5M2_REFUSAL = ("CUDA's torch._scaled_mm refuses two e5m2 operands (\"Multiplication of two Float8_e5m2 matrices is not supported\", "
                "cuBLASLt's restriction), and Q·Kᵀ here would multiply e5m2 Q by e5m2 K")

#: How torch's `_scaled_mm` words a refusal of its operands (TORCH_CHECK / TORCH_CHECK_VALUE in Blas.cpp, the meta checks, cuBLASLt).
SCALED_MM_REFUSALS = ("Float8_e5m2 matrices", "divisible by 16", "row_major", "col_major", "CUBLAS_STATUS_NOT_SUPPORTED", "is not supported")


def _up(n: int) -> int:
    """`n` rounded up to a multiple of SCALED_MM_MULTIPLE."""
    return -(-n // SCALED_MM_MULTIPLE) * SCALED_MM_MULTIPLE


def scaled_mm_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, S_q: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q and K (row-major, d_k padded), V column-major per head (S_kv and d_v padded) and the mask hiding padded keys: `_scaled_mm`'s layout."""
    B, S_kv, d_k, d_v = k.shape[0], k.shape[2], k.shape[3], v.shape[3]
    pad_k, pad_s, pad_v = _up(d_k) - d_k, _up(S_kv) - S_kv, _up(d_v) - d_v
    # F.pad has no float8 kernel: pad in float32, where every FP8 value and zero is exact, and cast back
    q = F.pad(q.float(), (0, pad_k)).to(q.dtype).contiguous() if pad_k else q.contiguous()
    k = F.pad(k.float(), (0, pad_k, 0, pad_s)).to(k.dtype).contiguous() if pad_k or pad_s else k.contiguous()
    v = F.pad(v.float(), (0, pad_v, 0, pad_s)).to(v.dtype) if pad_v or pad_s else v
    v_cols = v.transpose(-2, -1).contiguous().transpose(-2, -1)  # [.., S_kv, d_v] with column-major strides
    if pad_s:
        real = torch.ones(B, 1, S_q, S_kv, dtype=torch.bool, device=q.device) if mask is None else mask
        mask = F.pad(real, (0, pad_s), value=False)
    return q, k, v_cols, mask


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v_cols: torch.Tensor, descales: dict[str, torch.Tensor], mask: torch.Tensor | None,
                  scale: float, fmt: str, d_v: int | None = None) -> torch.Tensor:
    """FP8 `[B, H, S_q, d_k]` queries over FP8 K `[B, H_kv, S_kv, d_k]` and V (column-major per head), out `[B, H, S_q, d_v]` in bf16.

    `descales` holds q's, k's and v's, and "p": P's, the unit scale (made in prepare); `d_v` the output's width when V is padded."""
    B, H, S_q, _ = q.shape
    H_kv = k.shape[1]
    d_v = d_v or v_cols.shape[-1]
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
            out[b, h] = (numerator[:, :d_v] / torch.where(sums > 0, sums, torch.ones_like(sums))).to(FP8_OUTPUT_DTYPE)
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

    def own_refusals(self, case: Case) -> list[str]:
        """FP8 Q, K and V are declared (`dtypes`); CUDA's `_scaled_mm` multiplies no two e5m2 operands."""
        return [E5M2_REFUSAL] if case.device == "cuda" and case.dtype == "fp8_e5m2" else []

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """The mask once and `_scaled_mm`'s layout (both untimed), one trial call (a refusal is unsupported here), then the FP8 attention."""
        mask = visible_mask(case, device=inputs.q.device)
        q, k, v_cols, mask = scaled_mm_layout(inputs.q, inputs.k, inputs.v, mask, case.S_q)
        # P needs no scale (its largest is 1): the unit descale made here, not in each timed call.
        descales: dict[str, Any] = {**(inputs.descales or {}), "p": torch.ones((), dtype=torch.float32, device=q.device)}
        scale, fmt, d_v = case.softmax_scale, case.dtype, inputs.v.shape[-1]

        def attention() -> torch.Tensor:
            return fp8_attention(q, k, v_cols, descales, mask, scale, fmt, d_v)

        try:
            attention()
        except (RuntimeError, ValueError) as exc:
            message = " ".join(str(exc).split())
            if not any(phrase in message for phrase in SCALED_MM_REFUSALS):
                raise  # not a refusal of this case's shape or format: a bug, reported as the error it is
            raise Unsupported(f"eager-fp8: torch._scaled_mm refused this case: {message[:200]}") from None
        notes: dict[str, Any] = {"gemm": "torch._scaled_mm"}
        if (q.shape[-1], k.shape[2], v_cols.shape[-1]) != (inputs.q.shape[-1], inputs.k.shape[2], d_v):
            notes["padded_to_16"] = f"d_k {q.shape[-1]}, S_kv {k.shape[2]}, d_v {v_cols.shape[-1]}"
        return Prepared(fn=attention, notes=notes)
