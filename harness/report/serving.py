"""The report's Serving section: what padding costs as lengths skew, paged decode bandwidth against page size, the winner per batch.

It exists only when the run has rows of ragged batches (`harness.analysis.serving`); the numbers come from
there, the figures are drawn here with the helpers of `harness.report.figures`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap, to_rgba

from harness.analysis import serving
from harness.report.figures import MAX_PANELS, Figure, chunks, new_figure, panels, plain, to_data_uri
from harness.report.page import esc, fmt
from harness.report.writer import Csv, Section, Table

ANCHOR = "serving"


@dataclass(frozen=True)
class View:
    """One view of the section: its heading and prose, the table's columns, its CSV, and the figures drawn from the table."""

    title: str
    prose: str
    empty: str
    csv: str
    columns: list[str]
    headers: list[str]
    figures: Callable[[pd.DataFrame, Mapping[str, Any]], list[Figure]]
    formats: dict[str, Any] = field(default_factory=dict)

    def blocks(self, table: pd.DataFrame, colors: Mapping[str, Any]) -> list:
        """The view's heading and prose, then its CSV, table and figures; one line saying why when the table is empty."""
        head = [f"<h3>{esc(self.title)}</h3>", f"<p>{self.prose}</p>"]
        if table.empty:
            return head + [f'<p class="muted">{esc(self.empty)}</p>']
        return head + [Csv(table, self.csv), Table(table, columns=self.columns, headers=self.headers, formats=self.formats), *self.figures(table, colors)]


def serving_sections(frame: pd.DataFrame, colors: Mapping[str, Any], baseline: str | None = None) -> list[Section]:
    """The Serving section when the frame has rows of ragged batches, else nothing."""
    if not serving.has_serving_rows(frame):
        return []
    body: list = ["<p>Rows of serving-shaped batches: each request has its own query and KV length, laid out padded (to the longest, "
                  "masked), packed (tokens concatenated with offsets) or paged (the KV cache in scattered pages). Only rows that ran and "
                  "agree with the float64 reference of each sequence are used.</p>"]
    unplaced = serving.rows_without_lengths(frame)
    if len(unplaced):
        body.append(f'<div class="warn">Serving rows without sequence lengths (seq_lens_q, seq_lens_kv) are in no view below: {len(unplaced)}, '
                    f'e.g. {esc(unplaced["case_id"].iloc[0])} ({esc(unplaced["backend"].iloc[0])}).</div>')
    wins = serving.batch_winners(frame, baseline)
    if not wins.empty:
        wins = wins.assign(layout_label=[layout_label(l, p) for l, p in zip(wins["layout"], wins["page_size"])])
    for view, table in ((SKEW, serving.packed_vs_padded(frame)), (BANDWIDTH, serving.paged_decode_bandwidth(frame)), (WINNERS, wins)):
        body += view.blocks(table, colors)
    return [Section(ANCHOR, "Serving: ragged, padded and paged batches", body, nav="Serving")]


def _speedup_cell(value: Any, row: Any) -> tuple[str, str]:
    if row["within_noise"]:
        return f"{fmt(value)} (within noise)", "bad"
    return fmt(value), "good" if value > 1 else ""


def _ideal_line(ax: Any, sub: pd.DataFrame) -> None:
    share = np.linspace(0.0, float(sub["padding_share"].max()), 50)
    ax.plot(share, 1.0 / (1.0 - share), color="black", ls="--", lw=1, label="time ∝ real work")
    ax.axhline(1.0, color="grey", lw=0.8)


def _pct_cell(value: Any, row: Any) -> tuple[str, str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "no measured copy peak", ""
    return (f"{value:.1f} % impossible", "impossible") if row["impossible"] else (f"{value:.1f} %", "")


def _peak_lines(ax: Any, sub: pd.DataFrame) -> None:
    for peak in sorted(set(sub["peak_gbps"].dropna())):
        ax.axhline(peak, color="black", ls="--", lw=1)
        ax.annotate(f"measured copy peak {peak:.4g} GB/s", xy=(0.01, peak), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    above = sub[sub["impossible"]]
    if len(above):
        ax.scatter(above["page_size"].astype(float), above["kv_gbps"], marker="x", s=60, color="red", zorder=5, label="above the copy peak: impossible")


def _skew_figures(table: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """The speed-up of packing against the padding share, a panel per fixed-parameter group."""
    return _per_group_plot(table, ["group"], "padding_share", "speedup", colors, xlabel="padding share", ylabel="padded ms ÷ packed ms",
                           title="Packed against padded", caption="One line per backend; dashed: 1 / (1 − padding share), the speed-up if time "
                           "followed the real work; grey: no speed-up.", decorate=_ideal_line)


def _bandwidth_figures(table: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """KV GB/s against page size, a panel per fixed-parameter group and batch, the run's copy peak dashed."""
    return _per_group_plot(table, ["group", "batch"], "page_size", "kv_gbps", colors, xlabel="page size (tokens)", ylabel="KV GB/s", logx=True,
                           title="Paged decode bandwidth", caption="One line per backend; dashed: the run's measured copy peak; "
                           "a red cross is above it (impossible).", decorate=_peak_lines)


def _per_group_plot(table: pd.DataFrame, keys: list[str], x: str, y: str, colors: Mapping[str, Any], *, xlabel: str, ylabel: str,
                    title: str, caption: str, decorate: Any, logx: bool = False) -> list[Figure]:
    """A panel per value of `keys`, a line per backend of `y` against `x`; `decorate(ax, panel rows)` adds the reference lines."""
    figures = []
    grouped = list(table.groupby(keys, sort=True))
    for part, chunk in chunks(grouped, MAX_PANELS):
        fig, axes = panels(len(chunk))
        for ax, (key, sub) in zip(axes, chunk):
            for backend, line in sub.groupby("backend", sort=True):
                line = line.sort_values(x)
                ax.plot(line[x].astype(float), line[y].astype(float), marker="o", ms=3, lw=1.4, color=colors[backend], label=plain(backend))
            decorate(ax, sub)
            if logx:
                ax.set_xscale("log", base=2)
            ax.set_title(plain(" · ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)) if k) or "all"), fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6, loc="best")
        suffix = f" ({part + 1}/{math.ceil(len(grouped) / MAX_PANELS)})" if len(grouped) > MAX_PANELS else ""
        fig.suptitle(plain(title + suffix), fontsize=11)
        # panels() fixes the layout in inches: no tight_layout pass (it cannot place fixed gridspec axes, and draws twice)
        figures.append(Figure(title + suffix, to_data_uri(fig), caption))
    return figures


def layout_label(layout: Any, page_size: Any) -> str:
    """A layout as the winner table names it: `paged p16` for a paged row, else the layout."""
    return f"paged p{int(page_size)}" if layout == "paged" and page_size == page_size and page_size is not None else str(layout)


def _winner_grids(wins: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Per fixed-parameter group: batches × layouts, each cell its winner and margin, coloured by the winner."""
    figures = []
    for group, sub in wins.groupby("group", sort=True):
        batches = sorted(set(sub["batch"]))
        layouts = [label for _, label in sorted({(serving.layout_order(l, p), layout_label(l, p)) for l, p in zip(sub["layout"], sub["page_size"])})]
        names = sorted(set(sub["winner"]))
        grid = np.full((len(batches), len(layouts)), np.nan)
        fig = new_figure(max(4.0, 1.6 * len(layouts) + 2), max(2.2, 0.55 * len(batches) + 1.2), constrained=True)
        ax = fig.subplots()
        for _, cell in sub.iterrows():
            r, c = batches.index(cell["batch"]), layouts.index(cell["layout_label"])
            grid[r, c] = names.index(cell["winner"])
            margin = "" if pd.isna(cell["margin_pct"]) else (" (noise)" if cell["within_noise"] else f" +{cell['margin_pct']:.0f}%")
            alone = "only candidate: " if cell.get("only_candidate") else ""  # a backend that ran alone won nothing
            ax.text(c, r, plain(f"{alone}{cell['winner']}{margin}"), ha="center", va="center", fontsize=7)
        ax.imshow(grid, cmap=ListedColormap([to_rgba(colors[n], 0.35) for n in names]), vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
        ax.set_xticks(range(len(layouts)), [plain(l) for l in layouts], fontsize=8)
        ax.set_yticks(range(len(batches)), [plain(b) for b in batches], fontsize=8)
        ax.set_title(plain(f"winner per batch: {group}" if group else "winner per batch"), fontsize=10)
        figures.append(Figure(f"Winner per batch: {group}", to_data_uri(fig),
                              "Each cell: the fastest agreeing backend for that batch and layout, and how much slower the runner-up is (noise: within noise); "
                              "'only candidate': no other backend ran that batch and layout, so it is no win."))
    return figures


SKEW = View(
    "Packed against padded as the lengths skew",
    "Per backend and batch: the padded row's median over the packed row's (above 1, packing is faster), against the "
    "<em>padding share</em>, the part of the padded batch's query–key rectangle (B · longest query · longest KV) that holds "
    "no real pair. If time followed the real work, the speed-up would be 1 / (1 − padding share) (dashed).",
    "No batch has both a padded and a packed row of one backend that ran and agreed.", "packed_vs_padded.csv",
    ["backend", "batch", "group", "B", "tokens_kv", "kv_max_over_mean", "padding_share", "padded_ms", "packed_ms", "speedup", "ideal_speedup"],
    ["backend", "batch", "fixed parameters", "B", "KV tokens", "longest KV ÷ mean", "padding share", "padded ms", "packed ms",
     "speed-up of packing", "if time ∝ work"],
    _skew_figures, {"speedup": _speedup_cell})
BANDWIDTH = View(
    "Paged decode: KV bandwidth against page size",
    "Decode batches (one query token per request) with a paged KV cache: the bytes of the KV the batch really holds "
    "(real tokens only, never the unused tail of a page) over the median time, against the copy peak measured at the start "
    "of the run (bytes read plus written per second). Above 100 % is impossible and flagged.",
    "No paged decode row ran and agreed.", "paged_decode_bandwidth.csv",
    ["backend", "batch", "group", "page_size", "B", "tokens_kv", "latency_ms_median", "kv_gbps", "pct_copy_peak"],
    ["backend", "batch", "fixed parameters", "page size", "B", "KV tokens", "median ms", "KV GB/s", "% of copy peak"],
    _bandwidth_figures, {"pct_copy_peak": _pct_cell})
WINNERS = View(
    "The winner per batch",
    "Per batch (its length distribution or mixed-batch description) and layout: the fastest backend among rows that agree, "
    "and how many times the winner's time the runner-up takes. <em>Within noise</em> (their 95 % intervals of the median overlap, "
    "widened by the run-to-run variation where one was given: the rule the backend-choice table and compare use) means either is "
    "a fair choice; contended and suspect rows are left out (Sample flags). <em>plan ms</em> is the winner's untimed set-up per batch, which a server pays "
    "once per step.", "No serving row ran and agreed: there is no winner to report.", "batch_winners.csv",
    ["batch", "layout_label", "group", "winner", "winner_ms", "winner_plan_ms", "runner_up", "runner_up_ms", "runner_up_ratio", "candidates", "left_out"],
    ["batch", "layout", "fixed parameters", "winner", "winner ms", "plan ms", "runner-up", "runner-up ms", "runner-up ÷ winner", "agreeing backends",
     "left out (flagged)"],
    _winner_grids, {"winner": lambda v, r: (f"only candidate: {v}", "bad") if r.get("only_candidate") else (str(v), ""),
                    "runner_up_ratio": lambda v, r: (f"{fmt(v)}× (within noise)", "bad") if r["within_noise"] else (f"{fmt(v)}×" if v == v and v is not None else "", "")})
