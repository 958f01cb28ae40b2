"""`naive-compiled`: torch.compile of the naive backend, so users see what the compiler alone buys.

The same eager code as `naive` (matmul → masked softmax → matmul), compiled once per case with
static shapes and no graph breaks; inductor may fuse the softmax and the masking but still
materialises the scores. Compile time is recorded in `compile_s`, never in latency.
"""

from __future__ import annotations

from typing import Any

from harness.backends.base import Backend, Prepared
from harness.backends.pytorch.flex import compile_timed, compiler_reason, fresh_compile
from harness.attention.eager import naive_attention
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask


@register
class NaiveCompiledBackend(Backend):
    """torch.compile(naive_attention): the eager baseline through inductor."""

    name = "naive-compiled"
    family = "compiled"
    materializes_scores = True
    description = "torch.compile of the naive backend (still materialises the scores); compile time in compile_s"
    native_gqa = True

    def available(self) -> str | None:
        """Needs torch.compile and, on a CPU-only machine, a C++ compiler."""
        import torch

        if not hasattr(torch, "compile"):
            return f"torch {torch.__version__} has no torch.compile"
        return compiler_reason("cpu") if not torch.cuda.is_available() else None

    def own_refusals(self, case: Case) -> list[str]:
        """Inductor must be able to generate code for the device."""
        reason = compiler_reason(case.device)
        return [reason] if reason else []

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Build the mask, compile (timed apart, in compile_s), and return the compiled call."""
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        compiled = fresh_compile(naive_attention)

        def fn() -> Any:
            return compiled(q, k, v, mask)

        compile_s = compile_timed(fn, case, (q, k, v))
        return Prepared(fn=fn, leaves=(q, k, v), compile_s=compile_s, notes={"compiler": "inductor"})
