"""The one writer of a report: the CSVs its sections name and the HTML page, into one folder under the reports root.

Sections (`harness.report.sections`) are data: prose markup, `Table`s, `Figure`s and `Csv`s. This module
turns them into files, and nothing else in attnbench writes into a report folder. A report folder is
new, empty or an earlier report (its page's title says so); never a run folder or one inside it, never
another folder whose CSVs it would replace; its files are written in place, never through a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

import pandas as pd

from harness.errors import UserError
from harness.report.figures import Figure
from harness.results.store import resolved, run_folder_of, write_file
from harness.report.page import CellFormat, esc, figure, page, section, table

INDEX = "index.html"
#: How every report page's title starts (`build_report`), and so how an earlier report folder is told from another folder.
TITLE = "attnbench report"


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
    """`out_root/name`, refusing a name that would land outside `out_root` (`../x`, `/abs`), a run folder, or another tool's folder."""
    root = resolved(out_root, "--out")
    if not name or Path(name).is_absolute() or resolved(root / name, "--out").parent != root:
        raise UserError(f"refusing to write a report named {name!r}: it would not be a folder directly under {root}")
    out_dir = root / name
    held = run_folder_of(out_dir)
    if held is not None:
        raise UserError(f"refusing to write a report into {out_dir}: it is inside the run folder {held}; give an --out outside every run folder")
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not _is_report(out_dir))):
        raise UserError(f"refusing to write a report into {out_dir}: it exists and is not an attnbench report; give another --out")
    return Path(out_root) / name


def _is_report(folder: Path) -> bool:
    """Whether `folder` holds a page this writer wrote (its title is a report's)."""
    from harness.results.outputs import page_title_is

    return page_title_is(folder / INDEX, TITLE)


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
        write_file(out_dir / csv.name, csv.frame.to_csv(index=csv.index))
        written.append(csv.name)
    items = "".join(f'<li><a href="{esc(name)}">{esc(name)}</a></li>' for name in written)
    files = Section("files", "CSV files", ["<p>Full-precision tables behind this page (the records themselves are in records.csv).</p>",
                                           f"<ul>{items}</ul>"], nav="CSV files")
    every = [*sections, files]
    html = [section(s.anchor, s.title, [_render(b) for b in s.blocks]) for s in every]
    path = out_dir / INDEX
    write_file(path, page(title, [(s.anchor, s.nav or s.title) for s in every], html, heading=f"<h1>{esc(title)}</h1>"))
    return path
