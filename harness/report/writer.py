"""The one writer of a report: the CSVs its sections name and the HTML page, into one folder under the reports root.

Sections (`harness.report.sections`) are data: prose markup, `Table`s, `Figure`s and `Csv`s. This module
turns them into files, and nothing else in attnbench writes into a report folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

import pandas as pd

from harness.errors import UserError
from harness.report.figures import Figure
from harness.report.page import CellFormat, esc, figure, page, section, table

INDEX = "index.html"


@dataclass
class Table:
    """A table to show: the frame, which columns under which headers, and how cells are formatted."""

    frame: pd.DataFrame
    columns: Sequence[str] | None = None
    headers: Sequence[str] | None = None
    formats: dict[str, CellFormat] | None = None
    index: bool = False
    scroll: bool = True


@dataclass
class Csv:
    """A CSV file the section's numbers go into, at full precision (written only when it has rows)."""

    frame: pd.DataFrame | None
    name: str
    index: bool = False


#: A block of a section: trusted markup (built with `esc`), a table, a figure, or a CSV to write.
Block = Union[str, Table, Figure, Csv]


@dataclass
class Section:
    """One section of the page: its anchor, its title, its blocks, and its label in the navigation bar."""

    anchor: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    nav: str = ""


def render_table(t: Table) -> str:
    """The HTML of a table block."""
    return table(t.frame, columns=t.columns, headers=t.headers, formats=t.formats, index=t.index, scroll=t.scroll)


def _render(block: Block) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, Table):
        return render_table(block)
    if isinstance(block, Figure):
        return figure(block.title, block.data_uri, block.caption)
    return ""  # a Csv is written, not shown


def report_folder(out_root: Path, name: str) -> Path:
    """`out_root/name`, refusing any name that would land outside `out_root` (a run id of `../x` or `/abs`)."""
    root = Path(out_root).resolve()
    if not name or Path(name).is_absolute() or (root / name).resolve().parent != root:
        raise UserError(f"refusing to write a report named {name!r}: it would not be a folder directly under {root}")
    return Path(out_root) / name


def write_report(out_dir: Path, title: str, sections: Sequence[Section], csvs: Sequence[Csv] = ()) -> Path:
    """Write every CSV (those given, then the sections'), then the page with a last section listing them; return the page."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create report folder {out_dir}: {exc.strerror or exc}") from None
    for stale in out_dir.glob("*.csv"):
        stale.unlink()
    written: list[str] = []
    for csv in [*csvs, *(b for s in sections for b in s.blocks if isinstance(b, Csv))]:
        if csv.frame is None or csv.frame.empty:
            continue
        csv.frame.to_csv(out_dir / csv.name, index=csv.index)
        written.append(csv.name)
    items = "".join(f'<li><a href="{esc(name)}">{esc(name)}</a></li>' for name in written)
    files = Section("files", "CSV files", ["<p>Full-precision tables behind this page (the records themselves are in records.csv).</p>",
                                           f"<ul>{items}</ul>"], nav="CSV files")
    every = [*sections, files]
    html = [section(s.anchor, s.title, [_render(b) for b in s.blocks]) for s in every]
    path = out_dir / INDEX
    path.write_text(page(title, [(s.anchor, s.nav or s.title) for s in every], html, heading=f"<h1>{esc(title)}</h1>"), encoding="utf-8")
    return path
