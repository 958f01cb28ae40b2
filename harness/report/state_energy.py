"""The report's GPU state and energy section: which rows ran on a throttled GPU (distrust them, and why), and energy per call.

The rows carry what the executor read while they ran (harness.telemetry.gpu_state: clocks, power,
throttle reasons, the `throttled` verdict) and the energy phase's figures (harness.telemetry.energy).
This section shows them: the throttled rows with their reasons, energy per call against S per
backend, and per case the winner by energy beside the winner by time (analysis.winners, by metric).
A run without telemetry or an energy counter gets one sentence saying why, from the rows themselves.
"""

from __future__ import annotations

import pandas as pd

from harness import analysis
from harness.report import figures as figs
from harness.report.page import esc
from harness.report.telemetry import throttle_cell
from harness.report.writer import Csv, Section, Table

ENERGY = "energy_mj_per_call"
#: The columns of the GPU state table and CSV, and their headers.
STATE_COLUMNS = ["case_id", "backend", "throttle_reason", "gpu_sm_clock_mhz_min", "gpu_sm_clock_mhz_median", "gpu_sustained_sm_clock_mhz",
                 "gpu_mem_clock_mhz_median", "gpu_temperature_c_max", "gpu_power_w_mean", "gpu_throttle_reasons", "latency_ms_median"]
STATE_HEADERS = ["case", "backend", "why", "SM MHz (lowest)", "SM MHz (median)", "sustained SM MHz", "memory MHz", "max °C", "mean W",
                 "throttle reasons", "median (ms)"]
ENERGY_COLUMNS = ["case_id", "backend", ENERGY, "avg_power_w", "gflop_per_joule", "latency_ms_median", "energy_window_s", "energy_calls",
                  "energy_counter_updates", "energy_counter"]


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index, dtype=object)


def throttled_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows whose GPU was throttled while their samples ran, in STATE_COLUMNS."""
    ok = analysis.ok_rows(frame)
    return ok[_column(ok, "throttled").map(lambda v: v is True)].reindex(columns=STATE_COLUMNS)


def state_summary(frame: pd.DataFrame) -> str | None:
    """One sentence for the overview: how many measured rows ran throttled (None when none did)."""
    rows = throttled_rows(frame)
    if rows.empty:
        return None
    measured = int((frame["status"] == "ok").sum())
    return (f"{len(rows)} of {measured} measured rows ran on a throttled GPU (a power, thermal or hardware slowdown, or an SM clock below "
            "the sustained one): see GPU state and energy before trusting their medians.")


def _reasons(rows: pd.DataFrame, column: str) -> str:
    """The distinct reasons in `column`, most frequent first, joined."""
    reasons = _column(rows, column).dropna()
    return "; ".join(str(r) for r in reasons.value_counts().index) or "the rows do not say"


def _state_blocks(frame: pd.DataFrame, ok: pd.DataFrame) -> list:
    body: list = []
    read = ok[pd.to_numeric(_column(ok, "gpu_state_readings"), errors="coerce").fillna(0) > 0]
    if read.empty:
        body.append(f"<p>No GPU telemetry in this run: {esc(_reasons(ok, 'gpu_state_reason'))}.</p>")
        return body
    rows = throttled_rows(frame)
    clocks = pd.to_numeric(read["gpu_sm_clock_mhz_min"], errors="coerce")
    body.append(f"<p>{len(read)} measured rows were read while their samples ran; their lowest SM clock ranged "
                f"{esc(f'{clocks.min():.0f}')}–{esc(f'{clocks.max():.0f}')} MHz.</p>")
    if rows.empty:
        body.append(f'<p class="muted">No row ran throttled ({len(read)} checked): the GPU held its sustained clock with no slowdown reason.</p>')
        body.append(Csv(read.reindex(columns=STATE_COLUMNS + ["throttled"]), "gpu_state.csv"))
        return body
    which = "this row" if len(rows) == 1 else f"these {len(rows)} rows"
    body.append(f'<div class="warn">Distrust {which} of {len(read)}: the GPU was slowed while they were timed, so their latencies are '
                "the slowed GPU's, not the kernel's. Re-run them on a cool, idle GPU before comparing them.</div>")
    body.append(Csv(read.reindex(columns=STATE_COLUMNS + ["throttled"]), "gpu_state.csv"))
    body.append(Table(rows, headers=STATE_HEADERS, formats={"gpu_throttle_reasons": throttle_cell}))
    return body


def _energy_blocks(frame: pd.DataFrame, ok: pd.DataFrame, baseline: str, colors) -> list:
    body: list = []
    figures = pd.to_numeric(_column(ok, ENERGY), errors="coerce")
    measured = ok[figures.notna()]
    if measured.empty:
        body.append(f"<p>No energy per call in this run: {esc(_reasons(ok, 'energy_reason'))}.</p>")
        return body
    counters = ", ".join(sorted(set(measured["energy_counter"].dropna().astype(str))))
    body.append(f"<p>Energy per call from a short phase after the timed samples: calls back to back, read between two changes of the "
                f"energy counter ({esc(counters)}), so it is the whole board's (or CPU package's) energy, static power included. "
                "GFLOP per joule is the row's FLOPs over it.</p>")
    body.extend(figs.energy_figures(frame, colors))
    body.append(Csv(measured.reindex(columns=ENERGY_COLUMNS), "energy.csv"))
    by_time = analysis.winners(frame, baseline)
    by_energy = analysis.winners(frame, baseline, metric=ENERGY)
    if not by_energy.empty:
        both = by_time[["case", "winner", "winner_ms", "only_candidate"]].merge(
            by_energy[["case", "winner", f"winner_{ENERGY}", "runner_up", "margin_pct"]], on="case", suffixes=("_time", "_energy")).rename(columns={"case": "case_id"})
        both["same"] = both["winner_time"] == both["winner_energy"]
        # a case one backend alone ran is no win by time or by energy: said in the cell, never left to read as a choice
        both["winner_time"] = [f"only candidate: {w}" if alone else w for w, alone in zip(both["winner_time"], both.pop("only_candidate"))]
        body.append("<h3>The winner by energy beside the winner by time (rows that agree with the reference)</h3>")
        body.append(Csv(both, "energy_winners.csv"))
        body.append(Table(both, headers=["case", "fastest", "its ms", "most frugal", "its mJ per call", "runner-up by energy",
                                         "energy margin %", "same backend"],
                          formats={"same": lambda v, r: ("yes" if v else "no: choose by what you pay for", "")}))
    missing = ok[figures.isna()]
    if not missing.empty:
        grouped = missing.assign(reason=_column(missing, "energy_reason").fillna("")).groupby("reason").agg(
            rows=("case_id", "count"), example=("case_id", "first")).reset_index()
        body.append("<h3>Rows without an energy figure</h3>")
        body.append(Table(grouped, headers=["why", "rows", "example case"], scroll=False))
    return body


def state_energy_section(frame: pd.DataFrame, baseline: str, colors) -> Section:
    """Throttled rows and why to distrust them; energy per call against S; winners by energy beside winners by time."""
    ok = analysis.ok_rows(frame)
    body: list = ["<p>While each row's timed samples ran, the harness read the GPU's clocks, temperature, power and NVML's throttle reasons "
                  "(at their start, their end and every 20 ms). A row is <b>throttled</b> when, in at least a tenth of those "
                  "readings, a power, thermal or hardware slowdown reason was set or the SM clock was more than 3 % below the clock the "
                  "device is meant to sustain (its maximum, or the application clock set below it); a throttled row decides no winner "
                  "and no gate. GPU idle alone is not throttling.</p>"]
    if ok.empty:
        body.append('<p class="muted">No measured rows.</p>')
        return Section("state", "GPU state and energy", body, nav="State & energy")
    body.extend(_state_blocks(frame, ok))
    body.append("<h3>Energy per call</h3>")
    body.extend(_energy_blocks(frame, ok, baseline, colors))
    return Section("state", "GPU state and energy", body, nav="State & energy")
