"""The report's Profiling section: where each backend's time goes, from the profiled pass of `run --profile`.

Per case, each backend's kernel (CUDA) or operator (CPU) time per step is stacked by category beside
its measured median; the difference is launch overhead and gaps. A sentence per row says where the
time goes in words.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.results.vocabulary import CATEGORIES, column_name
from harness.report.figures import MAX_PANELS, Figure, chunks, panels, plain, to_data_uri
from harness.report.page import esc
from harness.report.writer import Csv, Section, Table

#: Colours of the categories in the stacked bars (fixed, so every figure reads the same).
CATEGORY_COLORS = dict(zip(CATEGORIES, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#7f7f7f")))
#: A category is named in the words when it takes at least this share of the profiled time.
NAMED_SHARE = 0.15


def profiled_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows that carry a profiled pass."""
    if "profile_kernel_ms_per_step" not in frame.columns:
        return frame.iloc[0:0]
    times = pd.to_numeric(frame["profile_kernel_ms_per_step"], errors="coerce")
    return frame[(frame["status"] == "ok") & times.notna()]


def where_time_goes(row: pd.Series) -> str:
    """One sentence: the categories that take most of the profiled time, and the copy of a GQA row that expands K/V."""
    total = float(row["profile_kernel_ms_per_step"] or 0.0)
    if not total > 0:
        return "no kernel time recorded"
    shares = sorted(((float(row[column_name(c)] or 0.0) / total, c) for c in CATEGORIES), reverse=True)
    named = [f"{c} {s:.0%}" for s, c in shares if s >= NAMED_SHARE] or [f"{shares[0][1]} {shares[0][0]:.0%}"]
    text = ", ".join(named)
    copy_share = float(row[column_name("copy/expand")] or 0.0) / total
    if bool(row.get("kv_expanded")) and copy_share >= 0.05:
        text += f"; the K/V copy to H heads (kv_expanded) costs {copy_share:.0%}"
    gap = row.get("profile_gap_share")
    if gap is not None and gap == gap:
        text += f"; launch overhead and gaps {gap:.0%} of the median" if gap >= 0 else "; profiled steps ran slower than the median"
    return text


def _figures(rows: pd.DataFrame) -> list[Figure]:
    """A panel per case: one stacked bar per backend (time per category), a black tick at its measured median."""
    cases = list(dict.fromkeys(rows["case_id"]))
    figures = []
    for part, chunk in chunks(cases, MAX_PANELS):
        fig, axes = panels(len(chunk))
        for ax, case_id in zip(axes, chunk):
            sub = rows[rows["case_id"] == case_id]
            x = np.arange(len(sub))
            bottom = np.zeros(len(sub))
            for c in CATEGORIES:
                values = pd.to_numeric(sub[column_name(c)], errors="coerce").fillna(0.0).to_numpy(dtype=float)
                ax.bar(x, values, bottom=bottom, color=CATEGORY_COLORS[c], label=c, width=0.6)
                bottom += values
            ax.scatter(x, sub["latency_ms_median"].astype(float), marker="_", s=600, color="black", zorder=5, label="measured median")
            ax.set_xticks(x)
            ax.set_xticklabels([plain(b) for b in sub["backend"]], rotation=30, ha="right", fontsize=7)
            ax.set_ylabel("ms per step", fontsize=8)
            ax.set_title(plain(case_id), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, axis="y", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=7, bbox_to_anchor=(0.5, 1.0))
        fig.tight_layout(rect=(0, 0, 1, 0.93))  # rotated backend names vary in length: measured, on the few profiled cases
        suffix = f" ({part + 1}/{math.ceil(len(cases) / MAX_PANELS)})" if len(cases) > MAX_PANELS else ""
        figures.append(Figure(f"Where the time goes{suffix}", to_data_uri(fig),
                              "Bars: profiled kernel (CUDA) or operator (CPU) time per step by category; black tick: the harness's median. "
                              "The median above the bar is launch overhead and gaps; a bar above the tick ran slower under the profiler."))
    return figures


def failed_profiles(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows whose profiled pass failed (their latency stands; `notes.profile_failed` says why)."""
    if "notes" not in frame.columns:
        return frame.iloc[0:0]
    why = frame["notes"].map(lambda n: n.get("profile_failed") if isinstance(n, dict) else None)
    return frame[why.notna()].assign(profile_failed=why[why.notna()])


def profiling_section(frame: pd.DataFrame) -> Section:
    """The Profiling section, or a line saying how to get one."""
    rows = profiled_rows(frame)
    failed = failed_profiles(frame)
    failed_table = Table(failed[["case_id", "backend", "profile_failed"]], headers=["case", "backend", "why the profiled pass failed"])
    body: list = ["<p>One pass per pair under torch.profiler after its timed samples (never inside one): the kernels (CUDA) or "
                  "operators (CPU, each operator's self time, so nothing is counted twice) a step runs, summed by category "
                  "(matmul, softmax, elementwise, copy/expand, fused attention, other) and set against the measured median.</p>"]
    if rows.empty:
        body.append(f'<p class="muted">No profiled rows in {esc("these runs")}: run <code>attnbench run --profile</code> '
                    "(add <code>--traces</code> for a Chrome trace per pair), or <code>attnbench profile CASE --backend NAME</code> for one pair.</p>")
        if not failed.empty:
            body += [f"<p>The profiled pass failed on {len(failed)} row(s); their latencies stand:</p>", failed_table]
        return Section("profiling", "Profiling: where the time goes", body, nav="Profiling")
    rows = rows.assign(where=rows.apply(where_time_goes, axis=1))
    columns = ["case_id", "backend", "latency_ms_median", "profile_kernel_ms_per_step", "profile_kernels_per_step", "profile_gap_share",
               "profile_top_kernel", "where"]
    body.append(Csv(rows[columns + [column_name(c) for c in CATEGORIES]], "profiling.csv"))
    body.extend(_figures(rows))
    body.append(Table(rows[columns], headers=["case", "backend", "median ms", "kernel ms/step", "kernels/step", "launch/gap share",
                                               "top kernel", "where the time goes"]))
    if not failed.empty:
        body += [f"<p>The profiled pass failed on {len(failed)} row(s); their latencies stand:</p>", failed_table]
    return Section("profiling", "Profiling: where the time goes", body, nav="Profiling")
