"""The CPU ceilings a test session hands every run it starts: measured once per machine, not once per session.

Measuring them (fp32, bf16 and fp16 sweeps, harness.telemetry.peaks) costs about 11 s on the 2-core machine, while every
other xdist worker waits on the session's lock: a `pytest tests/test_one.py` of the inner loop paid it each time. So the
measurement is kept in pytest's cache folder and a later session takes it exactly when a run would (the same host, CPU
model, torch and thread count, every dtype measured without error: harness.telemetry.peaks_reuse); otherwise, or with
`-p no:cacheprovider`, the session measures anew and keeps that. A pytest that a test starts (pytest-benchmark's own
checks, run apart from xdist) inherits ATTNBENCH_PEAKS from the session around it and takes that file on the same terms,
instead of measuring again with no cache (10 CPU-s). Tests of the measurement itself call it directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

#: Where, in pytest's cache folder (`.pytest_cache/d/`), the last session's measurement is kept.
CACHE_NAME = "attnbench-peaks"


def kept_measurement(kept: Path, dtypes: Sequence[str]) -> str | None:
    """The text of the measurement kept at `kept` when a run on this machine would take it for `dtypes`, else None."""
    from harness.errors import UserError
    from harness.telemetry.peaks_reuse import reused_peaks

    if not kept.is_file():
        return None
    try:
        taken, _ = reused_peaks(kept, "cpu", dtypes, None)
    except UserError:
        return None  # damaged, or written by an older attnbench: measured anew
    return kept.read_text() if taken is not None else None


def session_peaks(cache_folder: Path | None, dtypes: Sequence[str], inherited: Path | None = None) -> str:
    """This machine's CPU ceilings for `dtypes` as peaks.json text: `inherited` (the file the session around this one
    hands its runs) or the one kept in `cache_folder`, the first a run would take; else a new measurement, kept there for
    the next session (`cache_folder` None: measured, kept nowhere)."""
    from harness.run.protocol import atomic_write
    from harness.telemetry.peaks import measure_peaks

    kept = cache_folder / "peaks.json" if cache_folder is not None else None
    for source in (inherited, kept):
        text = kept_measurement(source, dtypes) if source is not None else None
        if text is not None:
            return text
    text = json.dumps(measure_peaks("cpu", dtypes))
    if kept is not None:
        atomic_write(kept, text)  # a session started beside this one never reads half a file
    return text
