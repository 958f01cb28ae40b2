"""The report's GPU telemetry: clocks, temperature, power and NVML's throttle reasons, before and after a run.

NVML reports throttle ("clocks event") reasons as a bit mask; only some bits mean the GPU ran slower
than it could (power caps, thermal and hardware slowdowns). GPU idle (0x1), the normal state before a
sweep, and clock settings chosen by an administrator are named but not judged.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from harness.results.vocabulary import SLOWDOWN_BITS, throttle_words
from harness.report.page import esc, fmt
from harness.report.writer import Table, render_table


def throttle_mask(value: Any) -> int | None:
    """The throttle-reason bit mask from an int or its hex text ("0x1"), or None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return None
    return None


def throttle_cell(value: Any, row: Any) -> tuple[str, str]:
    """A throttle-reason cell: the value with its bits named, marked bad only when a bit means lost performance."""
    mask = throttle_mask(value)
    if mask is None:
        return fmt(value), ""
    return f"{hex(mask)} ({throttle_words(mask)})", "bad" if mask & SLOWDOWN_BITS else ""


def _cell(value: Any, row: Any) -> tuple[str, str]:
    if str(row["field"]).startswith("throttle"):
        return throttle_cell(value, row)
    return fmt(value), ""


def telemetry_html(before: Any, after: Any) -> str:
    """GPU clocks, temperature, power and throttle reasons, before and after the run side by side."""
    if not before and not after:
        return "<p><b>Clocks and throttling</b>: not recorded (a CPU run has no GPU clocks to read).</p>"
    out = ["<p><b>Clocks and throttling, before and after the run</b> (throttle reasons marked only for a power, "
           "thermal or hardware slowdown: GPU idle is the normal state before a sweep)</p>"]
    for label, tele in (("before", before), ("after", after)):
        if isinstance(tele, dict):  # NVML could not be read: say why
            out.append(f"<p class=\"muted\">{esc(label)}: {esc(tele.get('unavailable', json.dumps(tele)))}</p>")
    gpus_before = {g.get("index"): g for g in before} if isinstance(before, list) else {}
    gpus_after = {g.get("index"): g for g in after} if isinstance(after, list) else {}
    rows = []
    for index in sorted(set(gpus_before) | set(gpus_after), key=str):
        b, a = gpus_before.get(index, {}), gpus_after.get(index, {})
        for key in dict.fromkeys([*b, *a]):
            # The integer and its hex text are one mask: shown once, with its bits named.
            if key == "index" or (key == "throttle_reasons" and "throttle_reasons_hex" in {*b, *a}):
                continue
            rows.append({"gpu": index, "field": key, "before": b.get(key), "after": a.get(key)})
    if rows:
        frame = pd.DataFrame(rows).astype({"before": object, "after": object})
        out.append(render_table(Table(frame, scroll=False, formats={"before": _cell, "after": _cell})))
    return "".join(out)
