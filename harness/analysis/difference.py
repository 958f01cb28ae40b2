"""The one rule for "these two latencies differ", used by winners, recommend and compare, and the run-to-run variation it can widen by.

Each `ok` record carries a distribution-free 95 % interval of its median (`latency_ms_ci95_low/high`,
order statistics of its own samples). That interval says how well one process pinned its median; it says
nothing of how far a fresh process on the same box lands (address layout, thread placement, clocks).
`attnbench stability` measures that: the coefficient of variation (CV) of medians across fresh processes,
written as a variation document (`write_variation`). The rule:

    two latencies differ when their recorded intervals, each widened by ±2·CV (CV = 0 where no variation
    was measured for the device), do not overlap.

Why overlap rather than an interval of the ratio: the intervals are order statistics, asymmetric, of
samples that are often bimodal on a GPU; combining their half-widths in quadrature into a ratio's
interval would assume a normality the samples do not have. Overlap assumes nothing, and a reader can
check it by eye from the two rows. It is stricter than a test on the difference (two equal ±w intervals
must be 2w apart, where a 95 % test of the difference needs about √2·w): a difference it calls real is
one the data leave no doubt about, and a CI gate built on it does not cry wolf. A row without an interval
(fewer than 6 samples: too few for a 95 % interval of the median) is never called different from anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.errors import UserError

#: The interval's columns in a record.
LOW, HIGH = "latency_ms_ci95_low", "latency_ms_ci95_high"
#: Each interval is widened by this many CVs on each side: about 95 % of fresh processes' medians lie within ±2·CV.
CV_WIDTH = 2.0
#: What a variation document says it is (`kind`), so that a wrong JSON file is refused by name.
VARIATION_KIND = "attnbench run-to-run variation"


@dataclass(frozen=True)
class Variation:
    """The run-to-run variation `attnbench stability` measured on one device: the CV of medians across fresh processes."""

    cv: float
    device_type: str
    device_name: str
    case_id: str
    backend: str
    medians_ms: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `stability` writes."""
        return {"kind": VARIATION_KIND, "cv": self.cv, "device_type": self.device_type, "device_name": self.device_name,
                "case_id": self.case_id, "backend": self.backend, "processes": len(self.medians_ms), "medians_ms": list(self.medians_ms)}

    def describe(self) -> str:
        """One line for a report or a command's output."""
        return (f"run-to-run variation {100 * self.cv:.2f} % (CV of {len(self.medians_ms)} fresh processes' medians, "
                f"{self.case_id} on {self.backend}, {self.device_name}): intervals widened by ±{CV_WIDTH * 100 * self.cv:.2f} %")


def read_variation(path: Path | str) -> Variation:
    """A variation document written by `attnbench stability --out`; UserError naming the file and what is wrong."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"--variation {path}: no such file (write one with `attnbench stability … --out {path}`)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--variation {path}: not a readable JSON document ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != VARIATION_KIND:
        raise UserError(f"--variation {path}: not a variation document written by `attnbench stability` (its kind is not {VARIATION_KIND!r})")
    cv, medians = doc.get("cv"), doc.get("medians_ms")
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not math.isfinite(cv) or cv < 0:
        raise UserError(f"--variation {path}: field 'cv' has value {cv!r}, expected a non-negative finite number")
    if not isinstance(medians, list) or not all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in medians):
        raise UserError(f"--variation {path}: field 'medians_ms' has value {medians!r}, expected a list of numbers")
    for name in ("device_type", "device_name", "case_id", "backend"):
        if not isinstance(doc.get(name), str):
            raise UserError(f"--variation {path}: field {name!r} has value {doc.get(name)!r}, expected text")
    return Variation(float(cv), doc["device_type"], doc["device_name"], doc["case_id"], doc["backend"], tuple(float(m) for m in medians))


def check_variation_device(variation: Variation | None, envs: Sequence[Mapping[str, Any]], where: str) -> None:
    """Refuse (UserError) a variation measured on another device than the runs': another box's noise says nothing of this one's."""
    if variation is None:
        return
    for env in envs:
        before = env.get("before") or {}
        seen = (before.get("device_type"), before.get("device_name"))
        if seen != (variation.device_type, variation.device_name) and seen != (None, None):
            raise UserError(f"--variation was measured on {variation.device_type} {variation.device_name!r} but {where} ran on "
                            f"{seen[0]} {seen[1]!r}: measure the variation on the same device")


def widened(low: Any, high: Any, cv: float = 0.0) -> tuple[float, float] | None:
    """The interval [low, high] widened by ±CV_WIDTH·cv, or None when the row has no interval."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        return None
    return lo * (1.0 - CV_WIDTH * cv), hi * (1.0 + CV_WIDTH * cv)


def interval_of(row: Mapping[str, Any], cv: float = 0.0) -> tuple[float, float] | None:
    """A record's (or a frame row's) interval of the median, widened by the variation."""
    return widened(row.get(LOW), row.get(HIGH), cv)


def order(a: Mapping[str, Any], b: Mapping[str, Any], cv: float = 0.0) -> int:
    """-1 when `a` is faster than `b` by the rule, +1 when slower, 0 when they do not differ (or either has no interval)."""
    ia, ib = interval_of(a, cv), interval_of(b, cv)
    if ia is None or ib is None:
        return 0
    if ia[1] < ib[0]:
        return -1
    if ia[0] > ib[1]:
        return 1
    return 0


def differ(a: Mapping[str, Any], b: Mapping[str, Any], cv: float = 0.0) -> bool:
    """Whether the rule tells the two rows' latencies apart."""
    return order(a, b, cv) != 0


#: The rule in one sentence, for the commands' output and the report.
RULE_TEXT = ("two latencies differ when their 95 % intervals of the median (latency_ms_ci95_low/high), each widened by ±2·CV of the "
             "box's run-to-run variation where `attnbench stability` measured it, do not overlap")
