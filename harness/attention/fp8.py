"""FP8 attention's numbers: the seeded inputs' dequantized values and the FP8 eager model (the inputs are quantized
where they are drawn, harness.suite.inputs).

An FP8 case hands every backend Q, K and V (or, with `kv_dtype`, K and V alone) in an FP8 format, each with one
float32 descale: `x ≈ x_fp8 · descale`. The inputs are drawn as every case's are (seeded, standard normal, in
float32) and quantized once: descale = max|x| / the format's largest finite value, so the largest element lands on
it and nothing saturates. The quantization error is the input's, not the kernel's: the float64 reference attends
over the dequantized values (`dequantized`), exactly what the FP8 tensors hold.

What an FP8 kernel must round beyond its inputs is the attention weights P before the second GEMM (P·V reads FP8
operands: that is what makes the kernel FP8), accumulating both GEMMs in fp32, and the output (bf16). The rule's
eager side (`fp8_eager_kernel`) does exactly that on the dequantized inputs, so the bound (twice its error from the
float64 reference, plus the output's own rounding, as for every dtype) admits an FP8 kernel and refuses one that is
wrong: FlashAttention's FP8 benchmark judges its FP8 forward against the same dequantized baseline. Its resolution is
coarser than bf16's: on the CPU test shapes an output wrong by 5 % disagreed, one wrong by 3 % agreed in a causal case
(the bound is twice P's FP8 rounding error, about 2-4 % of the largest output there). A kernel that
silently dequantizes and runs in bf16 agrees too (it is closer to the reference): agreement cannot tell them apart,
which is why FP8 rows carry the profiler's kernel names.
"""

from __future__ import annotations

import torch

from harness.suite.inputs import FP8_FORMATS

#: What an FP8 attention returns: its output is bf16 (FlashAttention 3's FP8 forward, cuDNN's, FlashInfer's).
FP8_OUTPUT_DTYPE = torch.bfloat16


def dequantized(t: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """An FP8 tensor's values in float32 (exact: every FP8 value times a float32 scale is one rounding at most); other tensors as they are."""
    if t.dtype not in FP8_FORMATS.values():
        return t
    return t.float() * descale.to(t.device)


def round_to(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """`x` rounded to the FP8 format `fmt` and back to its dtype (values above the format's max saturate to it, as kernels clamp)."""
    dtype = FP8_FORMATS[fmt]
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype).to(x.dtype)


def fp8_eager_kernel(scale: float, fmt: str):
    """The rule's eager side of an FP8 case, as a slice kernel over dequantized inputs: FlashAttention 3's FP8 recipe.

    Scores and the online softmax in fp32; the unnormalised weights exp(s − rowmax), each row's largest exactly 1,
    rounded to `fmt` for the P·V GEMM (fp32 accumulation) while the row sums come from the fp32 weights; the output,
    divided by them, rounded to bf16. A row that sees no key is 0. No score variant: FP8 cases take none.
    """
    def kernel(q, k, v, mask, terms=None):
        if terms is not None and any(t is not None for t in terms):
            raise ValueError("the FP8 eager model has no score variant (softcap, sinks, ALiBi)")
        H, H_kv = q.shape[1], k.shape[1]
        heads = torch.arange(H, device=q.device) // (H // H_kv)
        k32, v32 = k.float().index_select(1, heads), v.float().index_select(1, heads)
        scores = torch.matmul(q.float() * scale, k32.transpose(-2, -1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        top = scores.amax(dim=-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(scores - top)  # masked keys: exp(−inf) = 0
        sums = weights.sum(dim=-1, keepdim=True)
        out = torch.matmul(round_to(weights, fmt), v32) / torch.where(sums > 0, sums, torch.ones_like(sums))
        return out.to(FP8_OUTPUT_DTYPE)

    return kernel


def scaled_mm_product(m: int, k: int, n: int, fmt: str, device: str, generator: torch.Generator):
    """One FP8 GEMM as the FP8 kernels run it (`torch._scaled_mm`, row-major A, column-major B, unit descales, fp32 out), on seeded operands.

    `torch.matmul` has no float8 kernel on CUDA; `_scaled_mm` is the FP8 tensor-core path (FlashAttention 3's FP8 GEMMs run on
    the same units). CUDA's refuses two e5m2 operands (Blas.cpp): an e5m2 product reads an e4m3 B (on every device, one rule),
    the mixed pair cuBLASLt takes at the same rate. K and N must be multiples of 16 on CUDA (the ceiling's 8192² is).
    """
    a_dtype = FP8_FORMATS[fmt]
    b_dtype = torch.float8_e4m3fn if a_dtype == torch.float8_e5m2 else a_dtype

    def draw(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator, device=device, dtype=torch.float32).to(dtype)

    a, b = draw(m, k, a_dtype), draw(n, k, b_dtype).t()  # b: [k, n], column-major
    one = torch.ones((), dtype=torch.float32, device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
