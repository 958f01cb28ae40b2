"""Test-only backends that claim a kernel: one keeps its claim (torch._scaled_mm on float8 tensors), one breaks it (bf16 matmuls).

Never registered in the built-in registry. Tests add them to a registry by hand (`add_all`), and a run sees them
through `ATTNBENCH_BACKENDS=tests.kernel_claim_backends:add_all`. Each claims its FP8 kernel for every case, dense
bf16 ones included, through its own `kernel_claim`, so the proof is exercised without an FP8 case.
"""

from __future__ import annotations

import math

import torch

from harness.attention.eager import naive_attention
from harness.backends.base import Backend, Prepared
from harness.backends.kernel_claims import KernelClaim
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask

#: The claim both stand-ins make: torch's FP8 GEMM operator, and no GEMM on wide operands beside it.
FP8_CLAIM = KernelClaim((("FP8", ("_scaled_mm",)),), no_wide_gemms=True)


class _ClaimsFp8(Backend):
    """A backend that claims torch._scaled_mm for every case (the FP8 claim, made whatever the case's dtype)."""

    family = "test-kernel-claims"
    native_gqa = True
    supports_backward = False
    fp8_kernels = ("_scaled_mm",)

    def kernel_claim(self, case: Case) -> KernelClaim:
        """The FP8 claim, for every case."""
        return FP8_CLAIM


class Bf16ClaimsFp8Backend(_ClaimsFp8):
    """Claims an FP8 GEMM but computes eager attention with plain bf16 matmuls: the silent fallback the proof must catch."""

    name = "claims-fp8-runs-bf16"
    description = "claims torch._scaled_mm, runs bf16 matmuls"

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Eager attention in the case's dtype (bf16): aten::matmul → aten::bmm on bf16 operands."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        return Prepared(fn=lambda: naive_attention(q, k, v, mask), leaves=(q, k, v))


class ScaledMmBackend(_ClaimsFp8):
    """Keeps the claim: both attention GEMMs through torch._scaled_mm on float8_e4m3fn operands (its numbers are FP8's, not bf16's)."""

    name = "claims-fp8-runs-scaled-mm"
    description = "Q·Kᵀ and P·V through torch._scaled_mm on float8 tensors"

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Q, K and V cast to float8 once (untimed), then per (batch, head) two FP8 GEMMs and an fp32 softmax."""
        fp8 = torch.float8_e4m3fn
        q, k = inputs.q.detach().to(fp8), inputs.k.detach().to(fp8)
        v_cols = inputs.v.detach().to(fp8).transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major per head, as _scaled_mm's B
        one = torch.tensor(1.0)
        g, scale = case.H // case.H_kv, 1.0 / math.sqrt(case.d_k)

        def fn() -> torch.Tensor:
            out = torch.empty(case.B, case.H, case.S_q, case.d_v, dtype=torch.bfloat16)
            for b in range(case.B):
                for h in range(case.H):
                    scores = torch._scaled_mm(q[b, h], k[b, h // g].t(), scale_a=one, scale_b=one, out_dtype=torch.float32) * scale
                    weights = torch.softmax(scores, dim=-1)
                    out[b, h] = torch._scaled_mm(weights.to(fp8), v_cols[b, h // g], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return out

        return Prepared(fn=fn)


KERNEL_CLAIM_BACKENDS = (Bf16ClaimsFp8Backend, ScaledMmBackend)


def add_all(registry) -> None:
    """Add every stand-in to `registry` (the `ATTNBENCH_BACKENDS` hook)."""
    for cls in KERNEL_CLAIM_BACKENDS:
        registry.add(cls())
