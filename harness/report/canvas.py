"""How the report draws: figures on their own Agg canvas, a panel grid with a fixed layout in inches, and the styling every panel shares.

Figures are `matplotlib.figure.Figure`s on a `FigureCanvasAgg`, never pyplot: importing this module
leaves the process's backend and rcParams as they were (a program that imports attnbench keeps its
own GUI backend). Panel grids have a fixed layout (`panels`), so each figure is drawn once, when it is
saved: measuring every text's extent for `tight_layout` and again for `bbox_inches="tight"` was most of
a report's CPU time. What the figures show is `harness.report.figures`.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as CanvasFigure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

#: At most this many panels per figure; more groups spill into further figures.
MAX_PANELS = 12
COLUMNS = 4
DPI = 80


def plain_number(value: float, _position: Any = None) -> str:
    """A tick label as a plain number: integers whole (1024, 65536), others in the shortest form (0.01, 1e+09)."""
    return f"{int(value)}" if value >= 1 and float(value).is_integer() and value < 1e5 else f"{value:g}"


#: The minor ticks of a narrow log axis, each labelled: 2, 3 and 5 times a power of ten.
MINOR_SUBS = (2.0, 3.0, 5.0)
#: A panel's x axis is ticked at each measured S up to this many of them (then at powers of 2).
MAX_S_TICKS = 10
#: A log y axis spanning fewer decades than this keeps its minor ticks: with one or no decade mark on it, they are its labels.
FEW_DECADES = 2.0


@dataclass(frozen=True)
class Figure:
    """One embedded figure: a title, a PNG data URI and a caption (all plain text; the page escapes them)."""

    title: str
    data_uri: str
    caption: str = ""


#: zlib level of the PNGs: 3 encodes in about half the time of PIL's default 6, for files about 10 % larger.
PNG_COMPRESSION = 3
#: A panel grid's margins in inches: room for the y tick labels and label (left), the x label (bottom), the
#: suptitle (top), and between panels for the next one's y labels (across) and the title above x labels (down).
MARGIN_IN = {"left": 0.75, "right": 0.15, "bottom": 0.5, "top": 0.55, "across": 0.75, "down": 0.75}


def new_figure(width: float, height: float, *, constrained: bool = False) -> CanvasFigure:
    """A figure on its own Agg canvas (no pyplot, no global backend); `constrained` for one-off figures whose labels vary in size."""
    fig = CanvasFigure(figsize=(width, height), layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    return fig


def to_data_uri(fig: Any) -> str:
    """Render a figure to a base64 PNG data URI (one draw: its layout is already fixed)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, pil_kwargs={"compress_level": PNG_COMPRESSION})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def plain(text: Any) -> str:
    """`text` drawn as written: matplotlib reads `$…$` as mathtext, so a backend or run named `my$x^2$` would be parsed (or fail to)."""
    return str(text).replace("$", r"\$")


def backend_colors(names: Iterable[str]) -> dict[str, Any]:
    """A stable colour per backend name (sorted order into tab10, then tab20)."""
    names = sorted(set(names))
    palette = list(colormaps["tab10"].colors) + list(colormaps["tab20"].colors[1::2])
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


#: Where a panel's axis labels are centred, in inches from the axes: past the tick labels (7 pt, at most six characters: "0.0001", "1e+08").
XLABEL_BELOW_IN, YLABEL_LEFT_IN = 0.3, 0.52
#: The band under the suptitle that a figure-wide legend takes, in inches, and where in it the legend's top edge is (from the figure's top).
LEGEND_BAND_IN, LEGEND_TOP_IN = 0.4, 0.42


def panels(n: int, *, legend_band: bool = False) -> tuple[Any, np.ndarray]:
    """A figure with `n` panels in rows of up to COLUMNS (extra axes hidden), and its axes; `legend_band` leaves room for `figure_legend`."""
    cols = min(COLUMNS, n)
    rows = math.ceil(n / cols)
    width, height = (6.5, 4.3) if n <= 2 else (4.2, 3.2)  # one or two panels: draw them readable, not thumbnail-sized
    m = {**MARGIN_IN, "top": MARGIN_IN["top"] + (LEGEND_BAND_IN if legend_band else 0.0)}
    fig_w = m["left"] + m["right"] + cols * width + (cols - 1) * m["across"]
    fig_h = m["bottom"] + m["top"] + rows * height + (rows - 1) * m["down"]
    fig = new_figure(fig_w, fig_h)
    axes = fig.subplots(rows, cols, squeeze=False, gridspec_kw={
        "left": m["left"] / fig_w, "right": 1 - m["right"] / fig_w, "bottom": m["bottom"] / fig_h, "top": 1 - m["top"] / fig_h,
        "wspace": m["across"] / width, "hspace": m["down"] / height})
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def figure_legend(fig: Any, axes: Iterable[Any]) -> None:
    """One legend for the whole figure, in the band `panels(legend_band=True)` left under the suptitle: each label once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="upper center", bbox_to_anchor=(0.5, 1 - LEGEND_TOP_IN / fig.get_figheight()), ncol=min(len(entries), 8),
               fontsize=8, frameon=False)


def panel_note(ax: Any, lines: list[str]) -> None:
    """What differs per panel (each line's α, each core's S*), as one block of text in the panel's usually empty lower right.

    One text, not a legend per panel: laying out a legend's entries cost more than the rest of the panel.
    """
    if lines:
        ax.text(0.98, 0.03, "\n".join(plain(line) for line in lines), transform=ax.transAxes, ha="right", va="bottom", fontsize=6, zorder=6,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#cccccc", "pad": 2})


def style_panel(ax: Any, title: str, ylabel: str, s_values: Iterable[Any] = (), *, logy: bool = True, place: tuple[int, int] = (0, 1),
                same_s: bool = False) -> None:
    """A panel against S: log₂ x ticked at the measured `s_values` (up to MAX_S_TICKS), log y (or linear), labels, major grid.

    `place` is (the panel's index, the figure's panel count) of a `panels` grid: every panel of a figure shows
    one quantity, so the y label is on the first column only and "S" under each column's lowest panel; when
    every panel has the `same_s` values, their tick labels too.

    Tick labels are plain numbers (S = 1024, not 2¹⁰; 0.01 ms, not 10⁻²): easier to read, and no mathtext to lay out.
    Minor ticks only on a log y axis spanning under FEW_DECADES, where they carry the only labels; elsewhere
    none (each tick is two lines and a text: thousands of artists on a 12-panel log-log figure, and the grid
    and labels are on the major ones). The title and the axis labels sit at fixed offsets (placed
    automatically, matplotlib measures every tick label's extent again for each of them, on every panel).
    """
    ax.set_xscale("log", base=2)
    ticks = sorted({float(v) for v in s_values})
    if 0 < len(ticks) <= MAX_S_TICKS:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))  # one per axis: a formatter keeps its axis
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        low, high = ax.get_ylim()
        if low > 0 and high / low < 10**FEW_DECADES:
            ax.yaxis.set_minor_locator(LogLocator(base=10, subs=MINOR_SUBS))  # only the ticks that get a label
            ax.yaxis.set_minor_formatter(FuncFormatter(plain_number))
        else:
            ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_minor_locator(NullLocator())
    ax.set_title(plain(title), fontsize=9, y=1.0, pad=4)
    index, count = place
    cols = min(COLUMNS, count)
    if index + cols >= count:
        ax.set_xlabel("S", fontsize=8)
    elif same_s:
        ax.tick_params(labelbottom=False)
    if index % cols == 0:
        ax.set_ylabel(ylabel, fontsize=8)
    box = ax.get_position()
    width_in, height_in = box.width * ax.figure.get_figwidth(), box.height * ax.figure.get_figheight()
    ax.xaxis.set_label_coords(0.5, -XLABEL_BELOW_IN / height_in)
    ax.yaxis.set_label_coords(-YLABEL_LEFT_IN / width_in, 0.5)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(True, which="major", alpha=0.3)


def slim_columns(rows: pd.DataFrame, keys: Iterable[str], *more: str) -> list[str]:
    """The columns a figure reads, in order, once each: selecting a panel's rows copies every column, and a run's rows have about 200."""
    return [c for c in dict.fromkeys([*keys, *more]) if c in rows.columns]


def chunks(items: list, size: int) -> Iterable[tuple[int, list]]:
    """(index, slice) of `items` in slices of `size`."""
    for start in range(0, len(items), size):
        yield start // size, items[start : start + size]
