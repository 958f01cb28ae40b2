"""`attnbench check`: numerical agreement alone, fast and untimed, over a suite or a built-in grid.

Each (case, backend) pair gets fresh seeded inputs, one call through the same path a benchmark
record's check takes (`runner.build_step` and `runner.check`), and the float64 rule of
`harness.measure.numerics`. Unsupported pairs are listed as such and are not failures; a disagreement, a
non-finite output, a backend that changes its inputs, wrong attention weights or an exception in
a pair the backend claims to support is a failure, and the command exits 1 naming each one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TextIO

import torch

from harness.backends.base import Backend
from harness.suite.cases import Case, canonical_dtype, grid
from harness.errors import Unsupported, UserError
from harness.suite.inputs import make_inputs
from harness.measure.numerics import Agreement, weights_violations
from harness.measure.execute import build_step, flag_modified_inputs, input_fingerprints, is_oom
from harness.measure.execute import check as check_result

#: Exit status when some available backend disagrees (2 stays the usage-error status).
EXIT_DISAGREE = 1

#: Statuses of one checked pair; only the last two fail the check.
STATUSES = ("agree", "unsupported", "not checked", "oom", "disagree", "error")
FAILING = ("disagree", "error")


def default_cases(device: str = "cpu") -> list[Case]:
    """The built-in check grid: small, and covering what the rule must see.

    fp32 beside fp16 and bf16 on every shape, because bf16 cannot resolve errors near 1 % (see
    harness.measure.numerics); MHA, GQA and MQA (a head-grouping bug only shows with 1 < H_kv < H);
    causal, padding and window masks, including S_q ≠ S_kv where bottom-right alignment matters;
    d_v ≠ d_k; and forward+backward, so that gradients are checked too.
    """
    cases = grid(
        B=[2], S=[64], H=[4], H_kv=["H", 2, 1], d_k=[32], dtype=["fp32", "fp16", "bf16"],
        causal=[False, True], padding=[False, True], mode=["fwd", "fwd_bwd"], device=device,
    )
    cases += grid(B=[2], S_q=[1, 16], S_kv=[80], H=[4], H_kv=[2], d_k=[32], dtype=["fp32", "bf16"], causal=[True], device=device)
    cases += grid(B=[2], S=[64], H=[4], H_kv=[2], d_k=[32], dtype=["fp32", "bf16"], window=[16], device=device)
    cases += grid(B=[1], S=[32], H=[4], H_kv=[1], d_k=[32], d_v=[48], dtype=["fp32"], causal=[True], device=device)
    return list(dict.fromkeys(cases))


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one (case, backend) pair."""

    case: Case
    backend: str
    status: str
    agreement: Agreement | None = None
    reason: str | None = None

    @property
    def failed(self) -> bool:
        """True for a disagreement or an error: what makes `attnbench check` exit non-zero."""
        return self.status in FAILING


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def check_pair(case: Case, backend: Backend) -> CheckResult:
    """Check one pair on fresh seeded inputs: its output (or gradients) against float64, and its weights if it exposes them."""
    try:
        reason = backend.available() or backend.supports(case)
    except Exception as exc:  # a probe that crashes cannot vouch for the backend
        return CheckResult(case, backend.name, "error", reason=f"availability check failed: {_one_line(exc)}")
    if reason:
        return CheckResult(case, backend.name, "unsupported", reason=reason)
    if not getattr(backend, "computes_attention", True):
        return CheckResult(case, backend.name, "not checked", reason=f"{backend.name} does not compute attention")
    inputs = make_inputs(case)
    if case.mode != "fwd":
        for t in (inputs.q, inputs.k, inputs.v):
            t.requires_grad_(True)
    drawn = input_fingerprints(inputs)
    failure: BaseException | None = None
    try:
        with torch.set_grad_enabled(case.mode != "fwd"):
            prepared = backend.prepare(case, inputs)
            step = build_step(case, prepared, inputs)
            agreement = check_result(case, prepared, inputs, step())
    except Unsupported as exc:
        return CheckResult(case, backend.name, "unsupported", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - every failure is a verdict
        failure = exc
    if failure is not None:
        status = "oom" if is_oom(failure) else "error"
        return CheckResult(case, backend.name, status, reason=_one_line(failure))
    agreement = flag_modified_inputs(agreement, drawn, inputs)
    if case.mode == "fwd" and callable(getattr(backend, "weights", None)):
        problems = _weights_problems(case, backend)
        if problems:
            agreement = agreement.disagreeing("weights: " + "; ".join(problems))
    if agreement.agree is None:
        return CheckResult(case, backend.name, "not checked", agreement, agreement.check_note)
    return CheckResult(case, backend.name, "agree" if agreement.agree else "disagree", agreement, agreement.check_note)


def _weights_problems(case: Case, backend: Backend) -> list[str]:
    """Row sums and masked zeros of the weights a backend exposes (`weights(case, inputs)` → (output, weights))."""
    with torch.no_grad():
        _, weights = backend.weights(case, make_inputs(case))
    return weights_violations(case, weights)


def run_checks(pairs: Iterable[tuple[Case, Backend]], *, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check every pair in order (cases outer, backends inner lets each case's float64 reference be computed once)."""
    results = []
    for case, backend in pairs:
        result = check_pair(case, backend)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def format_table(results: Iterable[CheckResult]) -> str:
    """One line per pair: case, backend, err, bound, verdict, and the note or reason."""
    rows = [("case", "backend", "max_abs_err", "bound", "agree", "note")]
    for r in results:
        a = r.agreement
        verdict = {"agree": "yes", "disagree": "NO"}.get(r.status, r.status)
        rows.append((r.case.id, r.backend, _fmt(a.max_abs_err if a else None), _fmt(a.err_bound if a else None), verdict, r.reason or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + ("  " + row[5] if row[5] else "") for row in rows)


def summary(results: Sequence[CheckResult]) -> str:
    """Counts by status, then one line per failing pair naming its case."""
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    lines = [f"{len(results)} pairs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    for r in results:
        if r.failed:
            a = r.agreement
            detail = f"err {_fmt(a.max_abs_err)} > bound {_fmt(a.err_bound)}" if a and a.max_abs_err is not None and a.err_bound is not None else r.status
            lines.append(f"FAILED {r.case.id} [{r.backend}]: {detail}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(lines)


def resolution_warning(cases: Sequence[Case]) -> str | None:
    """A note when only low-precision cases are checked: their bound cannot resolve a ~1 % error (e.g. the softmax scale)."""
    dtypes = {c.dtype for c in cases}
    if dtypes and not dtypes & {"fp32", "fp64"}:
        return (f"note: only {'/'.join(sorted(dtypes))} cases were checked; their bound (2x eager's own error) cannot "
                "resolve errors near 1 % such as a softmax scale off by 1 %; add fp32 cases to catch those")
    return None


def select_cases(cases: Sequence[Case], *, dtypes: Sequence[str] | None = None, modes: Sequence[str] | None = None,
                 device: str | None = None) -> list[Case]:
    """The cases restricted to the given dtypes and modes, moved to `device`; UserError if none is left."""
    chosen = list(cases)
    if dtypes:
        wanted = {canonical_dtype(d) for d in dtypes}
        chosen = [c for c in chosen if c.dtype in wanted]
    if modes:
        chosen = [c for c in chosen if c.mode in set(modes)]
    if device:
        chosen = list(dict.fromkeys(c.replace(device=device) for c in chosen))
    if not chosen:
        have = sorted({f"{c.dtype}/{c.mode}" for c in cases})
        raise UserError(f"no case left to check after --dtype/--mode (the cases have dtype/mode {', '.join(have)})")
    return chosen


def run_cli(*, suite: str | None, backends: Sequence[str] | None, dtypes: Sequence[str] | None = None,
            modes: Sequence[str] | None = None, device: str | None = None, only: Sequence[str] | None = None,
            out: TextIO | None = None) -> int:
    """What `attnbench check` does: resolve the cases and backends, check every pair, print, and return the exit status."""
    from harness.backends.registry import load_registry
    from harness.suite.catalog import load_suite, pair_key
    from harness.run.supervisor import detect_device

    out = out or sys.stdout
    registry = load_registry()
    if suite:
        name = ("default" if detect_device() == "cuda" else "quick") if suite == "auto" else suite
        loaded = load_suite(name)
        cases, suite_backends = list(loaded.cases), loaded.backends
    else:
        cases, suite_backends = default_cases(device or detect_device()), None
    cases = select_cases(cases, dtypes=dtypes, modes=modes, device=device)
    names = list(backends) if backends else (list(suite_backends) if suite_backends else registry.names())
    unknown = [n for n in names if n not in registry]
    if unknown:
        registry.get(unknown[0])  # raises the UserError that lists the known names
    runnable = []
    for name in names:
        try:
            backend = registry.get(name)
            reason = backend.available()
        except UserError as exc:  # a plugin that failed to load
            reason = str(exc)
        except Exception as exc:
            reason = f"availability check failed: {_one_line(exc)}"
        if reason:
            print(f"{name}: unavailable, not checked ({reason})", file=out)
        elif not getattr(backend, "computes_attention", True):
            print(f"{name}: computes no attention, not checked", file=out)
        else:
            runnable.append(backend)
    pairs = [(c, b) for c in cases for b in runnable if all(part in pair_key(c, b.name) for part in only or ())]
    if only and not pairs:
        raise UserError(f"--only {','.join(only)} matches no (case, backend) pair")
    results = run_checks(pairs)
    if results:
        print(format_table(results), file=out)
    print(summary(results), file=out)
    warning = resolution_warning(cases)
    if warning:
        print(warning, file=out)
    return EXIT_DISAGREE if any(r.failed for r in results) else 0
