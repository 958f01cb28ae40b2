"""Published figures (suites/published_figures.toml) and how far a measured row is from one, with the gap split.

A figure is a number its publisher measured at one exact configuration, on one GPU model, with a source. A row of the
same case on the same GPU model is compared by time: the figure's time (the source's, or worked out from its TFLOP/s
and the publisher's own FLOP count) over the row's median is the row's "% of published". The gap below 100 % is split,
in percentage points of the published figure, into

    clock   what the row's lower SM clock explains: the figure is taken as run at the GPU's maximum SM clock (a warm GPU
            that does not throttle runs there; no source here states its clock), so a row at median clock c of c_max
            is expected at most at c / c_max of it;
    flags   the rest of the gap, where the row carries a flag that says its time is not its kernels' alone
            (throttled, contended, launch-bound: launch-leaked samples); how much each cost is not measured;
    left    the rest, on an unflagged row: the build, the library version, the software around the kernel.

The three add up to the gap. A row faster than the figure has no gap to split. Memory-bound figures (GB/s) are not
scaled by the SM clock (a decode's bandwidth follows the memory clock, which no source here states).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.compat import tomllib
from harness.analysis.trust import is_set
from harness.errors import UserError
from harness.suite.batch_axes import ragged_cases
from harness.suite.cases import CASE_FIELDS, Case

#: The data file, beside the suite that runs its cases.
FIGURES_PATH = Path(__file__).resolve().parents[2] / "suites" / "published_figures.toml"
METRICS = ("tflops", "gbps")
#: The FLOP counts a figure without a time may name, as multiples of 4·B·H·S_q·S_kv·d_k (non-causal attention).
FLOP_COUNTS = {"4·B·H·S²·d": 1.0, "2.5·4·B·H·S²·d": 2.5}
_REQUIRED = ("id", "publisher", "published_backend", "source", "date", "gpu", "metric", "value", "case", "case_id", "ours", "note")
_OPTIONAL = ("time_ms", "flops", "read_from")
#: A ragged case's own keys in a figure's `case` table (harness.suite.batch_axes.ragged_cases), beside Case fields.
_BATCH_KEYS = ("batch", "layout", "page_size")


@dataclass(frozen=True)
class Figure:
    """One published figure: its case, the number, its unit, the time it stands for, and where it comes from."""

    id: str
    publisher: str
    published_backend: str
    source: str
    date: str
    gpu: str
    metric: str
    value: float
    case: Case
    ours: tuple[str, ...]
    note: str
    time_ms: float
    flops: str | None = None
    read_from: str | None = None

    @property
    def unit(self) -> str:
        """The figure's unit as a table writes it."""
        return "TFLOP/s" if self.metric == "tflops" else "GB/s"


def case_of(where: str, fields: Mapping[str, Any]) -> Case:
    """The Case a figure's `case` table names (S for S_q = S_kv; `batch`, `layout`, `page_size` for a ragged batch), on CUDA."""
    if not isinstance(fields, Mapping):
        raise UserError(f"{where}: field 'case' has value {fields!r}, expected a table of Case fields")
    unknown = sorted(set(fields) - {*CASE_FIELDS, "S", *_BATCH_KEYS} - {"device"})
    if unknown:
        raise UserError(f"{where}: unknown case field {unknown[0]!r}")
    values = dict(fields)
    if "batch" in values:
        batch, layout, page = values.pop("batch"), values.pop("layout", "paged"), values.pop("page_size", 16)
        (case,) = ragged_cases([batch], (layout,), page_sizes=(page,), device="cuda", **values)
        return case
    if "S" in values:
        values["S_q"] = values["S_kv"] = values.pop("S")
    values.setdefault("H_kv", values.get("H"))
    values.setdefault("d_v", values.get("d_k"))
    return Case(**{**values, "device": "cuda"})


def _time_ms(where: str, raw: Mapping[str, Any], case: Case) -> float:
    """The figure's time of one call: the source's, or the publisher's FLOP count ÷ the figure (non-causal only)."""
    if raw.get("time_ms") is not None:
        return float(raw["time_ms"])
    count = raw.get("flops")
    if count not in FLOP_COUNTS or raw["metric"] != "tflops":
        raise UserError(f"{where}: a figure without time_ms needs metric tflops and flops one of {', '.join(FLOP_COUNTS)}")
    if case.masked or case.ragged or case.d_k != case.d_v:
        raise UserError(f"{where}: flops {count!r} holds only for an unmasked dense case with d_k = d_v")
    flops = FLOP_COUNTS[count] * 4 * case.B * case.H * case.S_q * case.S_kv * case.d_k
    return flops / (float(raw["value"]) * 1e12) * 1e3


def figure_of(index: int, raw: Mapping[str, Any]) -> Figure:
    """One [[figure]] table, checked: every field there, a known metric, a positive figure, a case that builds; UserError names what."""
    where = f"{FIGURES_PATH.name} figure #{index + 1} ({raw.get('id', '?')})"
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise UserError(f"{where}: missing field {missing[0]!r}")
    unknown = sorted(set(raw) - {*_REQUIRED, *_OPTIONAL})
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}")
    if raw["metric"] not in METRICS:
        raise UserError(f"{where}: metric {raw['metric']!r}, expected one of {', '.join(METRICS)}")
    value = raw["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where}: value {value!r}, expected a positive number")
    for name in ("source", "gpu", "date", "publisher", "published_backend"):
        if not isinstance(raw[name], str) or not raw[name].strip():
            raise UserError(f"{where}: field {name!r} must be a non-empty string")
    if not isinstance(raw["ours"], list) or not raw["ours"] or not all(isinstance(b, str) for b in raw["ours"]):
        raise UserError(f"{where}: field 'ours' must name the backends that run the case")
    try:
        case = case_of(where, raw["case"])
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if case.id != raw["case_id"]:  # the id a reader searches the records for must be the case the fields build
        raise UserError(f"{where}: its case fields build {case.id}, not the case_id {raw['case_id']!r} it states")
    return Figure(id=raw["id"], publisher=raw["publisher"], published_backend=raw["published_backend"], source=raw["source"],
                  date=str(raw["date"]), gpu=raw["gpu"], metric=raw["metric"], value=float(value), case=case,
                  ours=tuple(raw["ours"]), note=raw["note"], time_ms=_time_ms(where, raw, case), flops=raw.get("flops"),
                  read_from=raw.get("read_from"))


def load_figures(path: Path = FIGURES_PATH) -> tuple[Figure, ...]:
    """Every published figure in the data file, checked (figure_of); UserError for a file that is not such a list."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: cannot read the published figures ({exc})") from None
    tables = data.get("figure")
    if not isinstance(tables, list) or not tables:
        raise UserError(f"{path}: no [[figure]] table")
    return tuple(figure_of(i, raw) for i, raw in enumerate(tables))


#: The flags that say a row's time is not its kernels' alone, as the split names them.
GAP_FLAGS = ("throttled", "contended", "launch-bound")


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def row_flags(row: Mapping[str, Any]) -> list[str]:
    """Which of GAP_FLAGS a row carries: NVML's throttle verdict, the contention verdict, launch-leaked samples."""
    flags = []
    if is_set(row.get("throttled")):
        flags.append("throttled")
    if is_set(row.get("contended")):
        flags.append("contended")
    if (_number(row.get("launch_leaked")) or 0) > 0:
        flags.append("launch-bound")
    return flags


@dataclass(frozen=True)
class Gap:
    """A row against a figure: % of published, and the gap below 100 % in points of the figure, split three ways."""

    pct_published: float
    gap_pp: float
    clock_pp: float | None
    flags_pp: float
    left_pp: float
    flags: tuple[str, ...]
    clock_ratio: float | None


def gap_of(figure: Figure, row_ms: float, row: Mapping[str, Any], max_sm_clock_mhz: float | None) -> Gap:
    """How far a row of `figure`'s case (median `row_ms`) is from it, and what explains the gap (see the module's docstring)."""
    pct = 100.0 * figure.time_ms / row_ms
    gap = max(0.0, 100.0 - pct)
    flags = tuple(row_flags(row))
    clock, reference = _number(row.get("gpu_sm_clock_mhz_median")), _number(max_sm_clock_mhz)
    ratio = min(1.0, clock / reference) if clock and reference and figure.metric == "tflops" else None
    clock_pp = None if ratio is None else min(gap, 100.0 * (1.0 - ratio))
    rest = gap - (clock_pp or 0.0)
    flags_pp = rest if flags else 0.0
    return Gap(pct, gap, clock_pp, flags_pp, rest - flags_pp, flags, ratio)

