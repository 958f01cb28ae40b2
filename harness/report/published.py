"""The report's "Published figures" section: each row of a published configuration beside its figure (harness.analysis.published).

Shown when the run holds a case some figure was published for. Per row on the figure's GPU model: % of published (by
time), % of the datasheet and % of the measured peak at the row's own clock (the roofline's columns), and the gap split
into clock, flags and the rest. A figure with no such row says why (the rows' reasons, or the GPU models they ran on).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from harness import analysis
from harness.analysis.published import Figure, gap_of, load_figures
from harness.report.page import esc
from harness.report.writer import Csv, Section, Table


def max_sm_clock(env: Mapping[str, Any] | None) -> float | None:
    """The GPU's maximum SM clock in MHz, as NVML reported it before the run (env.json's telemetry), or None."""
    telemetry = (env or {}).get("telemetry_before")
    first = telemetry[0] if isinstance(telemetry, list) and telemetry else telemetry
    value = first.get("max_sm_clock_mhz") if isinstance(first, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _pp(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def figure_rows(figure: Figure, frame: pd.DataFrame, envs: Mapping[str, Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """The compared rows of one figure (ok rows of its case on its GPU model), or why there are none."""
    mine = frame[frame["case_id"] == figure.case.id]
    models = mine["device_model"] if "device_model" in mine.columns else pd.Series([None] * len(mine), index=mine.index)
    ok = mine[(mine["status"] == "ok") & (models == figure.gpu)]
    if ok.empty:
        ran_on = sorted({str(m) for m in models[mine["status"] == "ok"].dropna()})
        if ran_on:
            return [], f"no row on the {figure.gpu}: this case was measured on {', '.join(ran_on)}, not the GPU the figure is for"
        reasons = [str(r) for r in mine.get("reason", pd.Series(dtype=object)).dropna()]
        return [], "no GPU row exists for this case" + (f" ({reasons[0]})" if reasons else "")
    rows = []
    for _, row in ok.iterrows():
        record = row.to_dict()
        gap = gap_of(figure, float(row["latency_ms_median"]), record, max_sm_clock(envs.get(row["run_id"])))
        datasheet = record.get("pct_datasheet_flops") if figure.metric == "tflops" else record.get("pct_datasheet_bw")
        rows.append({
            "figure": figure.id, "backend": row["backend"], "ms": row["latency_ms_median"], "published ms": figure.time_ms,
            "% of published": gap.pct_published, "% datasheet": datasheet,
            "% peak at its clock": record.get("pct_peak_flops_at_clock") if figure.metric == "tflops" else record.get("pct_peak_bw_at_clock"),
            "SM MHz": record.get("gpu_sm_clock_mhz_median"), "gap (points)": gap.gap_pp, "clock": gap.clock_pp,
            "flags": gap.flags_pp, "flags set": ", ".join(gap.flags), "left": gap.left_pp,
        })
    return rows, None


def _pct(value: Any, row: Any) -> tuple[str, str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    return f"{value:.1f} %", ""


def published_section(data: analysis.RunData) -> Section | None:
    """The section, when some case of the run is a published figure's configuration; None otherwise."""
    frame = data.frame
    ids = set(frame["case_id"]) if "case_id" in frame.columns else set()
    figures = [f for f in load_figures() if f.case.id in ids]
    if not figures:
        return None
    compared, missing = [], []
    for figure in figures:
        rows, why = figure_rows(figure, frame, data.env)
        compared += rows
        if why:
            missing.append((figure, why))
    body = ["<p>Each published figure this run holds the configuration of, with its source, and every row of that case on the "
            "figure's GPU model beside it. <em>% of published</em> is the figure's time over the row's median (the source's time, "
            "or the figure's TFLOP/s under the publisher's own FLOP count). The gap below 100 % is split, in points of the figure: "
            "<em>clock</em>, what the row's median SM clock below the GPU's maximum explains (the figure taken as run at the "
            "maximum); <em>flags</em>, the rest where the row is throttled, contended or launch-bound (its time is not its kernels' "
            "alone; how much each cost is not measured); <em>left</em>, the rest on an unflagged row. The three add up to the gap. "
            "<em>% datasheet</em> and <em>% peak at its clock</em> are the roofline's shares of the same row.</p>"]
    sources = pd.DataFrame([{"figure": f.id, "GPU": f.gpu, "case": f.case.id, "published": f"{f.value:g} {f.unit}",
                             "by": f.published_backend, "time ms": f.time_ms, "date": f.date, "source": f.source,
                             "note": f.note} for f in figures])
    body += [Csv(sources, "published_figures.csv"), Table(sources)]
    if compared:
        table = pd.DataFrame(compared)
        body += [Csv(table, "published_vs_measured.csv"),
                 Table(table, formats={"% of published": _pct, "% datasheet": _pct, "% peak at its clock": _pct,
                                       **{c: (lambda v, r: (_pp(None if v is None or (isinstance(v, float) and math.isnan(v)) else v), ""))
                                          for c in ("gap (points)", "clock", "flags", "left")}})]
    else:
        body.append('<div class="warn">No GPU row exists for any of these figures: nothing measured here can be set beside them '
                    "(run the suite on the GPU each figure names: <code>attnbench run --suite published</code>).</div>")
    if missing:
        body.append("<ul>" + "".join(f"<li><b>{esc(f.id)}</b>: {esc(why)}</li>" for f, why in missing) + "</ul>")
    return Section("published", "Published figures: reproduced, and the gap explained", body, nav="Published")
