"""Which measured rows may decide an answer: a row timed while other work took the machine, whose samples spread
too widely, or that ran another kernel than its backend claims, is shown but never decides a winner, a recommendation,
a comparison's verdict or its gate.

Two flags are set while a row is timed: `contended` (harness.measure.contention: the process's threads waited for
a CPU, were preempted, or another process ran on the GPU, during the samples) and `suspect`
(harness.measure.stats: the IQR is at least a quarter of the median). The same (case, backend) measured 6.75 ms
quiet and 11 to 17 ms contended: a median taken while another process ran measures that process as much as the
backend. A third, `kernel_mismatch`, is set by the kernel proof (harness.execution.kernel_proof): the profiler did
not show the kernel the backend claims for the case (an FP8 row that ran a bf16 GEMM measured the bf16 path). A
fourth, `throttled`, is set from the GPU's readings during the samples (harness.telemetry.gpu_state): its clock was
below the sustained one, or a slowdown reason was set, in at least a tenth of them; its median is the slowed GPU's.
Every table that chooses says how many rows it left out and why (`LeftOut`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from harness.results.vocabulary import UNTRUSTED_FLAGS

__all__ = ["UNTRUSTED_FLAGS", "LeftOut", "flags_of", "is_set", "left_out", "trusted", "untrusted"]


def _flag(frame: pd.DataFrame, name: str) -> pd.Series:
    """Whether each row carries `name` as True (False where the column is missing: a run recorded before it)."""
    if name not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame[name].map(is_set).astype(bool)


def is_set(value: object) -> bool:
    """Whether a flag's value is True (a bool or numpy bool; None, NaN and text are not set)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def untrusted(frame: pd.DataFrame) -> pd.Series:
    """True for each row that carries an untrusted flag (`UNTRUSTED_FLAGS`)."""
    out = pd.Series(False, index=frame.index)
    for name in UNTRUSTED_FLAGS:
        out |= _flag(frame, name)
    return out


def flags_of(row: Mapping) -> list[str]:
    """The untrusted flags one row (a mapping or a pandas row) carries, in `UNTRUSTED_FLAGS`' order."""
    return [name for name in UNTRUSTED_FLAGS if is_set(row.get(name))]


@dataclass(frozen=True)
class LeftOut:
    """The measured rows an answer left out because of their flags: how many carried each flag, and which pairs."""

    counts: Mapping[str, int] = field(default_factory=dict)
    rows: int = 0
    #: (case, backend) of each row left out, in the frame's order.
    pairs: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return self.rows > 0

    def sentence(self, what: str = "this answer") -> str:
        """One line: how many rows `what` left out, by flag and why ('' when it left none out)."""
        if not self.rows:
            return ""
        reasons = "; ".join(f"{n} {name} ({UNTRUSTED_FLAGS[name]})" for name, n in self.counts.items() if n)
        noun = "row" if self.rows == 1 else "rows"
        advice = []
        if any(n for name, n in self.counts.items() if name not in ("kernel_mismatch", "throttled")):
            advice.append("Re-measure them on a quiet machine (each row's repro, or the run again) "
                          "before reading them as a backend's speed")
        if self.counts.get("throttled"):  # a quiet machine does not cool a GPU: waiting for it between pairs does
            advice.append("A throttled row ran on a slowed GPU: measure again with run --cooldown (or better cooling)")
        if self.counts.get("kernel_mismatch"):  # no quiet machine fixes a row that ran another kernel than it claims
            advice.append("A kernel_mismatch row ran another path than its backend claims: fix the path (or the claim) and run it again")
        return f"{self.rows} measured {noun} left out of {what}: {reasons}. " + ". ".join(advice)

    def to_dict(self) -> dict:
        """The JSON form (`--json` outputs)."""
        return {"rows": self.rows, "by_flag": dict(self.counts), "pairs": [list(p) for p in self.pairs]}


#: The flags `LeftOut.counts` (and `--json`'s by_flag) carry even at 0, as they always have; a later flag only where set.
_ALWAYS_COUNTED = ("contended", "suspect")


def left_out(frame: pd.DataFrame) -> LeftOut:
    """What leaving `frame`'s untrusted rows out leaves out (count each row once; `counts` per flag may overlap)."""
    mask = untrusted(frame)
    if not mask.any():
        return LeftOut()
    flagged = frame[mask]
    counts = {name: n for name in UNTRUSTED_FLAGS if (n := int(_flag(flagged, name).sum())) or name in _ALWAYS_COUNTED}
    case = flagged["case"] if "case" in flagged.columns else flagged["case_id"]
    return LeftOut(counts, int(mask.sum()), tuple(zip(case.astype(str), flagged["backend"].astype(str))))


def trusted(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of `frame` that carry no untrusted flag."""
    return frame[~untrusted(frame)]
