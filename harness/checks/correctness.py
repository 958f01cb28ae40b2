"""`attnbench check`'s engine: numerical agreement alone, fast and untimed, over a suite or a built-in grid.

Each (case, backend) pair gets seeded inputs and two calls through the same path a benchmark
record's check takes (`execute.run_pair` with `CHECK_ONLY`), each output judged by the float64 rule of
`harness.attention.numerics` (the second call catches state carried across calls, which `run`'s last timed call would). Unsupported pairs are listed as such and are not failures; a disagreement, a
non-finite output, a backend that changes its inputs, wrong attention weights or an exception in
a pair the backend claims to support is a failure. The command's printing is harness/cli/check.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from harness.attention.numerics import Agreement
from harness.backends.base import Backend
from harness.errors import UserError, one_line
from harness.execution.execute import CHECK_ONLY, PairRunner
from harness.results.record import Status, verdict
from harness.suite.cases import Case, canonical_dtype, grid

#: The verdicts of one checked pair, in the order the summary counts them; only the last two fail the check.
VERDICTS = ("agree", "unsupported", "not checked", "oom", "disagree", "error")
FAILING = ("disagree", "error")


def default_cases(device: str = "cpu") -> list[Case]:
    """The built-in check grid: small, and covering what the rule must see.

    fp32 beside fp16 and bf16 on every shape, because bf16 cannot resolve errors near 1 % (see
    harness.attention.numerics); MHA, GQA and MQA (a head-grouping bug only shows with 1 < H_kv < H);
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
    status: Status
    agreement: Agreement | None = None
    reason: str | None = None
    #: Whether its two calls returned bitwise-equal results (None: not two checked calls).
    bitwise_repeatable: bool | None = None

    @property
    def verdict(self) -> str:
        """agree / disagree / not checked, or the status of a pair that did not run to its check."""
        return verdict(self.status, self.agreement.agree if self.agreement else None)

    @property
    def failed(self) -> bool:
        """True for a disagreement or an error: what makes `attnbench check` exit non-zero."""
        return self.verdict in FAILING


@dataclass(frozen=True)
class CheckPlan:
    """What a check will do: its cases, the pairs to check, and the backends left out with why (name, reason)."""

    cases: tuple[Case, ...]
    pairs: tuple[tuple[Case, Backend], ...]
    not_checked: tuple[tuple[str, str], ...]


def check_pair(case: Case, backend: Backend, runner: PairRunner | None = None) -> CheckResult:
    """Check one pair on fresh seeded inputs: its output (or gradients) against float64, and its weights if it exposes them."""
    runner = runner or PairRunner(phases=CHECK_ONLY)
    outcome = runner.run(case, backend)
    return CheckResult(case, backend.name, outcome.status, outcome.agreement, outcome.reason, outcome.bitwise_repeatable)


def run_checks(pairs: Iterable[tuple[Case, Backend]], *, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check every pair in order, through one runner whose float64 reference the backends of a case share."""
    runner = PairRunner(phases=CHECK_ONLY)
    results = []
    for case, backend in pairs:
        result = check_pair(case, backend, runner)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


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


def _why_not_checked(backend_name: str, registry) -> tuple[Backend | None, str | None]:
    """The backend, or None and why it cannot be checked (unavailable, a plugin that failed to load, or no attention)."""
    try:
        backend = registry.get(backend_name)
        reason = backend.available()
    except UserError as exc:  # a plugin that failed to load
        return None, f"unavailable, not checked ({exc})"
    except Exception as exc:  # noqa: BLE001 - a probe that crashes cannot vouch for the backend
        return None, f"unavailable, not checked (availability check failed: {one_line(exc)})"
    if reason:
        return None, f"unavailable, not checked ({reason})"
    if not backend.computes_attention:
        return None, "computes no attention, not checked"
    return backend, None


def plan_checks(*, suite: str | None, backends: Sequence[str] | None, dtypes: Sequence[str] | None = None,
                modes: Sequence[str] | None = None, device: str | None = None, only: Sequence[str] | None = None) -> CheckPlan:
    """Resolve the cases and backends of a check (UserError for an unknown name or an empty selection)."""
    from harness.backends.registry import load_registry
    from harness.env import resolve_device
    from harness.results.record import pair_key
    from harness.suite.catalog import suite_on_device

    device = resolve_device(device)  # --device cuda without a CUDA device: one line, exit 2
    registry = load_registry()
    if suite:
        loaded = suite_on_device(suite, device)  # as `run` picks them: a built-in CUDA grid's CPU variant on a CPU
        cases, names = list(loaded.cases), loaded.backend_names(backends, registry.names())
    else:
        cases, names = default_cases(device), list(backends or registry.names())
    cases = select_cases(cases, dtypes=dtypes, modes=modes, device=device)
    unknown = [n for n in names if n not in registry]
    if unknown:
        registry.get(unknown[0])  # raises the UserError that lists the known names
    runnable, not_checked = [], []
    for name in names:
        backend, why = _why_not_checked(name, registry)
        if backend is None:
            not_checked.append((name, why))
        else:
            runnable.append(backend)
    pairs = [(c, b) for c in cases for b in runnable if all(part in pair_key(c, b.name) for part in only or ())]
    if only and not pairs:
        raise UserError(f"--only {','.join(only)} matches no (case, backend) pair")
    return CheckPlan(tuple(cases), tuple(pairs), tuple(not_checked))
