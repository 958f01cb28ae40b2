"""`attnbench report --md`: the report's answer as GitHub-flavoured Markdown, for a pull request's comment.

The same winners, wins per backend, speed-ups and left-out rows as the HTML page's overview and "backend to choose"
sections (harness.analysis.winners, harness.analysis.trust), laid out as pipe tables; no figure, nothing written.
"""

from __future__ import annotations

import math

import pandas as pd

from harness import analysis
from harness.analysis.markdown import cell, table
from harness.analysis.trust import left_out
from harness.analysis.winners import no_winner_reason, unanswered_cases, wins_per_backend
from harness.report.sections import rows_per_node

#: Cases the winners table shows, in the report's order; winners.csv of the HTML report holds every one.
TOP_CASES = 20


def _ms(value) -> str:
    """A latency or ratio cell ('' for a missing one)."""
    return f"{float(value):.4g}" if value is not None and value == value else ""


def geomean_speedups(speed: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Per backend, the geometric mean of the report's speed-ups against the baseline (`analysis.speedups`) and the cases it is over."""
    out = {}
    for backend in speed.columns:
        values = [float(v) for v in speed[backend] if v == v and v > 0]
        if values:
            out[str(backend)] = (math.exp(sum(math.log(v) for v in values) / len(values)), len(values))
    return out


def report_markdown(name: str, data: analysis.RunData, baseline: str, cv: float = 0.0, top: int = TOP_CASES) -> str:
    """The Markdown summary of loaded runs: cases answered and rows left out, wins and geometric-mean speed-ups per backend,
    the winners of the first `top` cases and the cases with no answer."""
    frame = data.frame
    wins = analysis.winners(frame, baseline, cv=cv)
    core = frame[analysis.is_core(frame)]
    cases = core["case_id"].nunique()
    answered = wins["case_id"].nunique() if not wins.empty else 0
    gone = left_out(analysis.ok_rows(frame))
    statuses = ", ".join(f"{n} {s}" for s, n in frame["status"].value_counts().items())
    devices = sorted({str((e.get("before") or {}).get("device_name") or (e.get("before") or {}).get("device_type") or "?") for e in data.env.values()})
    lines = [f"## attnbench report: `{cell(name)}`", "",
             f"**Answered: {answered} of {cases} cases** (a winner among agreeing rows that carry no flag)", "",
             f"- runs: {', '.join(f'`{cell(r)}`' for r in data.dirs)}; device: {cell(', '.join(devices))}",
             f"- rows: {len(frame)} ({statuses})",
             f"- judged: {len(analysis.ok_rows(frame)) - gone.rows} measured rows; not judged: {gone.rows}"
             + (f" ({', '.join(f'{n} {flag}' for flag, n in gone.counts.items() if n)}: left out of every winner)" if gone else "")]
    nodes = rows_per_node(frame)
    if nodes:
        lines.append(f"- rows per node: {cell(nodes)}")
    lines += [f"- note: {cell(n)}" for n in data.notes]
    speed = analysis.speedups(frame, baseline)
    geo = geomean_speedups(speed) if not speed.empty else {}
    per_backend = wins_per_backend(wins)
    if not per_backend.empty or geo:
        names = list(dict.fromkeys([*per_backend["backend"], *geo]))
        won = {r["backend"]: r for _, r in per_backend.iterrows()}
        lines += ["", f"### Wins per backend, and its geometric-mean speed-up over `{cell(baseline)}`", "",
                  table(["backend", "cases won", "only candidate", f"geomean speed-up vs {baseline}", "over cases"],
                        [(b, int(won[b]["cases won"]) if b in won else 0, int(won[b]["only candidate"]) if b in won else 0,
                          f"{geo[b][0]:.3f}x" if b in geo else "", geo[b][1] if b in geo else "") for b in names])]
    if wins.empty:
        lines += ["", f"No backend won a case: {cell(no_winner_reason(core))}."]
    else:
        shown = wins.head(top)
        more = f" (the first {len(shown)} of {len(wins)}; winners.csv of the HTML report has every one)" if len(wins) > len(shown) else ""
        lines += ["", f"### Winners{more}", "",
                  table(["case", "winner", "winner ms", "runner-up", "runner-up ms", "runner-up ÷ winner", f"speed-up vs {baseline}"],
                        [(r["case"], f"only candidate: {r['winner']}" if r["only_candidate"] else r["winner"], _ms(r["winner_ms"]),
                          r["runner_up"] or "", _ms(r["runner_up_ms"]),
                          (f"{r['runner_up_ratio']:.3f}x" + (" (within noise)" if r["within_noise"] else "")) if r["runner_up_ratio"] == r["runner_up_ratio"]
                          and r["runner_up_ratio"] is not None else "", _ms(r["speedup_vs_baseline"])) for _, r in shown.iterrows()])]
    unanswered = unanswered_cases(frame, wins)
    if len(unanswered) and not wins.empty:  # with no winner at all, the line above already said why
        lines += ["", f"### Cases with no answer ({len(unanswered)})", "", table(["case", "why"], unanswered.head(top).itertuples(index=False))]
        if len(unanswered) > top:
            lines += ["", f"… and {len(unanswered) - top} more (the HTML report lists every one)."]
    return "\n".join(lines)
