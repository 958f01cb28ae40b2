"""`attnbench compare BASE NEW`: per (case, backend), the ratio of medians and whether the two differ; per backend, their geometric mean.

A difference counts as real only by `harness.analysis.difference`'s rule: the two rows' 95 % intervals of
the median, widened by the box's run-to-run variation where `attnbench stability` measured it
(`--variation FILE`), do not overlap. `--fail-above 5%` makes the command exit 1 when any row is slower by
that rule and by more than 5 %, or when a row that ran in BASE no longer runs in NEW, so that CI can gate
on it. A pair whose row is contended or suspect in either run is shown with its ratio and "not judged": its
median measured the other work too, so it neither passes nor fails the gate; nor does a throttled one (a GPU whose
clock was below its sustained one). A gate passes only on enough evidence: `--min-judged N|P%` (default
DEFAULT_MIN_JUDGED) is how many of the pairs both runs measured `ok` must have been judged, and below it the gate is
undecided (exit 3, with the share) unless a judged row failed it. Two runs that share no (case, backend) pair
are undecided too (exit 3), never "N rows slower". Per backend, as pyperf's compare does, the geometric mean of the per-case ratios and how many cases
were faster, slower and not different.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TextIO

import pandas as pd

from harness.analysis.difference import HIGH, LOW, RULE_TEXT, Variation, check_variation_device, order
from harness.analysis.gate import DEFAULT_MIN_JUDGED, MinJudged, parse_min_judged  # noqa: F401 - re-exported for the CLI
from harness.analysis.trust import UNTRUSTED_FLAGS, is_set
from harness.env import DEVICE_KEYS, IDENTITY_KEYS, VERSION_KEYS
from harness.errors import UserError

#: Row columns naming what measured a row (harness.env.harness_identity): the measurement rules change between versions.
ROW_IDENTITY_KEYS = IDENTITY_KEYS[:2]
EXIT_REGRESSION = 1
#: compare --fail-above's exit when no pair could be judged: a gate on a contended machine neither passes nor fails.
EXIT_UNDECIDED = 3
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


def identity_differences(base: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """`field: BASE values → NEW values` for each identity column whose known values differ between two runs' rows."""
    out = []
    for key in ROW_IDENTITY_KEYS:
        # Unknown (null: a row written before the columns, or outside a git checkout) says nothing either way.
        b, n = (sorted({v for v in frame[key] if isinstance(v, str)}) if key in frame.columns else [] for frame in (base, new))
        if b and n and b != n:
            out.append(f"{key}: {', '.join(b)} → {', '.join(n)}")
    return out


#: The number every `ok` row must have; its interval (LOW, HIGH) may be absent (under 6 samples), and the rule then says "not different".
LATENCY_COLUMNS = ("latency_ms_median",)


def _check_latencies(frame: pd.DataFrame, where: Path) -> pd.DataFrame:
    """Every `ok` row's median and interval as floats; UserError naming the file, the row and the column of a missing median.

    Their types were checked when the records were read (`Record.from_dict`); what is left is an `ok`
    row without a number, which a reader of types alone lets through.
    """
    for column in (LOW, HIGH):
        frame = frame.assign(**{column: pd.to_numeric(frame[column], errors="coerce").astype("float64")}) if column in frame.columns else frame.assign(**{column: math.nan})
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
    #: Per backend: the geometric mean of NEW/BASE over the cases both ran, and the counts by verdict (`geomean_summary`).
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: The run-to-run variation the intervals were widened by, if one was given.
    variation: Variation | None = None
    #: Things the user should know about the inputs (a truncated last line dropped from a records file).
    warnings: list[str] = field(default_factory=list)
    #: How NEW's rows name another attnbench than BASE's (`identity_differences`): warned of on stderr.
    harness_differences: list[str] = field(default_factory=list)
    #: How many judged pairs the gate needs to pass (`--min-judged`).
    min_judged: MinJudged = field(default_factory=lambda: parse_min_judged(DEFAULT_MIN_JUDGED))

    @property
    def shared_pairs(self) -> int:
        """How many (case, backend) pairs both runs hold a row of."""
        if "verdict" not in self.table.columns:
            return 0
        return int((~self.table["verdict"].isin((MISSING_IN_NEW, ONLY_IN_NEW))).sum())

    @property
    def disjoint(self) -> bool:
        """True when the runs hold rows but share no (case, backend) pair: there is nothing to compare."""
        return not self.table.empty and self.shared_pairs == 0

    @property
    def measured_both(self) -> int:
        """Pairs both runs measured `ok`: the judged ones and those left unjudged by a flag."""
        return self.judged + len(not_judged(self.table))

    @property
    def failed(self) -> bool:
        """True when a threshold was given and some row regressed past it (or stopped running), in runs that share a pair."""
        return self.threshold is not None and not self.failures.empty and not self.disjoint

    @property
    def too_few_judged(self) -> bool:
        """True when a gate would pass on fewer judged pairs than `min_judged` asks of those both runs measured."""
        return (self.threshold is not None and not self.failed and self.measured_both > 0
                and self.judged < self.min_judged.required(self.measured_both))

    def judged_text(self) -> str:
        """'2 of 18 pairs both runs measured were judged (11%)'."""
        share = 100.0 * self.judged / self.measured_both if self.measured_both else 0.0
        return f"{self.judged} of {self.measured_both} pairs both runs measured were judged ({share:.0f}%)"

    @property
    def judged(self) -> int:
        """How many pairs measured in both runs were judged by the rule (faster, slower or within noise)."""
        return int(self.table["verdict"].isin((FASTER, SLOWER, SAME)).sum()) if "verdict" in self.table.columns else 0

    @property
    def verdict(self) -> str:
        """The comparison in one word, as its text ends: FAIL, UNDECIDED, ok (a gate passed), or NO_GATE (no --fail-above: rows only)."""
        if self.disjoint or self.undecided:
            return UNDECIDED
        if self.threshold is None:
            return NO_GATE
        return FAIL if self.failed else OK

    def gate_line(self) -> str | None:
        """The gate's closing sentence (`FAIL: …`, `UNDECIDED: …`, `ok: …`), None without a threshold or for runs sharing no pair."""
        if self.threshold is None or self.disjoint or self.table.empty:
            return None
        skipped = len(not_judged(self.table))
        judged = f" of the {self.judged} judged" if skipped else ""
        if self.verdict == FAIL:
            return f"FAIL: {len(self.failures)}{judged} rows slower by the rule and by more than {100 * self.threshold:g}%, or stopped running"
        if self.verdict == UNDECIDED and self.judged == 0:
            return (f"UNDECIDED: not one of the {skipped} pairs both runs measured could be judged (a side of each was contended, suspect "
                    f"or throttled): the gate neither passes nor fails them (exit {EXIT_UNDECIDED}); measure again on a quiet machine")
        if self.verdict == UNDECIDED:
            return (f"UNDECIDED: only {self.judged_text()}, under --min-judged {self.min_judged}: the gate does not pass on so few "
                    f"(exit {EXIT_UNDECIDED}); measure again on a quiet machine, or lower --min-judged")
        return f"ok: no row{judged} slower by the rule and by more than {100 * self.threshold:g}%"

    @property
    def undecided(self) -> bool:
        """True when the runs share no pair, or a threshold was given, nothing failed, and too few pairs were judged (none, or under `min_judged`)."""
        if self.disjoint:
            return True
        return self.threshold is not None and not self.failed and (
            (self.judged == 0 and len(not_judged(self.table)) > 0) or self.too_few_judged)


#: What a comparison comes to (`Comparison.verdict`): its gate failed, could not decide, passed, or no gate was asked for.
FAIL, UNDECIDED, OK, NO_GATE = "FAIL", "UNDECIDED", "ok", "no gate"
#: Verdicts of a pair of `ok` rows.
FASTER, SLOWER, SAME = "faster", "slower", "within noise"
#: How the verdict of a pair starts when a side's row carries an untrusted flag (contended, suspect, throttled): shown with its ratio, never gated on.
NOT_JUDGED = "not judged"
#: How the verdict of a pair that is not `ok` in both runs, with the same status, ends ("unsupported in both").
UNCHANGED_SUFFIX = " in both"
#: The verdicts of a pair only one run holds.
MISSING_IN_NEW, ONLY_IN_NEW = "missing in NEW", "only in NEW"


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, threshold: float | None = None, cv: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Join two runs' rows on (case, backend): ratio of medians, verdict by the rule (widened by `cv`), and the rows that fail the gate."""
    cols = ["case_id", "backend", "status", "latency_ms_median", LOW, HIGH, *UNTRUSTED_FLAGS]
    b = base.reindex(columns=cols).drop_duplicates(["case_id", "backend"], keep="last")
    n = new.reindex(columns=cols).drop_duplicates(["case_id", "backend"], keep="last")
    joined = b.merge(n, on=["case_id", "backend"], how="outer", suffixes=("_base", "_new"), indicator=True)
    rows = []
    for _, r in joined.iterrows():
        row = {"case_id": r["case_id"], "backend": r["backend"], "status_base": r.get("status_base"), "status_new": r.get("status_new"),
               "base_ms": r.get("latency_ms_median_base"), "new_ms": r.get("latency_ms_median_new"),
               "ratio": None, "change_pct": None, "beyond_noise": None, "verdict": "", "gate": False}
        if r["_merge"] == "left_only":
            row["verdict"] = MISSING_IN_NEW
            row["gate"] = r["status_base"] == "ok"
        elif r["_merge"] == "right_only":
            row["verdict"] = ONLY_IN_NEW
        elif r["status_base"] == r["status_new"] != "ok":
            row["verdict"] = f"{r['status_base']} in both"  # nothing changed: counted, not listed
        elif r["status_base"] != "ok" or r["status_new"] != "ok":
            lost = r["status_base"] == "ok" and r["status_new"] != "ok"
            row["verdict"] = f"status {r['status_base']} → {r['status_new']}"
            row["gate"] = lost
        elif flags := _untrusted_sides(r):
            bm, nm = float(r["latency_ms_median_base"]), float(r["latency_ms_median_new"])
            row.update(ratio=nm / bm, change_pct=100.0 * (nm / bm - 1.0))
            row["verdict"] = f"{NOT_JUDGED}: {flags}"  # a contended median measures the other work too: it neither passes nor fails
        else:
            bm, nm = float(r["latency_ms_median_base"]), float(r["latency_ms_median_new"])
            ratio = nm / bm
            sign = order({LOW: r[f"{LOW}_new"], HIGH: r[f"{HIGH}_new"]}, {LOW: r[f"{LOW}_base"], HIGH: r[f"{HIGH}_base"]}, cv)
            slower, faster = sign > 0, sign < 0
            row.update(ratio=ratio, change_pct=100.0 * (ratio - 1.0), beyond_noise=slower or faster)
            row["verdict"] = SLOWER if slower else (FASTER if faster else SAME)
            row["gate"] = threshold is not None and slower and ratio > 1.0 + threshold
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table, table
    table = table.sort_values(["gate", "ratio"], ascending=[False, False], na_position="last").reset_index(drop=True)
    failures = table[table["gate"]] if threshold is not None else table.iloc[0:0]
    return table, failures


def _untrusted_sides(row: Mapping[str, Any]) -> str:
    """'contended in NEW', 'suspect in BASE and NEW', …: the untrusted flags either side of a joined row carries ('' for none)."""
    parts = []
    for name in UNTRUSTED_FLAGS:
        sides = [side for side, suffix in (("BASE", "_base"), ("NEW", "_new")) if is_set(row.get(name + suffix))]
        if sides:
            parts.append(f"{name} in {' and '.join(sides)}")
    return ", ".join(parts)


def not_judged(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a comparison that were measured in both runs but not judged, because a side carries an untrusted flag."""
    return table[table["verdict"].astype(str).str.startswith(NOT_JUDGED)] if "verdict" in table.columns else table


def geomean_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per backend over the cases both runs measured `ok` without untrusted flags: the geometric mean of NEW/BASE and how many were faster, slower, not different."""
    rows = table[table["ratio"].notna() & table["verdict"].isin((FASTER, SLOWER, SAME))] if "ratio" in table.columns else table
    out = []
    for backend, sub in rows.groupby("backend", sort=True):
        ratios = sub["ratio"].astype(float)
        counts = sub["verdict"].value_counts()
        out.append({"backend": backend, "cases": len(sub), "geomean_ratio": math.exp(ratios.map(math.log).mean()),
                    FASTER: int(counts.get(FASTER, 0)), SLOWER: int(counts.get(SLOWER, 0)), SAME: int(counts.get(SAME, 0))})
    return pd.DataFrame(out, columns=["backend", "cases", "geomean_ratio", FASTER, SLOWER, SAME])


def compare_runs(base_dir: Path | str, new_dir: Path | str, threshold: float | None = None, *, force: bool = False,
                 variation: Variation | None = None, min_judged: MinJudged | None = None) -> Comparison:
    """Compare two run folders; refuses (UserError) when they ran on different devices, unless `force`, or when `variation` is another device's."""
    base, base_env, base_warnings = _load(Path(base_dir))
    new, new_env, new_warnings = _load(Path(new_dir))
    device_diffs = environment_differences(base_env, new_env, DEVICE_KEYS)
    if device_diffs and not force:
        raise UserError(f"runs measured different devices ({'; '.join(device_diffs)}): their times are not comparable; pass --force to compare anyway")
    check_variation_device(variation, [base_env, new_env], "these runs")
    diffs = environment_differences(base_env, new_env)
    table, failures = compare_frames(base, new, threshold, variation.cv if variation else 0.0)
    return Comparison(table, diffs, threshold, failures, geomean_summary(table), variation, base_warnings + new_warnings,
                      identity_differences(base, new), min_judged or parse_min_judged(DEFAULT_MIN_JUDGED))


def print_comparison(result: Comparison, base_name: str, new_name: str, out: TextIO) -> None:
    """The human summary: environment warnings, then one line per row, the worst first."""
    for warning in result.warnings:
        out.write(f"warning: {warning}\n")
    for diff in result.env_differences:
        out.write(f"warning: environments differ: {diff}\n")
    if result.harness_differences:  # one line, beside the environments' differences
        out.write(f"warning: NEW's rows were measured by another attnbench ({'; '.join(result.harness_differences)}): "
                  f"its measurement rules may differ\n")
    out.write(f"rule: {RULE_TEXT}; " + (result.variation.describe() if result.variation else "no run-to-run variation given (--variation FILE)") + "\n")
    table = result.table
    if table.empty:
        out.write("no rows to compare\n")
        return
    if result.disjoint:
        base_cases = table.loc[table["verdict"] == MISSING_IN_NEW, "case_id"].nunique()
        new_cases = table.loc[table["verdict"] == ONLY_IN_NEW, "case_id"].nunique()
        shared = set(table.loc[table["verdict"] == MISSING_IN_NEW, "case_id"]) & set(table.loc[table["verdict"] == ONLY_IN_NEW, "case_id"])
        what = "no (case, backend) pair" if shared else "no case"
        out.write(f"UNDECIDED: {base_name} and {new_name} share {what} ({base_name}: {base_cases} cases, {new_name}: {new_cases}): "
                  f"nothing to compare, so the gate neither passes nor fails (exit {EXIT_UNDECIDED}); compare runs of the same suite\n")
        return
    shown = table[~table["verdict"].str.endswith(UNCHANGED_SUFFIX)]
    cells = [(str(r["case_id"]), str(r["backend"]), _number(r["base_ms"], ".4g"), _number(r["new_ms"], ".4g"), _number(r["ratio"], ".3f"),
              str(r["verdict"]) + ("  FAIL" if r["gate"] else "")) for _, r in shown.iterrows()]
    case_w = max([len("case"), *(len(c[0]) for c in cells)])
    backend_w = max([len("backend"), *(len(c[1]) for c in cells)])
    out.write(f"{'case':<{case_w}} {'backend':<{backend_w}} {'base ms':>10} {'new ms':>10} {'ratio':>7}  verdict\n")
    for case, backend, base_ms, new_ms, ratio, verdict in cells:
        out.write(f"{case:<{case_w}} {backend:<{backend_w}} {base_ms:>10} {new_ms:>10} {ratio:>7}  {verdict}\n")
    counts = table["verdict"].map(lambda v: NOT_JUDGED if str(v).startswith(NOT_JUDGED) else v).value_counts()
    out.write(f"{base_name} → {new_name}: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n")
    skipped = not_judged(table)
    if len(skipped):
        out.write(f"{len(skipped)} rows not judged: a side was contended, suspect or throttled, so its median measured more than the backend; "
                  "they pass or fail nothing (re-measure them on a quiet machine)\n")
    for _, g in result.summary.iterrows():
        ratio = float(g["geomean_ratio"])
        speed = f"{ratio:.3f}x slower" if ratio > 1 else (f"{1 / ratio:.3f}x faster" if ratio < 1 else "the same")
        out.write(f"{g['backend']}: geometric mean {speed} over {g['cases']} cases ({g[FASTER]} faster, {g[SLOWER]} slower, {g[SAME]} not different)\n")
    gate = result.gate_line()
    if gate is not None:
        out.write(gate + "\n")


def _number(value: Any, spec: str) -> str:
    """A table cell: the number in `spec`, or '' for None and NaN."""
    return format(float(value), spec) if value is not None and value == value else ""


def comparison_document(result: Comparison, base_name: str, new_name: str) -> dict[str, Any]:
    """The JSON document `compare --json` prints: what the text says, row by row."""
    def cell(value: Any) -> Any:
        return None if value is None or (isinstance(value, float) and value != value) else (value.item() if hasattr(value, "item") else value)

    return {"base": base_name, "new": new_name, "rule": RULE_TEXT, "variation": result.variation.to_dict() if result.variation else None,
            "threshold": result.threshold, "failed": result.failed, "undecided": result.undecided, "judged": result.judged,
            "measured_both": result.measured_both, "min_judged": str(result.min_judged), "shared_pairs": result.shared_pairs, "warnings": result.warnings, "environment_differences": result.env_differences,
            "harness_differences": result.harness_differences, "not_judged": len(not_judged(result.table)),
            "rows": [{k: cell(v) for k, v in row.items()} for row in result.table.to_dict("records")],
            "summary": [{k: cell(v) for k, v in row.items()} for row in result.summary.to_dict("records")]}
