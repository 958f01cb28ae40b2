"""Numerical agreement of a backend's output with a float64 reference computed from the very same inputs.

Rule (the one FlashAttention's own tests use): with `ref` the float64 result, `lp` the plain eager
computation in the case's own dtype and `out` the backend's,

    err  = max|out − ref|,   base = max|lp − ref|,   agree  ⇔  err ≤ 2·base + atol(dtype)

so a backend may be up to twice as far from the truth as eager PyTorch in the same precision is,
plus an absolute floor for cases where eager happens to be almost exact. NaN or Inf never agrees.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from harness.backends.naive import naive_attention
from harness.cases import Case
from harness.inputs import AttentionInputs, visible_mask

#: Absolute floor of the bound, per dtype. Outputs are convex combinations of standard-normal
#: values (|o| ≲ 4), so one rounding of the output alone is up to half an ulp at 4:
#: bf16 (8 mantissa bits) 2⁻⁷·4/2 ≈ 1.6e-2 → 1e-2 leaves room for an honest kernel that rounds
#: once more than eager; fp16 (11 bits) 2⁻¹⁰·2 ≈ 2e-3 → 1e-3; fp32 accumulates over S_kv terms
#: in another order, about √S_kv·2⁻²⁴ ≈ 2e-6 at S_kv = 16k → 1e-5; fp64 is the reference itself.
ATOL = {"fp64": 1e-12, "fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-2}

#: Above this many score elements (B·H·S_q·S_kv) the forward reference uses a sample of query rows.
MAX_REFERENCE_SCORES = 2**26
#: Query rows sampled for the forward reference of a large case.
SAMPLED_ROWS = 128


@dataclass(frozen=True)
class Agreement:
    """The agreement columns of a record (`agree` is None when the case was not checked, with `check_note`)."""

    max_abs_err: float | None
    err_bound: float | None
    rel_err: float | None
    agree: bool | None
    check_note: str | None = None

    def columns(self) -> dict:
        """As record columns."""
        return asdict(self)


def reference_device(case: Case) -> torch.device:
    """Where the float64 reference runs: the CPU, except for CUDA cases (a CPU float64 pass at those sizes takes minutes)."""
    return torch.device("cuda") if case.device == "cuda" else torch.device("cpu")


def query_rows(case: Case) -> torch.Tensor | None:
    """The query rows the forward check compares: all (None), or a seeded sample including the first and last."""
    if case.B * case.H * case.S_q * case.S_kv <= MAX_REFERENCE_SCORES or case.S_q <= SAMPLED_ROWS:
        return None
    rng = np.random.default_rng([case.seed, 0xC4EC])
    rows = rng.choice(case.S_q, size=SAMPLED_ROWS - 2, replace=False)
    return torch.as_tensor(sorted({0, case.S_q - 1, *rows.tolist()}))


def _attention(case: Case, inputs: AttentionInputs, dtype: torch.dtype, device: torch.device, rows: torch.Tensor | None) -> torch.Tensor:
    q, k, v = (t.detach().to(device=device, dtype=dtype) for t in (inputs.q, inputs.k, inputs.v))
    mask = visible_mask(case, device=device)
    if rows is not None:
        rows = rows.to(device)
        q = q[:, :, rows]
        mask = mask[:, :, rows] if mask is not None else None
    return naive_attention(q, k, v, mask, scale=1.0 / math.sqrt(case.d_k))


def error_against(out: torch.Tensor, ref: torch.Tensor, lp: torch.Tensor, dtype: str) -> Agreement:
    """Apply the rule to one tensor: `out` and `lp` in their precision, `ref` in float64 (same shapes)."""
    out64, lp64 = out.detach().to(ref.device, torch.float64), lp.detach().to(ref.device, torch.float64)
    if not torch.isfinite(out64).all():
        bad = int((~torch.isfinite(out64)).sum())
        return Agreement(math.inf, None, math.inf, False, f"{bad} non-finite output elements")
    err = float((out64 - ref).abs().max()) if ref.numel() else 0.0
    base = float((lp64 - ref).abs().max()) if ref.numel() else 0.0
    bound = 2 * base + ATOL[dtype]
    norm = float(ref.norm())
    rel = float((out64 - ref).norm()) / norm if norm > 0 else float((out64 - ref).norm())
    return Agreement(err, bound, rel, err <= bound)


def check_forward(case: Case, inputs: AttentionInputs, output_bhsd: torch.Tensor) -> Agreement:
    """Compare a backend's forward output `[B, H, S_q, d_v]` with the float64 reference on the same inputs."""
    device = reference_device(case)
    rows = query_rows(case)
    ref = _attention(case, inputs, torch.float64, device, rows)
    lp = _attention(case, inputs, inputs.q.dtype, inputs.q.device, rows)
    out = output_bhsd if rows is None else output_bhsd[:, :, rows.to(output_bhsd.device)]
    result = error_against(out, ref, lp, case.dtype)
    if rows is not None:
        result = Agreement(result.max_abs_err, result.err_bound, result.rel_err, result.agree, f"{len(rows)} of {case.S_q} query rows checked")
    return result


def _gradients(case: Case, inputs: AttentionInputs, dtype: torch.dtype, device: torch.device) -> Sequence[torch.Tensor]:
    q, k, v = (t.detach().to(device=device, dtype=dtype).requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = naive_attention(q, k, v, visible_mask(case, device=device))
    return torch.autograd.grad(out, (q, k, v), inputs.grad_out.to(device=device, dtype=dtype))


def check_backward(case: Case, inputs: AttentionInputs, grads_bhsd: Sequence[torch.Tensor]) -> Agreement:
    """Compare dQ, dK, dV with the float64 reference's; the worst of the three is reported."""
    if case.B * case.H * case.S_q * case.S_kv > MAX_REFERENCE_SCORES:
        return Agreement(None, None, None, None, "gradients not checked: case too large for a float64 reference")
    ref = _gradients(case, inputs, torch.float64, reference_device(case))
    lp = _gradients(case, inputs, inputs.q.dtype, inputs.q.device)
    results = [error_against(o, r, l, case.dtype) for o, r, l in zip(grads_bhsd, ref, lp)]
    worst = max(results, key=lambda a: (not a.agree, (a.max_abs_err or 0) / (a.err_bound or 1)))
    names = ("dq", "dk", "dv")
    failing = [n for n, a in zip(names, results) if not a.agree]
    note = f"disagreeing: {', '.join(failing)}" if failing else None
    return Agreement(worst.max_abs_err, worst.err_bound, max(a.rel_err for a in results), all(a.agree for a in results), note)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer shaped like `t` filled with NaN, so that elements a kernel never writes show up."""
    return torch.full_like(t, float("nan"))


Check = Callable[[Case, AttentionInputs, torch.Tensor], Agreement]
