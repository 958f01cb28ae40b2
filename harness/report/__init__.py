"""`attnbench report RUN [RUN …]`: a self-contained HTML page and tidy CSVs under reports/<run-id>/.

The page answers, from measured rows only: which backend wins where (and by how much), how close
each row is to the device's measured ceilings, where the attention core overtakes the projections
(S*), how latency and memory grow with S, how memory compares with its model, and whether every
row agreed with the float64 reference. Full-precision numbers are in the CSVs; the page rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from harness import analysis
from harness.analysis.difference import Variation, check_variation_device
from harness.errors import UserError
from harness.report.sections import sections
from harness.report.writer import TITLE, Csv, report_folder, write_report
from harness.results.store import resolved

#: Columns of records.csv beside the record's own: the derived ones the page uses.
DERIVED = ("S", "D", "q_len", "peak_tflops", "peak_gbps", "ridge_flop_per_byte", "pct_peak_flops", "pct_peak_bw", "bound", "attainable_tflops", "pct_roof", "impossible")


def report_id(run_ids: Sequence[str]) -> str:
    """The report folder's name: the run id, or the ids joined with '+' (shortened past three)."""
    ids = list(dict.fromkeys(run_ids))
    if len(ids) <= 3:
        return "+".join(ids)
    return f"{ids[0]}+{len(ids) - 1}-more"


def _tidy_records(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per record: the schema's flat columns and the derived roofline columns (samples stay in the JSONL)."""
    from harness.results.record import COLUMNS

    from harness.results.store import as_csv_cells

    return as_csv_cells(frame[[c for c in COLUMNS if c in frame.columns] + [c for c in DERIVED if c in frame.columns]])


def _analysed(run_dirs: Sequence[Path | str], baseline: str | None, variation: Variation | None) -> tuple[analysis.RunData, str]:
    """The runs loaded, and the baseline the speed-ups are against (UserError for one with no row, or another device's variation)."""
    data = analysis.load(run_dirs)
    if baseline is not None and baseline not in set(data.frame["backend"]):
        raise UserError(f"--baseline {baseline!r} has no row in these runs: the backends are {', '.join(sorted(set(data.frame['backend'])))}")
    check_variation_device(variation, list(data.env.values()), "these runs")
    return data, baseline or analysis.default_baseline(data.frame) or "sdpa-math"


def build_report(run_dirs: Sequence[Path | str], out_root: Path | str = "reports", baseline: str | None = None,
                 variation: Variation | None = None) -> Path:
    """Analyse the runs and write reports/<run folder>/index.html and its CSVs; return the page's path.

    `variation` (from `attnbench stability`) widens the intervals by which winners are told from runners-up.
    """
    # Named after the run folders given, never after a run id read from a file (which could name any path).
    name = report_id([resolved(d, "run folder").name for d in run_dirs])
    out_dir = report_folder(Path(out_root), name)  # refused before any work when it is no place for a report
    data, baseline = _analysed(run_dirs, baseline, variation)
    return write_report(out_dir, f"{TITLE}: {name}", sections(data, baseline, variation), [Csv(_tidy_records(data.frame), "records.csv")])


def report_markdown(run_dirs: Sequence[Path | str], baseline: str | None = None, variation: Variation | None = None) -> str:
    """The report's answer as GitHub-flavoured Markdown (`report --md`): the same winners and speed-ups as the page, nothing written."""
    from harness.report.markdown import report_markdown as markdown

    name = report_id([resolved(d, "run folder").name for d in run_dirs])
    data, baseline = _analysed(run_dirs, baseline, variation)
    return markdown(name, data, baseline, variation.cv if variation else 0.0)
