"""`attnbench check`: the engine (harness/checks/correctness.py) called, its verdicts printed, and the exit status."""

from __future__ import annotations

import gc
import math
import sys
from typing import Any, Iterable, Sequence, TextIO

from harness.checks.correctness import VERDICTS, CheckResult, plan_checks, resolution_warning, run_checks
from harness.results import strict_json

#: Exit status when some available backend disagrees (2 stays the usage-error status).
EXIT_DISAGREE = 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def format_table(results: Iterable[CheckResult]) -> str:
    """One line per pair: case, backend, err, bound, verdict, and the note or reason."""
    rows = [("case", "backend", "max_abs_err", "bound", "agree", "note")]
    for r in results:
        a = r.agreement
        shown = {"agree": "yes", "disagree": "NO"}.get(r.verdict, r.verdict)
        # A plain case's calls that differ bitwise still agree: said in the note, since the columns are fixed.
        differ = r.bitwise_repeatable is False and not r.case.deterministic
        note = "; ".join(filter(None, [r.reason, "two calls differ bitwise" if differ else ""]))
        rows.append((r.case.id, r.backend, _fmt(a.max_abs_err if a else None), _fmt(a.err_bound if a else None), shown, note))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + ("  " + row[5] if row[5] else "") for row in rows)


def _number(x: float | None) -> float | None:
    """JSON has no NaN or Infinity: null, as a record stores them (the reason says what was not finite)."""
    return x if x is not None and math.isfinite(x) else None


def result_object(r: CheckResult) -> dict[str, Any]:
    """One pair as `check --json` prints it: what its table row and FAILED line say, as data."""
    a = r.agreement
    return {"case_id": r.case.id, "backend": r.backend, "dtype": r.case.dtype, "mode": r.case.mode, "status": r.status.value,
            "verdict": r.verdict, "agree": a.agree if a else None, "max_abs_err": _number(a.max_abs_err) if a else None,
            "err_bound": _number(a.err_bound) if a else None, "rel_err": _number(a.rel_err) if a else None,
            "bitwise_repeatable": r.bitwise_repeatable, "reason": r.reason, "failed": r.failed}


def summary(results: Sequence[CheckResult]) -> str:
    """Counts by status, then one line per failing pair naming its case."""
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    lines = [f"{len(results)} pairs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    for r in results:
        if r.failed:
            a = r.agreement
            detail = f"err {_fmt(a.max_abs_err)} > bound {_fmt(a.err_bound)}" if a and a.max_abs_err is not None and a.err_bound is not None else r.verdict
            lines.append(f"FAILED {r.case.id} [{r.backend}]: {detail}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(lines)


def run_cli(*, suite: str | None, backends: Sequence[str] | None, dtypes: Sequence[str] | None = None,
            modes: Sequence[str] | None = None, device: str | None = None, only: Sequence[str] | None = None,
            out: TextIO | None = None, as_json: bool = False, err: TextIO | None = None) -> int:
    """What `attnbench check` does: resolve the cases and backends, check every pair, print, and return the exit status.

    `as_json`: `out` gets one JSON list of the pairs and nothing else; the other lines go to `err`."""
    out = out or sys.stdout
    notes = (err or sys.stderr) if as_json else out
    plan = plan_checks(suite=suite, backends=backends, dtypes=dtypes, modes=modes, device=device, only=only)
    for name, why in plan.not_checked:
        print(f"{name}: {why}", file=notes)
    # Each pair ends in a full collection (execute._release_memory); with the imports and the registry frozen
    # it walks only what the pair made: 0.14 s a pair otherwise, most of what a tiny check costs. Process-wide,
    # so done here, in the command, and never by the engine a library caller (a test, a suite) may call.
    gc.freeze()
    results = run_checks(plan.pairs)
    if as_json:
        print(strict_json.dumps([result_object(r) for r in results]), file=out)
    elif results:
        print(format_table(results), file=out)
    print(summary(results), file=notes)
    warning = resolution_warning(plan.cases)
    if warning:
        print(warning, file=notes)
    return EXIT_DISAGREE if any(r.failed for r in results) else 0
