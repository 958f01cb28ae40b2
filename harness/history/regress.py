"""`attnbench regress`'s engine: per (suite, device model) in the results database, the newest run against the one before, by compare's rule.

The text (`regress`) and the Markdown (`regress --md`) are two layouts of one `Regression`: the same groups, the same
`Comparison` per group (harness.analysis.compare) and the same closing verdict and exit status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from harness.analysis.compare import EXIT_REGRESSION, EXIT_UNDECIDED, Comparison, compare_frames, geomean_summary, print_comparison

if TYPE_CHECKING:
    from harness.analysis.gate import MinJudged
    from harness.history.database import Database


@dataclass(frozen=True)
class RegressGroup:
    """One (suite, device model): its newest run and the one before, compared; `comparison` None when it holds one run."""

    suite: Any
    device: Any
    base_run: str = ""
    base_created: str = ""
    new_run: str = ""
    new_created: str = ""
    comparison: Comparison | None = None

    @property
    def name(self) -> str:
        """'suite quick on NVIDIA H200'."""
        return f"suite {self.suite} on {self.device}"

    def heading(self) -> str:
        """'suite quick on H200: run-a (2026-11-01 10:00:00) → run-b (…)', or that there is nothing to compare."""
        if self.comparison is None:
            return f"only one run of {self.name}: nothing to compare"
        return f"{self.name}: {self.base_run} ({self.base_created}) → {self.new_run} ({self.new_created})"


@dataclass(frozen=True)
class Regression:
    """Every group of the database, compared, and what they come to together."""

    database: str
    groups: tuple[RegressGroup, ...]
    min_judged: MinJudged

    @property
    def compared(self) -> list[RegressGroup]:
        """The groups with two runs or more."""
        return [g for g in self.groups if g.comparison is not None]

    def outcome(self) -> tuple[int, str | None]:
        """The exit status and the closing line (None when every group passed): FAIL, then UNDECIDED, then nothing judged."""
        if not self.groups:
            return EXIT_UNDECIDED, f"{self.database} holds no runs: nothing to compare"
        failed = [g.name for g in self.compared if g.comparison.failed]
        if failed:
            return EXIT_REGRESSION, f"regress: FAIL in {len(failed)} group(s): {'; '.join(failed)}"
        undecided = [f"{g.name} ({'no shared pair' if g.comparison.disjoint else g.comparison.judged_text()})"
                     for g in self.compared if g.comparison.undecided]
        if undecided:
            return EXIT_UNDECIDED, f"regress: UNDECIDED in {len(undecided)} group(s) (--min-judged {self.min_judged}): {'; '.join(undecided)}"
        if sum(g.comparison.judged for g in self.compared) == 0:
            return EXIT_UNDECIDED, "regress: nothing could be judged (no group with two runs, or every pair contended, suspect or throttled)"
        return 0, None

    def verdict(self) -> str:
        """FAIL, UNDECIDED or ok: the word the closing line starts with."""
        status = self.outcome()[0]
        return {EXIT_REGRESSION: "FAIL", EXIT_UNDECIDED: "UNDECIDED"}.get(status, "ok")


def regress(db: Database, threshold: float, min_judged: MinJudged) -> Regression:
    """Compare, in each (suite, device model) of `db`, the newest run with the one before (by creation time, then uuid)."""
    runs = db.runs_frame()
    groups = []
    for (suite, device), group in runs.groupby(["suite", "device_model"], sort=True, dropna=False):
        group = group.sort_values(["created_utc", "run_uuid"])
        if len(group) < 2:
            groups.append(RegressGroup(suite, device))
            continue
        base, new = group.iloc[-2], group.iloc[-1]
        frames = db.rows_frame([base["run_uuid"], new["run_uuid"]])
        table, failures = compare_frames(frames[frames["run_uuid"] == base["run_uuid"]], frames[frames["run_uuid"] == new["run_uuid"]], threshold)
        result = Comparison(table, [], threshold, failures, geomean_summary(table) if not table.empty else table, min_judged=min_judged)
        groups.append(RegressGroup(suite, device, str(base["run_id"]), str(base["created_utc"])[:19], str(new["run_id"]),
                                   str(new["created_utc"])[:19], result))
    return Regression(db.name, tuple(groups), min_judged)


def print_regression(regression: Regression, out: TextIO) -> None:
    """The text of `regress`: each group's heading and comparison, then the closing line."""
    for group in regression.groups:
        if group.comparison is None:
            out.write(group.heading() + "\n")
            continue
        out.write(f"== {group.heading()}\n")
        print_comparison(group.comparison, group.base_run, group.new_run, out)
    line = regression.outcome()[1]
    if line is not None:
        out.write(line + "\n")


def regression_markdown(regression: Regression) -> str:
    """`regress --md`: the overall verdict and its line, then each group's comparison as compare --md lays it out."""
    from harness.analysis.markdown import cell, comparison_markdown

    line = regression.outcome()[1]
    lines = [f"## attnbench regress: `{cell(regression.database)}`", "", f"**Verdict: {regression.verdict()}**"
             + (f" — {line.split(': ', 1)[1]}" if line and line.startswith("regress: ") else (f" — {line}" if line else ""))]
    for group in regression.groups:
        if group.comparison is None:
            lines += ["", f"- {cell(group.heading())}"]
            continue
        body = comparison_markdown(group.comparison, group.base_run, group.new_run, heading="###")
        rest = body.split("\n", 1)[1]  # its own heading gives way to the group's
        lines += ["", f"### {cell(group.name)}: `{cell(group.base_run)}` ({group.base_created}) → `{cell(group.new_run)}` ({group.new_created})",
                  rest]
    return "\n".join(lines)
