"""`attnbench compare BASE NEW`: per (case, backend), the ratio of medians and whether it exceeds both runs' noise.

A difference counts as real only when the two runs' p20–p80 ranges do not overlap (NEW's p20
above BASE's p80 for a slowdown, NEW's p80 below BASE's p20 for a speed-up): a change smaller
than the spread of repeating the same thing is noise. `--fail-above 5%` makes the command exit 1
when any row slowed down by more than 5 % beyond the noise, or when a row that ran in BASE no
longer runs in NEW, so that CI can gate on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TextIO

import pandas as pd

from harness.errors import UserError

#: Environment fields whose difference makes two runs measure different things (compare refuses without --force).
DEVICE_KEYS = ("device_type", "device_name")
#: Fields whose difference is worth a warning (a version upgrade is often the point of comparing).
VERSION_KEYS = ("torch", "torch_cuda", "cudnn", "python", "xformers", "flash_attn", "cpu_model", "torch_threads", "host")
EXIT_REGRESSION = 1


def parse_threshold(text: str) -> float:
    """`5%` or `5` → 0.05; refuses negatives and nonsense."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number) / 100.0
    except ValueError:
        raise UserError(f"--fail-above takes a percentage like 5%: got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"--fail-above must be a non-negative percentage: got {text!r}")
    return value


def environment_differences(base: Mapping[str, Any], new: Mapping[str, Any], keys: tuple[str, ...] = DEVICE_KEYS + VERSION_KEYS) -> list[str]:
    """`field: BASE value → NEW value` for each key environment field that differs between two env.json documents."""
    b, n = base.get("before") or {}, new.get("before") or {}
    return [f"{k}: {b.get(k)} → {n.get(k)}" for k in keys if b.get(k) != n.get(k)]


#: The numbers compare reads from each `ok` row.
LATENCY_COLUMNS = ("latency_ms_median", "latency_ms_p20", "latency_ms_p80")


def _check_latencies(frame: pd.DataFrame, where: Path) -> pd.DataFrame:
    """Every `ok` row's latency columns as floats; UserError naming the file, the row and the column of one that is missing.

    Their types were checked when the records were read (`Record.from_dict`); what is left is an `ok`
    row without a number, which a reader of types alone lets through.
    """
    for column in LATENCY_COLUMNS:
        values = pd.to_numeric(frame[column], errors="coerce")
        holes = (frame["status"] == "ok") & ~values.map(lambda v: v == v and math.isfinite(v))
        if holes.any():
            position = int(holes.to_numpy().nonzero()[0][0])
            row = frame.iloc[position]
            raise UserError(f"{where}: record {position + 1} ({row['case_id']}, {row['backend']}): column {column!r} has value null, "
                            "expected a finite number of milliseconds")
        frame = frame.assign(**{column: values.astype("float64")})
    return frame


def _read_env(env_path: Path) -> dict[str, Any]:
    """A run's env.json, or {} when it has none; UserError naming the file and the field when it is mistyped."""
    from harness.results.documents import Environment, read_optional

    env = read_optional(env_path, Environment)
    return env.to_dict() if env else {}


def _load(run_dir: Path) -> tuple[pd.DataFrame, dict[str, Any], list[str]]:
    """A run's rows (latencies as floats), its environment, and warnings worth printing (a dropped truncated line)."""
    from harness.results.store import RECORDS, ReadResult, load_run

    if not Path(run_dir).is_dir():
        raise UserError(f"{run_dir} is not a run folder")
    frame = load_run(run_dir)
    records = Path(run_dir) / RECORDS
    if frame.empty:
        raise UserError(f"{records} has no records: nothing to compare (is the run still starting, or did it stop before its first pair?)")
    frame = _check_latencies(frame, records)
    warnings = [ReadResult([], True, Path(path)).dropped_message for path in frame.attrs.get("dropped_partial_lines", [])]
    return frame, _read_env(Path(run_dir) / "env.json"), warnings


@dataclass
class Comparison:
    """The per-row table and what the gate decided."""

    table: pd.DataFrame
    env_differences: list[str]
    threshold: float | None
    failures: pd.DataFrame
    #: Things the user should know about the inputs (a truncated last line dropped from a records file).
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """True when a threshold was given and some row regressed past it (or stopped running)."""
        return self.threshold is not None and not self.failures.empty


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, threshold: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Join two runs' rows on (case, backend): ratio of medians, verdict against noise, and the rows that fail the gate."""
    cols = ["case_id", "backend", "status", "latency_ms_median", "latency_ms_p20", "latency_ms_p80"]
    b = base.reindex(columns=cols).drop_duplicates(["case_id", "backend"], keep="last")
    n = new.reindex(columns=cols).drop_duplicates(["case_id", "backend"], keep="last")
    joined = b.merge(n, on=["case_id", "backend"], how="outer", suffixes=("_base", "_new"), indicator=True)
    rows = []
    for _, r in joined.iterrows():
        row = {"case_id": r["case_id"], "backend": r["backend"], "status_base": r.get("status_base"), "status_new": r.get("status_new"),
               "base_ms": r.get("latency_ms_median_base"), "new_ms": r.get("latency_ms_median_new"),
               "ratio": None, "change_pct": None, "beyond_noise": None, "verdict": "", "gate": False}
        if r["_merge"] == "left_only":
            row["verdict"] = "missing in NEW"
            row["gate"] = r["status_base"] == "ok"
        elif r["_merge"] == "right_only":
            row["verdict"] = "only in NEW"
        elif r["status_base"] != "ok" or r["status_new"] != "ok":
            lost = r["status_base"] == "ok" and r["status_new"] != "ok"
            row["verdict"] = f"status {r['status_base']} → {r['status_new']}"
            row["gate"] = lost
        else:
            bm, nm = float(r["latency_ms_median_base"]), float(r["latency_ms_median_new"])
            ratio = nm / bm
            slower = float(r["latency_ms_p20_new"]) > float(r["latency_ms_p80_base"])
            faster = float(r["latency_ms_p80_new"]) < float(r["latency_ms_p20_base"])
            row.update(ratio=ratio, change_pct=100.0 * (ratio - 1.0), beyond_noise=slower or faster)
            row["verdict"] = "slower" if slower else ("faster" if faster else "within noise")
            row["gate"] = threshold is not None and slower and ratio > 1.0 + threshold
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table, table
    table = table.sort_values(["gate", "ratio"], ascending=[False, False], na_position="last").reset_index(drop=True)
    failures = table[table["gate"]] if threshold is not None else table.iloc[0:0]
    return table, failures


def compare_runs(base_dir: Path | str, new_dir: Path | str, threshold: float | None = None, *, force: bool = False) -> Comparison:
    """Compare two run folders; refuses (UserError) when they ran on different devices, unless `force`."""
    base, base_env, base_warnings = _load(Path(base_dir))
    new, new_env, new_warnings = _load(Path(new_dir))
    device_diffs = environment_differences(base_env, new_env, DEVICE_KEYS)
    if device_diffs and not force:
        raise UserError(f"runs measured different devices ({'; '.join(device_diffs)}): their times are not comparable; pass --force to compare anyway")
    diffs = environment_differences(base_env, new_env)
    table, failures = compare_frames(base, new, threshold)
    return Comparison(table, diffs, threshold, failures, base_warnings + new_warnings)


def print_comparison(result: Comparison, base_name: str, new_name: str, out: TextIO) -> None:
    """The human summary: environment warnings, then one line per row, the worst first."""
    for warning in result.warnings:
        out.write(f"warning: {warning}\n")
    for diff in result.env_differences:
        out.write(f"warning: environments differ: {diff}\n")
    table = result.table
    if table.empty:
        out.write("no rows to compare\n")
        return
    out.write(f"{'case':<48} {'backend':<16} {'base ms':>10} {'new ms':>10} {'ratio':>7}  verdict\n")
    for _, r in table.iterrows():
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None and r["ratio"] == r["ratio"] else ""
        base_ms = f"{r['base_ms']:.4g}" if r["base_ms"] == r["base_ms"] and r["base_ms"] is not None else ""
        new_ms = f"{r['new_ms']:.4g}" if r["new_ms"] == r["new_ms"] and r["new_ms"] is not None else ""
        flag = "  FAIL" if r["gate"] else ""
        out.write(f"{r['case_id']:<48} {r['backend']:<16} {base_ms:>10} {new_ms:>10} {ratio:>7}  {r['verdict']}{flag}\n")
    counts = table["verdict"].value_counts()
    out.write(f"{base_name} → {new_name}: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n")
    if result.threshold is not None:
        if result.failed:
            out.write(f"FAIL: {len(result.failures)} rows slowed down by more than {100 * result.threshold:g}% beyond the noise, or stopped running\n")
        else:
            out.write(f"ok: no row slowed down by more than {100 * result.threshold:g}% beyond the noise\n")
