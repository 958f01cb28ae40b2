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

import math
import os
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.errors import UserError
from harness.results.documents import MAX_VARIATION_PROCESSES
from harness.files import parse_json, read_regular

#: The interval's columns in a record.
LOW, HIGH = "latency_ms_ci95_low", "latency_ms_ci95_high"
#: Each interval is widened by this many CVs on each side: about 95 % of fresh processes' medians lie within ±2·CV.
CV_WIDTH = 2.0
#: At this CV the widened low end lo·(1 − CV_WIDTH·CV) reaches 0 ms.
MAX_CV = 1.0 / CV_WIDTH
#: What a variation document says it is (`kind`), so that a wrong JSON file is refused by name.
VARIATION_KIND = "attnbench run-to-run variation"
#: A variation document is a few kilobytes (1,000 medians at most); more is not one.
MAX_VARIATION_BYTES = 2**20


@dataclass(frozen=True)
class ProcessEvidence:
    """One fresh process's median and whether other work shared the machine while it was timed (its record's columns)."""

    median_ms: float
    #: Another process took the CPU (or was on the GPU) during its samples; None: nothing could tell.
    contended: bool | None = None
    #: IQR/median ≥ 25 %: the median is not to be trusted.
    suspect: bool | None = None
    run_queue_wait_ratio: float | None = None
    involuntary_switches: int | None = None
    cpu_wall_ratio: float | None = None
    iqr_ratio: float | None = None
    threads: int | None = None
    gpu_other_processes: int | None = None

    @property
    def untrusted(self) -> bool:
        """Contended or suspect: its median measured other work as well as the case."""
        return self.contended is True or self.suspect is True

    def describe(self) -> str:
        """What the process's counters say, e.g. 'contended: 0.42 thread-s waiting per s, 310 preemptions'."""
        verdict = {True: "contended", False: "quiet", None: "contention not measured"}[self.contended]
        parts = []
        if self.run_queue_wait_ratio is not None:
            parts.append(f"{self.run_queue_wait_ratio:.2f} thread-s waiting per s")
        if self.involuntary_switches is not None:
            parts.append(f"{self.involuntary_switches} preemptions")
        if self.gpu_other_processes:
            parts.append(f"{self.gpu_other_processes} other process{'es' if self.gpu_other_processes > 1 else ''} on the GPU")
        text = f"{verdict}: {', '.join(parts)}" if parts else verdict
        if self.suspect:
            text += f"; suspect: IQR {100 * (self.iqr_ratio or 0):.0f} % of the median"
        return text


def _evidence_field(path: Path, where: str, name: str, value: Any) -> Any:
    """One per-process field as the document holds it, checked against what `stability` writes."""
    if value is None and name != "median_ms":
        return None
    if name == "median_ms" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _bad(path, where, value, "a positive finite number of milliseconds")
    if name in ("contended", "suspect"):
        if not isinstance(value, bool):
            raise _bad(path, where, value, "true, false or null")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _bad(path, where, value, "a non-negative finite number or null")
    if name in ("involuntary_switches", "threads", "gpu_other_processes"):
        if value != int(value) or (name == "threads" and value < 1):
            raise _bad(path, where, value, "a whole number" + (" from 1" if name == "threads" else "") + " or null")
        return int(value)
    return float(value)


def _evidence(doc: Mapping[str, Any], path: Path, medians: Sequence[float]) -> tuple[ProcessEvidence, ...] | None:
    """The per-process evidence (None in a document written before it was kept): one entry per median, none contended."""
    entries = doc.get("per_process")
    if entries is None:
        return None
    if not isinstance(entries, list) or len(entries) != len(medians) or not all(isinstance(e, dict) for e in entries):
        raise _bad(path, "per_process", entries, f"a list of {len(medians)} objects, one per median in 'medians_ms'")
    out, names = [], [f.name for f in fields(ProcessEvidence)]
    for i, entry in enumerate(entries):
        values = {name: _evidence_field(path, f"per_process[{i}].{name}", name, entry.get(name)) for name in names}
        if not math.isclose(values["median_ms"], medians[i], rel_tol=1e-9):
            raise _bad(path, f"per_process[{i}].median_ms", entry.get("median_ms"), f"{medians[i]!r}, its process's median in 'medians_ms'")
        evidence = ProcessEvidence(**values)
        if evidence.untrusted:
            # `stability` writes no variation from a contended process: a file that holds one was not written by it.
            raise _bad(path, f"per_process[{i}].contended", entry.get("contended"), "false or null (a contended or suspect process "
                       "measured other work: `stability` writes no variation from one)")
        out.append(evidence)
    return tuple(out)


def _threads(doc: Mapping[str, Any], path: Path) -> int | None:
    return _evidence_field(path, "threads", "threads", doc.get("threads"))


@dataclass(frozen=True)
class Variation:
    """The run-to-run variation `attnbench stability` measured on one device: the CV of medians across fresh processes."""

    cv: float
    device_type: str
    device_name: str
    case_id: str
    backend: str
    medians_ms: tuple[float, ...]
    #: The file it was read from, for messages (not written).
    source: str | None = None
    #: torch's intra-op threads each process was timed with, and each process's contention evidence
    #: (None: not known, as in a document written before they were kept).
    threads: int | None = None
    per_process: tuple[ProcessEvidence, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `stability` writes."""
        doc = {"kind": VARIATION_KIND, "cv": self.cv, "device_type": self.device_type, "device_name": self.device_name,
               "case_id": self.case_id, "backend": self.backend, "processes": len(self.medians_ms), "medians_ms": list(self.medians_ms),
               "threads": self.threads}
        if self.per_process is not None:
            doc["per_process"] = [asdict(e) for e in self.per_process]
        return doc

    def describe(self) -> str:
        """One line for a report or a command's output."""
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads is not None else ""
        return (f"run-to-run variation {100 * self.cv:.2f} % (CV of {len(self.medians_ms)} fresh processes' medians, "
                f"{self.case_id} on {self.backend}{threads}, {self.device_name}): intervals widened by ±{CV_WIDTH * 100 * self.cv:.2f} %")


def read_variation(path: Path | str) -> Variation:
    """A variation document written by `attnbench stability --out`; UserError naming the file and what is wrong."""
    path = Path(path)
    try:
        # The one document reader: a FIFO or /dev/zero is refused, not waited on or read forever; deep nesting is one line.
        doc = parse_json(read_regular(path, "variation document", MAX_VARIATION_BYTES), path)
    except UserError as exc:
        if not os.path.lexists(path):
            raise UserError(f"--variation {path}: no such file (write one with `attnbench stability … --out {path}`)") from None
        raise UserError(f"--variation {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != VARIATION_KIND:
        raise UserError(f"--variation {path}: not a variation document written by `attnbench stability` (its kind is not {VARIATION_KIND!r})")
    medians = _medians(doc, path)
    return Variation(_cv(doc, path), *(_text(doc, path, name) for name in ("device_type", "device_name", "case_id", "backend")),
                     medians, source=str(path), threads=_threads(doc, path), per_process=_evidence(doc, path, medians))


def _bad(path: Path, name: str, value: Any, expected: str) -> UserError:
    shown = repr(value)
    return UserError(f"--variation {path}: field {name!r} has value {shown if len(shown) <= 60 else shown[:57] + '...'}, expected {expected}")


def _cv(doc: Mapping[str, Any], path: Path) -> float:
    cv = doc.get("cv")
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not math.isfinite(cv) or cv < 0:
        raise _bad(path, "cv", cv, "a non-negative finite number")
    if cv >= MAX_CV:
        # lo·(1 − 2·CV) ≤ 0: every widened interval reaches 0 ms, so the rule could never tell two rows apart.
        raise _bad(path, "cv", cv, f"below {MAX_CV} (a CV that large widens every interval down to 0 ms: nothing could differ)")
    return float(cv)


def _text(doc: Mapping[str, Any], path: Path, name: str) -> str:
    value = doc.get(name)
    if name == "device_type" and value not in ("cpu", "cuda"):
        raise _bad(path, name, value, "'cpu' or 'cuda'")
    if not isinstance(value, str) or not value.strip():
        raise _bad(path, name, value, "non-empty text")
    return value


def _medians(doc: Mapping[str, Any], path: Path) -> tuple[float, ...]:
    """The medians, checked against the document's own `cv` and `processes`: a document that contradicts itself is refused."""
    medians = doc.get("medians_ms")
    if not isinstance(medians, list) or not 2 <= len(medians) <= MAX_VARIATION_PROCESSES:
        raise _bad(path, "medians_ms", medians, f"a list of 2 to {MAX_VARIATION_PROCESSES:,} medians (one per fresh process)")
    for i, m in enumerate(medians):
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
            raise _bad(path, f"medians_ms[{i}]", m, "a positive finite number of milliseconds")
    processes = doc.get("processes", len(medians))
    if isinstance(processes, bool) or processes != len(medians):
        raise _bad(path, "processes", processes, f"{len(medians)}, the number of medians in 'medians_ms'")
    values = tuple(float(m) for m in medians)
    try:
        measured = statistics.stdev(values) / statistics.fmean(values)
    except (OverflowError, ValueError):  # medians near the float limit: their spread is not a number
        raise _bad(path, "medians_ms", medians, "medians whose spread is a finite number") from None
    # The CV is recomputed from the medians it was written from (stability's own formula, in ms rather than s: rounding only).
    if not math.isclose(measured, float(doc["cv"]), rel_tol=1e-6, abs_tol=1e-12):
        raise _bad(path, "cv", doc["cv"], f"{measured:.6g}, the CV of its own 'medians_ms'")
    return values


def check_variation_device(variation: Variation | None, envs: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
                           where: str) -> None:
    """Refuse (UserError) a variation measured on another device than the runs', or runs whose env.json cannot say which device.

    `envs` are the runs' env.json documents, or a mapping from each run's name to its document (then the run is named).
    """
    if variation is None:
        return
    named = envs.items() if isinstance(envs, Mapping) else ((None, env) for env in envs)
    source = f" ({variation.source})" if variation.source else ""
    for run, env in named:
        before = env.get("before") or {}
        in_file = f"{run}/env.json" if run else (f"{where}/env.json" if os.path.isdir(where) else f"env.json of {where}")
        for name in ("device_type", "device_name"):
            # A fingerprint without the device cannot show the variation is this box's: refused, not taken on trust.
            if not isinstance(before.get(name), str) or not before[name]:
                raise UserError(f"--variation{source} cannot be checked against {in_file}: its field 'before.{name}' is "
                                f"{before.get(name)!r}, and the variation must have been measured on the runs' device")
        seen = (before["device_type"], before["device_name"])
        if seen != (variation.device_type, variation.device_name):
            raise UserError(f"--variation{source} was measured on {variation.device_type} {variation.device_name!r} but {where} ran on "
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


def smallest_difference(cv: float) -> float:
    """The smallest relative difference the rule can call real between two medians known to a point, under variation `cv`:
    below it their intervals, widened by ±CV_WIDTH·cv, overlap whatever the samples say (each row's own interval adds to it)."""
    if not 0 <= cv < MAX_CV:
        return math.inf
    return (1.0 + CV_WIDTH * cv) / (1.0 - CV_WIDTH * cv) - 1.0


def differ(a: Mapping[str, Any], b: Mapping[str, Any], cv: float = 0.0) -> bool:
    """Whether the rule tells the two rows' latencies apart."""
    return order(a, b, cv) != 0


#: The rule in one sentence, for the commands' output and the report.
RULE_TEXT = ("two latencies differ when their 95 % intervals of the median (latency_ms_ci95_low/high), each widened by ±2·CV of the "
             "box's run-to-run variation where `attnbench stability` measured it, do not overlap")
