"""The report's Sample flags section: the measured rows whose samples the harness itself distrusts, and why.

Two flags are set while a row is timed (harness.measure.timing): `too_short`, a sample so short that
the clock's tick is more than 1 % of it, and `launch_leaked`, CUDA samples that may hold the host's
launch time. A flag nobody sees is no flag: each flagged row is listed here with what the flag means.
"""

from __future__ import annotations

import pandas as pd

from harness.measure.timing import MIN_SAMPLE_TICKS
from harness.report.writer import Csv, Section, Table

#: Each flag, in words, as the section states it.
FLAG_WORDS = {
    "too_short": f"the shortest sample lasts under {MIN_SAMPLE_TICKS} ticks of the clock (the tick column, as far as it is known): "
                 "quantisation alone may move a sample by more than 1 %, so the row's latency is known less precisely than its "
                 "interval says. Time more calls per sample (a larger case, or a CPU budget with a longer min_sample_s).",
    "launch_leaked": "the number of CUDA samples whose interval may hold host launch time: the host took longer to reach the timed "
                     "call than the GPU spin queued before it lasted, so the GPU may have waited for the launch and that wait is in "
                     "the sample. A row with many such samples reads slower than its kernels ran.",
}
#: The columns of the flagged rows' table and CSV.
FLAG_COLUMNS = ["case_id", "backend", "too_short", "launch_leaked", "latency_ms_min", "latency_ms_median", "samples", "clock_resolution_s"]


def flagged_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with `too_short` set or at least one launch-leaked sample, in FLAG_COLUMNS (empty without either column)."""
    ok = frame[frame["status"] == "ok"]
    none = pd.Series(False, index=ok.index)
    short = ok["too_short"].map(lambda v: v is True) if "too_short" in ok.columns else none
    leaked = pd.to_numeric(ok["launch_leaked"], errors="coerce").fillna(0) > 0 if "launch_leaked" in ok.columns else none
    rows = ok[short | leaked]
    return rows.reindex(columns=FLAG_COLUMNS)


def flag_summary(frame: pd.DataFrame) -> str | None:
    """One sentence for the overview: how many measured rows carry which flag (None when none does)."""
    rows = flagged_rows(frame)
    if rows.empty:
        return None
    measured = int((frame["status"] == "ok").sum())
    short = int(rows["too_short"].map(lambda v: v is True).sum())
    leaked = int((pd.to_numeric(rows["launch_leaked"], errors="coerce").fillna(0) > 0).sum())
    return (f"{len(rows)} of {measured} measured rows carry a sample flag ({short} too short for the clock's tick, "
            f"{leaked} with launch-leaked samples): see Sample flags before trusting their medians.")


def flags_section(frame: pd.DataFrame) -> Section:
    """Which rows are flagged too_short or launch_leaked, with what each flag means."""
    body = [f"<p><b>too_short</b>: {FLAG_WORDS['too_short']}</p>", f"<p><b>launch_leaked</b>: {FLAG_WORDS['launch_leaked']}</p>"]
    rows = flagged_rows(frame)
    measured = int((frame["status"] == "ok").sum())
    if rows.empty:
        body.append(f'<p class="muted">No measured row carries either flag ({measured} checked).</p>')
    else:
        body.append(f"<p>{len(rows)} of {measured} measured rows carry a flag:</p>")
        body.append(Csv(rows, "sample_flags.csv"))
        headers = ["case", "backend", "too short", "launch-leaked samples", "min (ms)", "median (ms)", "samples", "tick (s)"]
        body.append(Table(rows, headers=headers))
    return Section("flags", "Sample flags", body, nav="Flags")
