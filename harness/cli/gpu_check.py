"""`attnbench gpu-check` (`make gpu-check`): the engine (harness/checks/gpu.py) called, its progress and table printed.

Exit 0 when every pair that ran agrees, 1 when one disagrees or fails (or a backend was skipped because
the 345 s budget could not hold it), 2 when there is no CUDA device.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Callable, Sequence

from harness.checks.gpu import COMPILING_CASES, TIMER_TOLERANCE, BackendTurn, Row, check_cases, plan_gpu_check, run_gpu_check
from harness.errors import UserError
from harness.results.record import NOT_FAILURES, Status

#: The columns of `--rows FILE`: one line per (backend, case), everything the table summarises.
ROW_COLUMNS = ("backend", "case", "status", "agree", "failed", "ms", "kernel_ms", "kernels_per_call", "ratio", "net",
               "overhead_us", "overhead_spread_us", "overhead_error", "reason")


def _timer_note(off: Sequence[Row]) -> str:
    """Why the worst of a backend's timer-off pairs is off: its net ratio, or no overhead to judge it with."""
    unjudged = [r for r in off if r.overhead_ms is None]
    if unjudged:
        return f"timer not judged on {unjudged[0].case}: its child measured no fixed overhead"
    worst = max(off, key=lambda r: abs(r.net_ratio - 1))
    return (f"timer {worst.net_ratio:.3f}x the kernel time on {worst.case} after the {worst.overhead_ms * 1e3:.1f} µs fixed overhead "
            f"(more than {TIMER_TOLERANCE:.0%} off)")


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(rows: Sequence[Row]) -> str:
    """Per backend: pairs ok / agreeing / unsupported / failed, the first ok case's times and ratios, and the first problem."""
    out = [f"{'backend':<16} {'ok':>3} {'agree':>5} {'unsup':>5} {'fail':>4}  {'first ok case':<44} {'ms':>9} {'kernel ms':>9} "
           f"{'ratio':>6} {'net':>6}  note"]
    for name in dict.fromkeys(r.backend for r in rows):
        mine = [r for r in rows if r.backend == name]
        ok = [r for r in mine if r.status is Status.OK]
        agree = sum(1 for r in ok if r.agree is True)
        unsup = sum(1 for r in mine if r.status is Status.UNSUPPORTED)
        failed = [r for r in mine if r.status not in NOT_FAILURES]
        bad = [r for r in ok if r.agree is False]
        first = ok[0] if ok else None
        problem = (failed or bad or [None])[0]
        off = [r for r in ok if r.timer_off]
        if problem is None and off:
            note = _timer_note(off)
        elif problem is not None:
            note = f"{problem.status}{' (disagrees)' if problem in bad else ''} on {problem.case}: {(problem.reason or 'no reason given')[:110]}"
        elif not ok and mine:
            note = f"unsupported: {(mine[0].reason or '')[:90]}"
        else:
            note = ""
        times = [_number(first and first.ms, 3), _number(first and first.kernel_ms, 3)]
        ratios = [_number(first and first.timer_ratio, 3), _number(first and first.net_ratio, 3)]
        out.append(f"{name:<16} {len(ok):>3} {agree:>5} {unsup:>5} {len(failed):>4}  {(first.case if first else '-'):<44} "
                   f"{times[0]:>9} {times[1]:>9} {ratios[0]:>6} {ratios[1]:>6}  {note}")
    return "\n".join(out)


def report_turn(turn: BackendTurn) -> None:
    """The progress lines of one backend's turn: skipped and why, or its counts, its fixed overhead and each problem pair."""
    if turn.skipped is not None:
        print(f"  {turn.name}: skipped ({turn.skipped})", flush=True)
        return
    mine = turn.rows
    unmeasured = next((r.overhead_error for r in mine if r.overhead_error), None)
    if unmeasured:
        print(f"  {turn.name}: the fixed overhead could not be measured ({unmeasured}); its timers are not judged", flush=True)
    ok = sum(1 for r in mine if r.status is Status.OK)
    unsupported = sum(1 for r in mine if r.status is Status.UNSUPPORTED)
    measured = next((r for r in mine if r.overhead_ms is not None), None)
    overhead = f"; fixed overhead {measured.overhead_ms * 1e3:.2f} ± {measured.overhead_spread_ms * 1e3:.2f} µs a sample" if measured else ""
    print(f"  {turn.name}: {ok} ok, {unsupported} unsupported in {turn.seconds:.0f} s{overhead}", flush=True)
    for r in mine:
        if r.timer_off and r.status is Status.OK and r.agree is not False:
            print(f"    {r.case}: {_timer_note([r])}: median {r.ms:.4f} ms, kernel {r.kernel_ms:.4f} ms", flush=True)
        elif r.failed:
            print(f"    {r.case}: {r.status}{' disagrees' if r.agree is False else ''}: {r.reason or 'no reason given'}", flush=True)


def _row_fields(row: Row) -> dict[str, object]:
    """One row as ROW_COLUMNS' values (empty where unknown; times in ms, the overhead in µs)."""
    def us(ms: float | None) -> float | None:
        return None if ms is None else ms * 1e3

    values = {"backend": row.backend, "case": row.case, "status": str(row.status), "agree": row.agree, "failed": row.failed,
              "ms": row.ms, "kernel_ms": row.kernel_ms, "kernels_per_call": row.kernels, "ratio": row.timer_ratio,
              "net": row.net_ratio, "overhead_us": us(row.overhead_ms),
              "overhead_spread_us": us(row.overhead_spread_ms) if row.overhead_ms is not None else None,
              "overhead_error": row.overhead_error, "reason": row.reason}
    return {key: "" if value is None else value for key, value in values.items()}


def rows_writer(path: str | os.PathLike) -> Callable[[BackendTurn], None]:
    """A turn listener that appends each backend's rows to the CSV at `path` as its child ends (a header first; UserError if unwritable).

    Written turn by turn, so that a gpu-check stopped partway keeps the rows of every backend that finished."""
    target = Path(path)
    try:
        with target.open("w", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, ROW_COLUMNS).writeheader()
    except OSError as exc:
        raise UserError(f"--rows {str(target)!r}: cannot write it ({exc.strerror or exc})") from None

    def append(turn: BackendTurn) -> None:
        with target.open("a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, ROW_COLUMNS).writerows(_row_fields(row) for row in turn.rows)

    return append


def run_cli(cpu: bool, backends: Sequence[str] | None, rows_path: str | os.PathLike | None = None) -> int:
    """`attnbench gpu-check [--cpu] [--backends a,b] [--rows FILE]`: run, print the table last, exit 0/1 (a UserError, exit 2, without CUDA)."""
    import torch

    plan = plan_gpu_check("cpu" if cpu else "cuda", backends)
    save = rows_writer(rows_path) if rows_path is not None else None

    def on_turn(turn: BackendTurn) -> None:
        report_turn(turn)
        if save is not None:
            save(turn)

    cases = len(check_cases(plan.device))
    where = torch.cuda.get_device_name(0) if plan.device == "cuda" else "CPU (--cpu)"
    print(f"gpu-check on {where}, torch {torch.__version__}: {cases} cases × {len(plan.names)} backends", flush=True)
    if plan.compiling:
        print(f"  {', '.join(plan.compiling)}: each case compiles, so run first, on {len(COMPILING_CASES)} of the {cases} cases", flush=True)
    result = run_gpu_check(plan, on_turn=on_turn)
    print(f"\n{len(result.rows)} pairs in {result.seconds:.0f} s")
    measured = sorted({r.overhead_ms for r in result.rows if r.overhead_ms is not None})
    if measured:
        print(f"fixed overhead a sample between events, as the children measured it: {measured[0] * 1e3:.2f}–{measured[-1] * 1e3:.2f} µs")
    print(format_table(result.rows))
    if rows_path is not None:
        print(f"rows: {rows_path}")
    return 1 if result.failed else 0
