"""The report's figures, drawn from the data (on `harness.report.canvas`, never pyplot) and embedded as base64 PNG.

Which figures exist is decided by the rows: one figure per dtype (and pass) for each quantity,
one panel per combination of the other fixed parameters, one line per backend. Nothing here
keeps a list of backends or plots by hand.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from harness import analysis
from harness.analysis import roofline
from harness.analysis.trust import untrusted
from harness.report.canvas import (  # noqa: F401 - MAX_PANELS, Figure, plain, backend_colors: the report's modules import them from here
    MAX_PANELS, Figure, backend_colors, chunks, figure_legend, new_figure, panel_note, panels, plain, slim_columns, style_panel, to_data_uri,
)


def _per_group_figures(
    rows: pd.DataFrame, value: str, ylabel: str, title: str, caption: str, colors: Mapping[str, Any],
    *, logy: bool = True, hline: Any = None, note: Any = None, speed: bool = True,
) -> list[Figure]:
    """One figure per (dtype, mode), a panel per fixed-parameter group, a line per backend of `value` against S.

    A backend's colour is the same in every panel, so one legend serves the figure; what differs per panel and
    line (`note(backend, group key, line)`: the fitted α) is listed in the panel's corner (`panel_note`). Where `value`
    is a speed (time, throughput, energy), a flagged row's point is hollow (`mark_flagged`).
    """
    figures = []
    rows = rows[rows[value].notna() & (rows[value] > 0)] if logy else rows[rows[value].notna()]
    if rows.empty:
        return figures
    keys = analysis.group_key_columns(rows, exclude=("dtype", "mode"))
    rows = rows.assign(**{FLAGGED: untrusted(rows) & speed})
    rows = rows[slim_columns(rows, keys, "dtype", "mode", "backend", "S", "run_id", value, FLAGGED)]
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
                    mark_flagged(ax, line, value, colors[backend])
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


#: The column `_per_group_figures` marks a point by: the row carries an untrusted flag (contended, suspect, …).
FLAGGED = "_untrusted"
#: The legend entry of a flagged point: what it measured is not the backend's speed.
FLAGGED_LABEL = "hollow: contended or suspect, not a speed"


#: The (legend-hidden) label of the hollow rings `mark_flagged` draws, one collection per line.
FLAGGED_RINGS = "_flagged"


def mark_flagged(ax: Any, line: pd.DataFrame, value: str, color: Any) -> None:
    """Draw each flagged point of `line` hollow (white, ringed in its backend's colour), so no one reads its median as a speed.

    One neutral entry (a black ring) names them in the figure's legend.
    """
    flagged = line[line[FLAGGED].astype(bool)] if FLAGGED in line.columns else line.iloc[0:0]
    if len(flagged):
        ax.scatter(flagged["S"].astype(float), flagged[value].astype(float), s=46, marker="o", facecolors="white", edgecolors=[color],
                   linewidths=1.3, zorder=5, label=FLAGGED_RINGS)
        ax.scatter([], [], s=46, marker="o", facecolors="white", edgecolors="black", linewidths=1.3, label=FLAGGED_LABEL)


def latency_figures(frame: pd.DataFrame, colors: Mapping[str, Any]) -> list[Figure]:
    """Median latency against S per backend, log-log."""
    rows = analysis.ok_rows(frame)
    return _per_group_figures(rows, "latency_ms_median", "median latency (ms)", "Latency against S", "Median of the timed samples; log-log axes. Hollow points: rows timed while contended or with too wide a spread, "
                              "which decide nothing. The projections curve, where present, is the layer's Q/K/V/O term.", colors)


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

    return _per_group_figures(rows, "peak_mem_bytes", "peak memory (bytes)", "Peak memory against S", "Measured peak memory of one call above the inputs; log-log axes; α (in each panel's corner) is the fitted exponent (memory ∝ S^α).", colors, note=note, speed=False)


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
    """Per dtype and score variant: which backend wins over S × B and over S × H_kv (among agreeing rows), with won/cases in each cell.

    Plain, sinks, softcap … cases are separate maps (one problem per cell); a cell whose cases each had one candidate
    says "only candidate" in grey, never a win. `wins` is `winners(frame)` if known.
    """
    wins = analysis.winners(frame) if wins is None else wins
    if wins.empty:
        return []
    figures = []
    for dtype in sorted(set(wins["dtype"])):
        for variant in sorted(set(wins.loc[wins["dtype"] == dtype, "variant"]), key=lambda v: (v != "plain", v)):
            maps = [(axis, analysis.winner_map(frame, axis, dtype, wins, variant)) for axis in ("B", "H_kv")]
            maps = [(axis, m) for axis, m in maps if not m.empty]
            if maps:
                figures.append(_winner_maps(maps, dtype, variant, colors))
    return figures


def _winner_maps(maps: list[tuple[str, pd.DataFrame]], dtype: str, variant: str, colors: Mapping[str, Any]) -> Figure:
    """One figure of a dtype's and variant's winner maps, a panel per axis."""
    fig = new_figure(6.5 * len(maps), 3.6, constrained=True)
    axes = fig.subplots(1, len(maps), squeeze=False)
    for ax, (axis, m) in zip(axes.flat, maps):
        s_values = sorted(set(m["S"]))
        a_values = sorted(set(m[axis]))
        names = sorted(set(m["winner"].dropna()))
        index = {name: i for i, name in enumerate(names)}
        grid = np.full((len(a_values), len(s_values)), np.nan)
        for _, cell in m.iterrows():
            r, c = a_values.index(cell[axis]), s_values.index(cell["S"])
            if cell["winner"] is None or cell["winner"] != cell["winner"]:
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, color="#dddddd", zorder=0))
                ax.text(c, r, plain(f"only candidate:\n{cell['alone']}"), ha="center", va="center", fontsize=7, color="#555555")
                continue
            grid[r, c] = index[cell["winner"]]
            alone = f"\n+{cell['only_candidate']} only candidate" if cell["only_candidate"] else ""
            ax.text(c, r, plain(f"{cell['winner']}\n{cell['won']}/{cell['cases']}{alone}"), ha="center", va="center", fontsize=7)
        if names:
            cmap = ListedColormap([_light(colors[n]) for n in names])
            ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
        ax.set_xlim(-0.5, len(s_values) - 0.5)
        ax.set_ylim(-0.5, len(a_values) - 0.5)
        ax.set_xticks(range(len(s_values)), [str(s) for s in s_values], fontsize=8)
        ax.set_yticks(range(len(a_values)), [str(a) for a in a_values], fontsize=8)
        ax.set_xlabel("S", fontsize=9)
        ax.set_ylabel(axis, fontsize=9)
        ax.set_title(f"winner over S × {axis}", fontsize=10)
    title = f"Winner maps: {dtype}, {variant}"
    fig.suptitle(plain(title), fontsize=11)
    return Figure(title, to_data_uri(fig), "Each cell: the backend that won the most cases with at least two candidates (fastest among rows that "
                  "agree with the reference and carry no flag) and won/cases; a case only one backend could run is counted apart "
                  "(only candidate), never as a win. One map per score variant; other parameters vary inside a cell.")


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
