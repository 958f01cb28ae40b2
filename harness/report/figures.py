"""The report's figures, drawn with matplotlib's Agg canvas from the data and embedded as base64 PNG.

Which figures exist is decided by the rows: one figure per dtype (and pass) for each quantity,
one panel per combination of the other fixed parameters, one line per backend. Nothing here
keeps a list of backends or plots by hand.

Figures are `matplotlib.figure.Figure`s on a `FigureCanvasAgg`, never pyplot: importing this module
leaves the process's backend and rcParams as they were (a program that imports attnbench keeps its
own GUI backend). Panel grids have a fixed layout in inches (`panels`), so each figure is drawn once,
when it is saved: measuring every text's extent for `tight_layout` and again for `bbox_inches="tight"`
was most of a report's CPU time.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure as CanvasFigure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from harness import analysis

from harness.analysis import roofline

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


def _per_group_figures(
    rows: pd.DataFrame, value: str, ylabel: str, title: str, caption: str, colors: Mapping[str, Any],
    *, logy: bool = True, hline: Any = None, note: Any = None,
) -> list[Figure]:
    """One figure per (dtype, mode), a panel per fixed-parameter group, a line per backend of `value` against S.

    A backend's colour is the same in every panel, so one legend serves the figure; what differs per panel and
    line (`note(backend, group key, line)`: the fitted α) is listed in the panel's corner (`panel_note`).
    """
    figures = []
    rows = rows[rows[value].notna() & (rows[value] > 0)] if logy else rows[rows[value].notna()]
    if rows.empty:
        return figures
    keys = analysis.group_key_columns(rows, exclude=("dtype", "mode"))
    rows = rows[slim_columns(rows, keys, "dtype", "mode", "backend", "S", "run_id", value)]
    for (dtype, mode), by_dtype in rows.groupby(["dtype", "mode"], sort=True):
        groups = list(analysis.groups(by_dtype, keys))
        for part, chunk in chunks(groups, MAX_PANELS):
            fig, axes = panels(len(chunk), legend_band=True)
            same_s = len({frozenset(sub["S"]) for _, sub in chunk}) == 1
            for place, (ax, (key, sub)) in enumerate(zip(axes, chunk)):
                notes = []
                for backend, line in sub.groupby("backend", sort=True):
                    line = line.sort_values("S")
                    ax.plot(line["S"].astype(float), line[value].astype(float), marker="o", ms=3, lw=1.4, color=colors[backend], label=plain(backend))
                    text = note(backend, {**key, "dtype": dtype, "mode": mode}, line) if note else None  # the fits name a group with its dtype
                    if text:
                        notes.append(f"{backend} {text}")
                panel_note(ax, notes)
                if hline is not None:
                    lines = hline(dtype, sub)
                    for y, text in lines:
                        ax.axhline(y, color="black", ls="--", lw=1)
                        ax.annotate(plain(text), xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
                        above = sub[sub[value] > y]
                        if len(above):  # impossible points: marked, never left to look like wins
                            ax.scatter(above["S"].astype(float), above[value].astype(float), marker="x", s=60, color="red", zorder=5,
                                       label="above the measured peak: impossible")
                    if not lines:
                        ax.annotate(f"no measured {dtype} peak in this run", xy=(0.01, 0.02), xycoords="axes fraction", fontsize=7, color="grey")
                style_panel(ax, analysis.describe_group({**key, "dtype": None}) or "all", ylabel, sub["S"], logy=logy, place=(place, len(chunk)),
                            same_s=same_s)
            figure_legend(fig, axes[:len(chunk)])
            suffix = f" ({part + 1}/{math.ceil(len(groups) / MAX_PANELS)})" if len(groups) > MAX_PANELS else ""
            mode_text = "" if mode == "fwd" else f", {mode}"
            fig.suptitle(plain(f"{title}: {dtype}{mode_text}{suffix}"), fontsize=11)
            figures.append(Figure(f"{title}: {dtype}{mode_text}{suffix}", to_data_uri(fig), caption))
    return figures


def latency_figures(frame: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Median latency against S per backend, log-log."""
    rows = analysis.ok_rows(frame)
    return _per_group_figures(rows, "latency_ms_median", "median latency (ms)", "Latency against S", "Median of the timed samples; log-log axes. The projections curve, where present, is the layer's Q/K/V/O term.", colors)


def energy_figures(frame: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Energy per call against S per backend, log-log (rows with an energy figure only)."""
    rows = analysis.ok_rows(frame)
    return _per_group_figures(rows, "energy_mj_per_call", "energy per call (mJ)", "Energy per call against S",
                              "The board's (or CPU package's) energy per call, static power included, from the energy phase after the timed samples; log-log axes.", colors)


def tflops_figures(frame: pd.DataFrame, peaks: Mapping[str, Any], colors: Mapping[str, Any]) -> list[Figure]:
    """Achieved TFLOP/s against S per backend, with each run's measured matmul peak for the dtype drawn as a dashed line."""
    rows = analysis.ok_rows(frame)

    def hline(dtype: str, sub: pd.DataFrame) -> list[tuple[float, str]]:
        lines = []
        for run_id in sorted(set(sub["run_id"])):
            peak = roofline.peak_tflops(peaks.get(run_id), dtype)
            if peak:
                lines.append((peak, f"measured {dtype} matmul peak {peak:.3g} TFLOP/s" + (f" ({run_id})" if len(peaks) > 1 else "")))
        return lines

    return _per_group_figures(rows, "tflops", "TFLOP/s", "Throughput against S", "Achieved TFLOP/s (FLOPs from harness.attention.theory); dashed: the matmul peak measured at the start of the run. A point above it is impossible and flagged in the roofline table.", colors, hline=hline)


def memory_figures(frame: pd.DataFrame, fits: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Peak memory against S per backend, log-log, each line labelled with its fitted exponent α."""
    rows = analysis.ok_rows(frame)
    alpha = {}
    if not fits.empty:
        for _, f in fits.iterrows():
            alpha[(f["backend"], f["group"])] = f["alpha_memory"]

    def note(backend: str, key: Mapping[str, Any], line: pd.DataFrame) -> str | None:
        a = alpha.get((backend, analysis.describe_group(key)))
        return f"α={a:.2f}" if a is not None and a == a else None

    return _per_group_figures(rows, "peak_mem_bytes", "peak memory (bytes)", "Peak memory against S", "Measured peak memory of one call above the inputs; log-log axes; α (in each panel's corner) is the fitted exponent (memory ∝ S^α).", colors, note=note)


def crossover_figures(frame: pd.DataFrame, table: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Per model width D: the projections' and each core's latency against S, with S* marked (and the FLOP model's S* and D for reference)."""
    if table.empty:
        return []
    rows = analysis.ok_rows(frame)
    keys = analysis.group_key_columns(rows)
    rows = rows[slim_columns(rows, keys, "backend", "S", "computes_attention", "latency_ms_median")]
    figures = []
    for D, by_d in table.groupby("D", sort=True):
        groups = list(by_d.groupby("group", sort=True))
        for part, chunk in chunks(groups, MAX_PANELS):
            fig, axes = panels(len(chunk), legend_band=True)
            for place, (ax, (label, entries)) in enumerate(zip(axes, chunk)):
                first = entries.iloc[0]
                mask = np.ones(len(rows), dtype=bool)
                for k in keys:
                    value = first[k]
                    column = rows[k]
                    mask &= (column.isna().to_numpy() if value is None or (isinstance(value, float) and value != value) else (column == value).to_numpy())
                sub = rows[mask]
                proj = sub[~sub["computes_attention"].astype(bool)].sort_values("S")
                ax.plot(proj["S"].astype(float), proj["latency_ms_median"], color="black", lw=2.2, marker="s", ms=3, label="projections")
                for _, e in entries.iterrows():
                    core = sub[sub["backend"] == e["backend"]].sort_values("S")
                    color = colors[e["backend"]]
                    ax.plot(core["S"].astype(float), core["latency_ms_median"], color=color, marker="o", ms=3, lw=1.4, label=plain(e["backend"]))
                    if e["S_star"] is not None and e["S_star"] == e["S_star"]:
                        ax.axvline(float(e["S_star"]), color=color, ls="-", lw=0.8, alpha=0.8)
                        ax.plot([float(e["S_star"])], [np.interp(math.log(e["S_star"]), np.log(proj["S"].astype(float)), proj["latency_ms_median"])], marker="*", ms=11, color=color, mec="black", zorder=5)
                model = float(entries.iloc[0]["model_S_star"])
                ax.axvline(model, color="grey", ls=":", lw=1.2, label="FLOP model S*")
                ax.axvline(int(D), color="grey", ls="--", lw=0.8, label="rule of thumb S = D")
                panel_note(ax, [f"{e['backend']} S* {e['S_star_text']}" for _, e in entries.iterrows()] + [f"FLOP model S* {model:,.0f}"])
                style_panel(ax, f"D={int(D)}  {label}", "median latency (ms)", sub["S"], place=(place, len(chunk)))
            figure_legend(fig, axes[:len(chunk)])
            suffix = f" ({part + 1}/{math.ceil(len(groups) / MAX_PANELS)})" if len(groups) > MAX_PANELS else ""
            fig.suptitle(f"Crossover at D = {int(D)}{suffix}", fontsize=11)
            figures.append(Figure(f"Crossover at D = {int(D)}{suffix}", to_data_uri(fig), "Black: the projections; coloured: each attention core; stars and solid lines: the measured S*; dotted: the FLOP model's S* = D·(1 + H_kv/H), twice that causal; dashed: the rule of thumb S ≈ D."))
    return figures


def winner_map_figures(frame: pd.DataFrame, colors: Mapping[str, Any], wins: pd.DataFrame | None = None) -> list[Figure]:
    """Per dtype: which backend wins over S × B and over S × H_kv (among agreeing rows), with won/cases in each cell; `wins` is `winners(frame)` if known."""
    wins = analysis.winners(frame) if wins is None else wins
    if wins.empty:
        return []
    figures = []
    for dtype in sorted(set(wins["dtype"])):
        maps = [(axis, analysis.winner_map(frame, axis, dtype, wins)) for axis in ("B", "H_kv")]
        maps = [(axis, m) for axis, m in maps if not m.empty]
        if not maps:
            continue
        fig = new_figure(6.5 * len(maps), 3.6, constrained=True)
        axes = fig.subplots(1, len(maps), squeeze=False)
        for ax, (axis, m) in zip(axes.flat, maps):
            s_values = sorted(set(m["S"]))
            a_values = sorted(set(m[axis]))
            names = sorted(set(m["winner"]))
            index = {name: i for i, name in enumerate(names)}
            grid = np.full((len(a_values), len(s_values)), np.nan)
            for _, cell in m.iterrows():
                r, c = a_values.index(cell[axis]), s_values.index(cell["S"])
                grid[r, c] = index[cell["winner"]]
                ax.text(c, r, plain(f"{cell['winner']}\n{cell['won']}/{cell['cases']}"), ha="center", va="center", fontsize=7)
            cmap = ListedColormap([_light(colors[n]) for n in names])
            ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
            ax.set_xticks(range(len(s_values)), [str(s) for s in s_values], fontsize=8)
            ax.set_yticks(range(len(a_values)), [str(a) for a in a_values], fontsize=8)
            ax.set_xlabel("S", fontsize=9)
            ax.set_ylabel(axis, fontsize=9)
            ax.set_title(f"winner over S × {axis}", fontsize=10)
        fig.suptitle(plain(f"Winner maps: {dtype}"), fontsize=11)
        figures.append(Figure(f"Winner maps: {dtype}", to_data_uri(fig), "Each cell: the backend that won the most cases (fastest among rows that agree with the reference) and won/cases; other parameters vary inside a cell."))
    return figures


def _light(color: Any) -> tuple[float, float, float]:
    r, g, b = color[:3]
    return (0.55 + 0.45 * r, 0.55 + 0.45 * g, 0.55 + 0.45 * b)


def agreement_figure(frame: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Each checked row's error over its bound, per backend (above 1 = disagrees)."""
    rows = analysis.ok_rows(frame)
    rows = rows[rows["max_abs_err"].notna() & rows["err_bound"].notna() & (rows["err_bound"] > 0)]
    if rows.empty:
        return []
    backends = sorted(set(rows["backend"]))
    fig = new_figure(max(5.0, 1.2 * len(backends) + 2), 3.4, constrained=True)
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for i, backend in enumerate(backends):
        sub = rows[rows["backend"] == backend]
        ratio = (sub["max_abs_err"] / sub["err_bound"]).clip(lower=1e-6).to_numpy(dtype=float)
        ax.scatter(i + rng.uniform(-0.2, 0.2, len(ratio)), ratio, s=12, color=colors[backend], alpha=0.8)
    ax.axhline(1.0, color="red", lw=1, ls="--")
    ax.annotate("bound (err = 2·eager err + atol)", xy=(0.01, 1.0), xycoords=("axes fraction", "data"), fontsize=7, va="bottom", color="red")
    ax.set_xticks(range(len(backends)), [plain(b) for b in backends], rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("max |out − ref| / bound", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return [Figure("Agreement errors", to_data_uri(fig), "Each dot is one checked row: its largest error against the float64 reference over the row's bound. Below the line agrees.")]
