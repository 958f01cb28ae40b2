"""The report's Roofline section: the ceilings the run measured (which product or copy set each, and what it ran under),
every measured row's share of them (measured, at the row's own clock, of the datasheet), and the rows above them.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness import analysis
from harness.analysis import roofline
from harness.analysis.datasheets import datasheet_of
from harness.report import figures as figs
from harness.report.page import esc
from harness.report.writer import Csv, Section, Table

#: The roofline table's columns and headers; the clock-scaled and datasheet shares only where some row has them.
_COLUMNS = [("case_id", "case"), ("backend", "backend"), ("tflops", "TFLOP/s"), ("pct_peak_flops", "% peak FLOP/s"),
            ("pct_peak_flops_at_clock", "% peak at its clock"), ("pct_datasheet_flops", "% datasheet FLOP/s"),
            ("gbps", "GB/s"), ("pct_peak_bw", "% peak BW"), ("pct_datasheet_bw", "% datasheet BW"),
            ("arithmetic_intensity", "FLOP/byte"), ("ridge_flop_per_byte", "ridge"), ("bound", "bound"), ("pct_roof", "% of roof"),
            ("impossible", "impossible"), ("impossible_ceiling", "above")]
_OPTIONAL = ("pct_peak_flops_at_clock", "pct_datasheet_flops", "pct_datasheet_bw")


def pct_cell(value: Any, row: Any) -> tuple[str, str]:
    """A percentage of a ceiling, marked impossible above 100 %."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if value > roofline.IMPOSSIBLE_PCT:
        return f"{value:.1f} % impossible", "impossible"
    return f"{value:.1f} %", ""


def ceilings_table(data: analysis.RunData) -> pd.DataFrame:
    """One row per ceiling of each run: what set it (the product, its source), best and median, whether contended, its clock; the datasheet beside."""
    rows = []
    for rid, peaks in data.peaks.items():
        if not peaks:
            rows.append({"run": rid, "what": "(not measured)"})
            continue
        for dtype, entry in (peaks.get("matmul") or {}).items():
            source = roofline.ceiling_dtype(peaks, dtype)
            rows.append({"run": rid, "what": f"matmul {dtype}", "set by": entry.get("product") or f"n={entry.get('n')}",
                         "from": entry.get("source"), "peak": entry.get("tflops"), "unit": "TFLOP/s", "median": entry.get("tflops_median"),
                         "contended": entry.get("contended"), "SM MHz": entry.get("sm_clock_mhz"),
                         "ceiling": roofline.peak_tflops(peaks, dtype),
                         "ceiling from": f"{source} (widened: faster than {dtype}'s own product here)" if source not in (None, dtype) else source})
        if peaks.get("copy"):
            c = peaks["copy"]
            rows.append({"run": rid, "what": "copy", "set by": f"{c.get('bytes', 0) / 2**20:.0f} MiB", "peak": c.get("gbps"), "unit": "GB/s",
                         "median": c.get("gbps_median"), "contended": c.get("contended"), "memory MHz": c.get("mem_clock_mhz")})
        for what, err in (peaks.get("errors") or {}).items():
            rows.append({"run": rid, "what": what, "peak": None, "unit": f"failed: {err}"})
    return pd.DataFrame(rows)


def sweep_table(data: analysis.RunData) -> pd.DataFrame:
    """Every product a CPU run's ceiling sweep timed (or skipped, and why), per dtype."""
    rows = [{"run": rid, "dtype": dtype, **r} for rid, peaks in data.peaks.items() for dtype, entry in ((peaks or {}).get("matmul") or {}).items()
            for r in entry.get("sweep") or []]
    return pd.DataFrame(rows)


def datasheet_rows(data: analysis.RunData) -> list[str]:
    """A sentence per device model with a published datasheet in the table (analysis.datasheets)."""
    out = []
    for model in sorted(set(data.frame.get("device_model", pd.Series(dtype=object)).dropna())):
        sheet = datasheet_of(str(model))
        if sheet is not None:
            rates = ", ".join(f"{d} {v:g}" for d, v in sheet.tflops.items())
            out.append(f"<p><b>{esc(model)}</b>, datasheet: {esc(rates)} TFLOP/s dense, {sheet.gbps:g} GB/s ({esc(sheet.source)}).</p>")
    return out


def roofline_section(data: analysis.RunData, ok: pd.DataFrame, colors: Any) -> Section:
    """The ceilings, the sweep behind a CPU's, and each measured row against them."""
    body = ["<p>Ceilings measured on this device at the start of the run: per dtype the fastest sample of the run's matrix products "
            "(on a GPU one 8192² product, with the SM clock it ran at; on a CPU the best of a sweep over square products and the suite's own "
            "projection and attention products, both operand layouts, since a product that fits the caches runs faster than one large size), "
            "and of a large copy counting bytes read plus written. A row's bound is compute when its arithmetic intensity is at or above "
            "the ridge point, memory otherwise; <em>% of roof</em> is against the lower of the two ceilings at that intensity. "
            "<em>% peak at its clock</em> scales the ceiling to the row's own median SM clock (peak × row clock ÷ peak clock). "
            "A row is <em>impossible</em> only when even the top of its 95 % interval is above the best ceiling the run measured; "
            "above a ceiling that was itself measured while the machine was contended it is marked as such instead.</p>"]
    ceilings = ceilings_table(data).dropna(axis=1, how="all")  # no clock columns on a CPU
    body += [Csv(ceilings, "peaks.csv"), Table(ceilings, scroll=False), *datasheet_rows(data)]
    sweep = sweep_table(data)
    if not sweep.empty:
        body += [f"<h3>The products behind the CPU ceiling ({len(sweep)})</h3>", Csv(sweep, "peaks_sweep.csv"), Table(sweep)]
    body.extend(figs.tflops_figures(data.frame, data.peaks, colors))
    if not ok.empty:
        columns = [c for c, _ in _COLUMNS if c in ok.columns and (c not in _OPTIONAL or ok[c].notna().any())]
        roof = ok[columns]
        body.append(Csv(roof, "roofline.csv"))
        flagged = roof[roof["impossible"].fillna(False).astype(bool)]
        if len(flagged):
            body.append(f'<div class="warn">{len(flagged)} rows are above the best ceiling this run measured, even at the top of their '
                        "95 % intervals: impossible, flagged in red below with the ceiling each beat.</div>")
        body.append(Table(roof, headers=[dict(_COLUMNS)[c] for c in columns],
                          formats={**{c: pct_cell for c in columns if c.startswith("pct_")},
                                   "impossible": lambda v, r: ("IMPOSSIBLE", "impossible") if v is True or v == 1 else ("", "")}))
    return Section("roofline", "Roofline: how close to what the hardware allows", body, nav="Roofline")
