"""GitHub-flavoured Markdown of what compare and regress decided, for a pull request's comment (`compare --md`, `regress --md`).

Nothing here judges: the verdict, the gate's sentence, the counts and the geometric means are the `Comparison`'s
(harness.analysis.compare), the very values its text prints; this module only lays them out as pipe tables.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import pandas as pd

from harness.analysis.compare import FASTER, NO_GATE, NOT_JUDGED, SAME, SLOWER, UNCHANGED_SUFFIX, Comparison, not_judged
from harness.analysis.difference import RULE_TEXT

#: Rows each of the regressions and improvements tables shows, the largest changes first; the CSV holds every row.
TOP_ROWS = 10


def cell(value: Any) -> str:
    """One table cell: `|` escaped and line breaks folded, so a name with either cannot break the table's columns."""
    text = "" if value is None else str(value)
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A pipe table: the header row, the `---` separator, then one row per item, every row as many cells as the header."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _present(value: Any) -> bool:
    """False for None and NaN (a pair one run lacks has no median and no ratio)."""
    return value is not None and value == value


def _ms(value: Any) -> str:
    """A latency cell in milliseconds ('' for a missing one)."""
    return f"{float(value):.4g}" if _present(value) else ""


def _change(ratio: Any) -> str:
    """'+12.3 %' or '-4.0 %' from NEW/BASE ('' when there is no ratio)."""
    return f"{100 * (float(ratio) - 1):+.1f} %" if _present(ratio) else ""


def _speed(ratio: float) -> str:
    """A geometric mean of NEW/BASE in words, as compare's text says it."""
    return f"{ratio:.3f}x slower" if ratio > 1 else (f"{1 / ratio:.3f}x faster" if ratio < 1 else "the same")


def _rows_table(rows: pd.DataFrame) -> str:
    """The regressions or improvements: case, backend, both medians, the ratio, the change and the verdict (FAIL where the gate failed it)."""
    return table(["case", "backend", "base ms", "new ms", "ratio", "change", "verdict"],
                 [(r["case_id"], r["backend"], _ms(r["base_ms"]), _ms(r["new_ms"]), f"{float(r['ratio']):.3f}" if _present(r["ratio"]) else "",
                   _change(r["ratio"]), str(r["verdict"]) + (" **FAIL**" if r["gate"] else ""))
                  for _, r in rows.iterrows()])


def regressions(result: Comparison) -> pd.DataFrame:
    """The rows the gate fails (slower past the threshold, or no longer running), then the others slower by the rule: in the text's order."""
    t = result.table
    return t[t["gate"].astype(bool) | (t["verdict"] == SLOWER)]  # compare_frames sorted them: failing first, then by ratio


def improvements(result: Comparison) -> pd.DataFrame:
    """The rows faster by the rule, the largest gain first."""
    t = result.table
    return t[t["verdict"] == FASTER].sort_values("ratio", ascending=True, kind="stable")


def comparison_markdown(result: Comparison, base_name: str, new_name: str, *, heading: str = "###", top: int = TOP_ROWS) -> str:
    """The comparison as a PR comment: the verdict and the gate's sentence, judged and not-judged counts, per-backend geometric means,
    and the top regressions and improvements as tables."""
    lines = [f"{heading} attnbench compare: `{cell(base_name)}` → `{cell(new_name)}`", ""]
    t = result.table
    if t.empty:  # as the text, no verdict: a group of `regress` whose runs hold no rows
        return "\n".join([*lines, "No rows to compare."])
    gate = result.gate_line()
    lines.append(f"**Verdict: {result.verdict}**" + (f" — {gate.split(': ', 1)[1]}" if gate else "")
                 + (" — no --fail-above given: the rows are compared, nothing is gated" if result.verdict == NO_GATE else ""))
    if result.disjoint:
        return "\n".join([*lines, "", f"`{cell(base_name)}` and `{cell(new_name)}` share no (case, backend) pair: nothing to compare."])
    skipped = len(not_judged(t))
    lines += ["", f"- judged: {result.judged_text()}" + (f"; the gate needs {result.min_judged}" if result.threshold is not None else ""),
              f"- not judged: {skipped} (a side contended, suspect or throttled: they pass or fail nothing)"]
    counts = t["verdict"].map(lambda v: NOT_JUDGED if str(v).startswith(NOT_JUDGED) else v).value_counts()
    lines.append("- rows: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    lines.append(f"- rule: {RULE_TEXT}; " + (result.variation.describe() if result.variation else "no run-to-run variation given"))
    lines += [f"- warning: {w}" for w in [*result.warnings, *(f"environments differ: {d}" for d in result.env_differences),
                                          *(f"NEW's rows were measured by another attnbench: {d}" for d in result.harness_differences)]]
    if not result.summary.empty:
        lines += ["", f"{heading}# Geometric mean of NEW/BASE per backend (judged cases)", "",
                  table(["backend", "cases", "geomean NEW/BASE", "in words", FASTER, SLOWER, SAME],
                        [(g["backend"], g["cases"], f"{float(g['geomean_ratio']):.3f}", _speed(float(g["geomean_ratio"])),
                          g[FASTER], g[SLOWER], g[SAME]) for _, g in result.summary.iterrows()])]
    for title, rows in (("Top regressions", regressions(result)), ("Top improvements", improvements(result))):
        shown = rows.head(top)
        more = f" ({len(shown)} of {len(rows)}; the CSV has every row)" if len(rows) > len(shown) else ""
        lines += ["", f"{heading}# {title}{more}", ""]
        lines.append(_rows_table(shown) if len(shown) else "None.")
    unchanged = t[t["verdict"].astype(str).str.endswith(UNCHANGED_SUFFIX)]
    if len(unchanged):
        lines += ["", f"{len(unchanged)} pairs kept the same non-ok status in both runs (unsupported, skipped, …) and are not listed."]
    return "\n".join(lines)
