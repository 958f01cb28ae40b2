"""Numerical agreement of a backend's output with a float64 reference computed from the very same inputs.

Rule (the one FlashAttention's own tests use): with `ref` the float64 result, `lp` the plain eager
computation in the case's own dtype and `out` the backend's,

    err  = max|out − ref|,   base = max|lp − ref|,   agree  ⇔  err ≤ 2·base + atol(dtype, max|ref|)

so a backend may be up to twice as far from the truth as eager PyTorch in the same precision is,
plus one rounding of the largest element and a floor for accumulation order (`atol`), which matter
where eager happens to be almost exact. NaN or Inf never agrees.
In backward modes the rule applies to dQ, dK and dV separately, and all three must agree.

What the rule can resolve depends on the dtype. In fp32 an honest kernel is ~1e-6 from the
reference, so a softmax scale off by 1 % (an error near 2e-2) fails by four orders of magnitude.
In bf16, eager itself rounds every score and weight to 8 significant bits and lands ~1e-2 from the
reference, which is the size of that same 1 % scale error: no bound that honest bf16 kernels pass
can reliably reject it. Bugs that do not depend on the dtype (scale, mask, head grouping) must
therefore be checked on fp32 cases too; `harness.checks.correctness` does so by default (see `CHECK_CASES`).

The reference is written here, independently of every backend (including the naive one): K/V
heads are picked per (batch, K/V head) slice, so query heads g·h … g·h+g−1 read K/V head h.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

import torch

from harness.attention.fp8 import fp8_eager_kernel
from harness.suite.inputs import FP8_FORMATS
from harness.attention.reference import (
    Kernel, ReferenceCache, cached, default_scale, eager_kernel, forward, gradient_slices, gradients, query_rows,
    ragged_forward, ragged_rows, reference_device, reference_kernel,
)
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, empty_query_rows, output_dtype, visible_mask
from harness.suite.ragged import RaggedInputs

#: Unit roundoff u (half the spacing of numbers just above 1) per dtype: the relative error of one rounding.
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# An FP8 case's output is bf16: one more rounding of it is bf16's (what FP8 costs beyond that is in the eager model's error).
UNIT_ROUNDOFF |= {"fp8_e4m3": UNIT_ROUNDOFF["bf16"], "fp8_e5m2": UNIT_ROUNDOFF["bf16"]}

#: Absolute floor of the bound, per dtype: what differences in accumulation order cost. Every
#: kernel here accumulates in at least fp32, whose reordering error over S_kv terms is about
#: √S_kv·2⁻²⁴ ≈ 8e-6 at S_kv = 16k → 1e-5; fp64 is the reference's own precision.
ATOL = {"fp64": 1e-12, "fp32": 1e-5, "fp16": 1e-5, "bf16": 1e-5, "fp8_e4m3": 1e-5, "fp8_e5m2": 1e-5}


def atol(dtype: str, magnitude: float) -> float:
    """The absolute term of the bound for a tensor whose largest reference element is `magnitude`.

    The floor, plus one rounding of the largest element (u·max|ref|): an honest kernel may round
    once more than eager does (e.g. storing per-head gradients in the dtype before summing them
    over a GQA group), and gradients, unlike outputs, are not bounded by the values' magnitude.
    For a forward output (|o| ≲ 3) that is ≈ 1.2e-2 in bf16 and 1.5e-3 in fp16, half an ulp of the output.
    """
    return ATOL[dtype] + UNIT_ROUNDOFF[dtype] * magnitude


#: Machine epsilon (spacing of numbers just above 1) per dtype: the tolerance of a row of weights summing to 1.
EPS = {name: 2 * u for name, u in UNIT_ROUNDOFF.items()}

@dataclass(frozen=True)
class Agreement:
    """The agreement columns of a record (`agree` is None when the case was not checked, with `check_note`)."""

    max_abs_err: float | None
    err_bound: float | None
    rel_err: float | None
    agree: bool | None
    check_note: str | None = None
    #: Largest |value| a backend wrote into query rows that see no key (the reference's are 0); None when
    #: the case has no such rows. Not part of the verdict: a behaviour to show, not an error.
    masked_rows_max_abs: float | None = None

    def columns(self) -> dict:
        """As record columns."""
        return asdict(self)

    def disagreeing(self, note: str) -> "Agreement":
        """The same errors, but failed, with `note` saying why (a problem the error numbers cannot show)."""
        return replace(self, agree=False).with_note(note)

    def with_note(self, note: str | None) -> "Agreement":
        """The same result with `note` appended to its check note."""
        if not note:
            return self
        return replace(self, check_note=f"{self.check_note}; {note}" if self.check_note else note)


def _pick(t: torch.Tensor, slices: Sequence[tuple[int, int]], heads_per_slice: int) -> torch.Tensor:
    """The elements of the given (batch, K/V head) slices of a `[B, heads, S, d]` tensor, flattened."""
    n = heads_per_slice
    return torch.cat([t[b, h * n : (h + 1) * n].reshape(-1) for b, h in slices])


@dataclass(frozen=True)
class Expected:
    """One float64 reference tensor and what the rule takes from it and from eager: made once per case, compared with every backend."""

    ref: torch.Tensor
    #: 2·max|eager − ref| + atol: the error a backend may have.
    bound: float
    norm: float
    note: str | None = None


def expected(ref: torch.Tensor, lp: torch.Tensor, dtype: str) -> Expected:
    """The rule's side of a comparison: `ref` in float64 and eager `lp` in the case's precision (same shapes)."""
    bad_ref = int((~torch.isfinite(ref)).sum())
    if bad_ref:
        # The reference is the harness's own: unwritten (NaN-poisoned) elements there are a harness bug, not a verdict.
        raise RuntimeError(f"float64 reference has {bad_ref} non-finite elements (unwritten slices?)")
    lp64 = lp.detach().to(ref.device, torch.float64)
    note = None
    lp_finite = torch.isfinite(lp64)
    if not bool(lp_finite.all()):
        # Eager overflowed in this dtype: its error is unknown there, so the bound uses its finite part only.
        note = f"eager {dtype} has {int((~lp_finite).sum())} non-finite elements; bound from the finite ones"
        lp64 = torch.where(lp_finite, lp64, ref)
    base = float((lp64 - ref).abs().max()) if ref.numel() else 0.0
    bound = 2 * base + atol(dtype, float(ref.abs().max()) if ref.numel() else 0.0)
    return Expected(ref, bound, float(ref.norm()), note)


def compare(out: torch.Tensor, target: Expected) -> Agreement:
    """Apply the rule to one backend tensor `out` (in its precision) against its expected value."""
    ref = target.ref
    if tuple(out.shape) != tuple(ref.shape):
        return Agreement(None, None, None, False, f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    out64 = out.detach().to(ref.device, torch.float64)
    bad = int((~torch.isfinite(out64)).sum())
    if bad:
        return Agreement(math.inf, None, math.inf, False, f"{bad} non-finite output elements (NaN/Inf, or never written)")
    diff = out64 - ref
    err = float(diff.abs().max()) if ref.numel() else 0.0
    rel = float(diff.norm()) / target.norm if target.norm > 0 else float(diff.norm())
    return Agreement(err, target.bound, rel, err <= target.bound, target.note)


def error_against(out: torch.Tensor, ref: torch.Tensor, lp: torch.Tensor, dtype: str) -> Agreement:
    """Apply the rule to one tensor: `out` and `lp` in their precision, `ref` in float64 (`compare` checks the shapes)."""
    return compare(out, expected(ref, lp, dtype))


def check_forward(case: Case, inputs: AttentionInputs, output_bhsd: torch.Tensor, references: ReferenceCache | None = None) -> Agreement:
    """Compare a backend's forward output `[B, H, S_q, d_v]` with the float64 reference on the same inputs."""
    shape = (case.B, case.H, case.S_q, case.d_v)
    if tuple(output_bhsd.shape) != shape:
        return Agreement(None, None, None, False, f"output shape {tuple(output_bhsd.shape)}, expected {shape}")
    device, scale = reference_device(case), default_scale(case)
    rows = query_rows(case)
    target = cached(references, ("fwd", case), inputs, lambda: expected(
        forward(case, inputs, reference_kernel(scale, case.softcap), torch.float64, device, rows),
        forward(case, inputs, *eager_model(case, inputs), rows),
        case.dtype,
    ))
    out = output_bhsd if rows is None else output_bhsd[:, :, rows.to(output_bhsd.device)]
    empty = empty_query_rows(case)
    if empty is not None and rows is not None:
        empty = empty[:, rows]
    if empty is None or not bool(empty.any()):
        result = compare(out, target)
    else:
        # Rows that see no key have no softmax: kernels differ on what they write there (0, or a mean of V).
        # The verdict is on the rows that see a key; what the backend wrote into the others is its own column.
        hidden = empty[:, None, :, None].to(out.device).expand_as(out)
        written = out.detach()[hidden].double().abs()
        finite = bool(torch.isfinite(written).all())
        most = float(written.max()) if finite else math.inf
        result = compare(torch.where(hidden, torch.zeros_like(out), out), target)
        result = replace(result, masked_rows_max_abs=most if finite else None)
        if not finite:  # NaN or Inf never agrees: it poisons whatever reads the row next
            result = result.disagreeing("writes NaN/Inf into query rows that see no key")
        elif most > 0:
            result = result.with_note(f"writes non-zero into fully masked query rows (max |out| {most:.3g}; judged on the rows that see a key)")
    if rows is not None:
        result = result.with_note(f"{len(rows)} of {case.S_q} query rows checked")
    return _dtype_verdict(result, "output", output_bhsd, case)


def eager_model(case: Case, inputs: AttentionInputs) -> tuple[Kernel, torch.dtype, torch.device]:
    """The rule's eager side of a case: the kernel, the dtype it computes its inputs in, and where.

    Eager attention in the inputs' dtype, except an FP8 case's: fp32 over the dequantized inputs with P rounded to FP8
    (harness.attention.fp8, FlashAttention 3's FP8 recipe), since no eager matmul computes in FP8.
    """
    if case.dtype in FP8_FORMATS:
        return fp8_eager_kernel(default_scale(case), case.dtype), torch.float32, inputs.q.device
    return eager_kernel(default_scale(case), case.softcap), inputs.q.dtype, inputs.q.device


def check_ragged_forward(case: Case, inputs: RaggedInputs, output_packed: torch.Tensor, references: ReferenceCache | None = None) -> Agreement:
    """Compare a backend's packed output `[T_q, H, d_v]` of a ragged batch with each request's own float64 reference.

    Every layout of one batch (same lengths, same seed) draws the same q, k, v, so the cache's key leaves the
    layout out: the padded, packed and paged rows of a batch share one reference (verified on the inputs).
    """
    shape = (sum(case.seq_lens_q), case.H, case.d_v)
    if tuple(output_packed.shape) != shape:
        return Agreement(None, None, None, False, f"output shape {tuple(output_packed.shape)}, expected the packed {shape}")
    device, scale, rows = reference_device(case), default_scale(case), ragged_rows(case)
    target = cached(references, ("ragged-fwd", case.replace(layout="packed", page_size=None)), inputs, lambda: expected(
        ragged_forward(case, inputs, reference_kernel(scale, case.softcap), torch.float64, device, rows),
        ragged_forward(case, inputs, eager_kernel(scale, case.softcap), inputs.q.dtype, inputs.q.device, rows),
        case.dtype,
    ))
    out = output_packed if rows is None else output_packed[rows.to(output_packed.device)]
    result = compare(out, target)
    if rows is not None:
        result = result.with_note(f"{len(rows)} of {shape[0]} query rows checked")
    return _dtype_verdict(result, "output", output_packed, case)


def _dtype_verdict(result: Agreement, what: str, out: torch.Tensor, case: Case) -> Agreement:
    """`result`, failed when `out` is not in the case's dtype: a drop-in kernel that returns another dtype is a wrong answer."""
    wanted = output_dtype(case)
    if out.dtype == wanted:
        return result
    return result.disagreeing(f"{what} dtype {str(out.dtype).removeprefix('torch.')}, expected the case's {str(wanted).removeprefix('torch.')}")


GRADIENT_NAMES = ("dq", "dk", "dv")


def check_gradients(case: Case, inputs: AttentionInputs, grads_bhsd: Sequence[torch.Tensor],
                    references: ReferenceCache | None = None) -> dict[str, Agreement]:
    """The rule applied to dQ, dK and dV separately (empty when the case is too large to check)."""
    slices = gradient_slices(case)
    if not slices:
        return {}
    device, scale = reference_device(case), default_scale(case)
    partial = len(slices) < case.B * case.H_kv

    heads = {name: case.group_size if name == "dq" else 1 for name in GRADIENT_NAMES}  # per slice: g query heads, one K/V head

    def targets() -> list[tuple[tuple[int, ...], Expected]]:
        ref = gradients(case, inputs, reference_kernel(scale, case.softcap), torch.float64, device, slices)
        lp = gradients(case, inputs, eager_kernel(scale, case.softcap), inputs.q.dtype, inputs.q.device, slices)
        picked = []
        for name, r, low in zip(GRADIENT_NAMES, ref, lp):
            shape = tuple(r.shape)
            if partial:
                r, low = _pick(r, slices, heads[name]), _pick(low, slices, heads[name])
            picked.append((shape, expected(r, low, case.dtype)))
        return picked

    results = {}
    for name, out, (shape, target) in zip(GRADIENT_NAMES, grads_bhsd, cached(references, ("bwd", case), inputs, targets)):
        if tuple(out.shape) != shape:
            results[name] = Agreement(None, None, None, False, f"{name} shape {tuple(out.shape)}, expected {shape}")
            continue
        results[name] = _dtype_verdict(compare(_pick(out, slices, heads[name]) if partial else out, target), name, out, case)
    return results


def check_backward(case: Case, inputs: AttentionInputs, grads_bhsd: Sequence[torch.Tensor],
                   references: ReferenceCache | None = None) -> Agreement:
    """Compare dQ, dK, dV with the float64 reference's; the worst of the three is reported, and agree needs all three."""
    if len(grads_bhsd) != 3:
        return Agreement(None, None, None, False, f"expected 3 gradients (dq, dk, dv), got {len(grads_bhsd)}")
    per = check_gradients(case, inputs, grads_bhsd, references)
    if not per:
        return Agreement(None, None, None, None, "gradients not checked: one (batch, K/V head) slice is too large for a float64 reference")

    def badness(a: Agreement) -> tuple[bool, float]:
        if a.max_abs_err is None or a.err_bound is None:
            return (not a.agree, math.inf)
        return (not a.agree, a.max_abs_err / a.err_bound)

    worst = max(per.values(), key=badness)
    failing = [n for n, a in per.items() if not a.agree]
    notes = [f"{n}: {a.check_note}" for n, a in per.items() if a.check_note]
    if failing:
        notes.insert(0, f"disagreeing: {', '.join(failing)}")
    slices = gradient_slices(case)
    if len(slices) < case.B * case.H_kv:
        notes.append(f"{len(slices)} of {case.B * case.H_kv} (batch, K/V head) slices checked")
    rels = [a.rel_err for a in per.values() if a.rel_err is not None]
    return Agreement(worst.max_abs_err, worst.err_bound, max(rels) if rels else None, all(a.agree for a in per.values()), "; ".join(notes) or None)


def weights_violations(case: Case, weights: torch.Tensor) -> list[str]:
    """What is wrong with attention weights `[B, H, S_q, S_kv]` for a case: rows must sum to 1 (at most 1 with sinks), hidden positions be exactly 0.

    A row's tolerance is the textbook bound on its two roundings: the softmax denominator is a sum
    of S_kv positive terms accumulated in at least fp32 (relative error ≤ (S_kv − 1)·u), and each
    weight is then rounded once to the case's dtype (≤ u each, so ≤ u on a sum of 1); with u = ε/2,
    ε + S_kv·ε_acc covers both. A row with no visible key must be all zeros. An empty list means
    the weights are right.
    """
    problems: list[str] = []
    expected = (case.B, case.H, case.S_q, case.S_kv)
    if tuple(weights.shape) != expected:
        return [f"weights shape {tuple(weights.shape)}, expected {expected}"]
    w = weights.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(w).all()):
        problems.append(f"{int((~torch.isfinite(w)).sum())} non-finite weights")
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    if bool((w < 0).any()):
        problems.append(f"{int((w < 0).sum())} negative weights")
    mask = visible_mask(case)
    if mask is None:
        mask = torch.ones(1, 1, case.S_q, case.S_kv, dtype=torch.bool)
    hidden = ~mask.expand_as(w)
    leaked = int((w[hidden] != 0).sum())
    if leaked:
        problems.append(f"{leaked} masked positions have nonzero weight")
    sums = w.sum(dim=-1)
    want = mask.any(dim=-1).expand_as(sums).to(torch.float64)
    off = (sums - want).abs()
    tol = EPS[case.dtype] + case.S_kv * EPS["fp64" if case.dtype == "fp64" else "fp32"]
    if case.sinks:
        # The sink's own share of each row is no key's weight: a row sums to less than 1 (by that share), never more.
        over = sums - want
        if bool((over > tol).any()):
            problems.append(f"{int((over > tol).sum())} rows sum to more than 1 (worst by {float(over.max()):.3g}, tolerance {tol:.3g})")
    elif bool((off > tol).any()):
        problems.append(f"{int((off > tol).sum())} rows do not sum to 1 (worst off by {float(off.max()):.3g}, tolerance {tol:.3g})")
    return problems


Check = Callable[[Case, AttentionInputs, torch.Tensor], Agreement]
