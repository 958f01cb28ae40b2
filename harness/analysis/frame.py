"""From records to the analysis frame: runs loaded with their peaks, environment and manifest; derived and roofline columns.

Everything in `harness.analysis` reads records (a pandas DataFrame from `harness.results.store.load_run`) and
the peaks stored with a run; nothing rewrites a record. Rules that every table obeys:

- a winner is chosen only among rows with `status == ok` and `agree` true that are neither contended nor suspect
  (`harness.analysis.trust`), and every choosing table says how many it left out;
- a fit needs at least three points, and says so when it has fewer;
- a crossover outside the sweep is a bound ("S* > 2048"), never an extrapolated number;
- a percentage of peak above 100 % is flagged impossible (at the top of the row's interval, against the best ceiling
  the run measured, unless that ceiling was itself contended), never shown as a win.

What a backend is (an attention core or not, whether it materialises the scores, the baseline) is
what it declared (`Backend.capabilities`), as the run's manifest recorded it, never a list of names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.errors import UserError
from harness.analysis import roofline
from harness.analysis.trust import untrusted
from harness.results.documents import ENV, MANIFEST, Environment, Manifest, read_optional
from harness.results.pair_specs import pair_cases
from harness.suite.cases import CASE_FIELDS, Case

#: The case fields that vary along a curve against S, and a batch's per-request lengths (lists; `length_dist` names them).
_ALONG_S = ("S_q", "S_kv", "seq_lens_q", "seq_lens_kv")
#: Case fields held fixed when something is plotted or fitted against S: every field of the Case but those, so a field
#: added to the Case never mixes its values in one curve; a device model is never mixed; q_len tells decoding from square.
GROUP_FIELDS = (*(name for name in CASE_FIELDS if name not in _ALONG_S), "device_model", "q_len")
#: The fields a group's label leaves out when they have their default value (a CPU row, seed 0, a dense batch).
_CASE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Case) if f.default is not dataclasses.MISSING}
#: What names one analysed case: the case as recorded, on one device model (two GPU generations answer two questions).
CASE_KEY = ("case_id", "device_model")
MIN_FIT_POINTS = 3


@dataclass
class RunData:
    """The records of one or more runs, with each run's peaks, environment and manifest."""

    frame: pd.DataFrame
    peaks: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    env: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)
    #: Things the loader decided that a reader should know (rows superseded by a later run).
    notes: list[str] = field(default_factory=list)
    #: Every row of a pair that more than one run measured, with `run_used` True for the row the tables use.
    repeated: pd.DataFrame = field(default_factory=pd.DataFrame)


def load(run_dirs: Sequence[Path | str]) -> RunData:
    """Load runs, their peaks, env.json and manifest, and add the derived columns (S, D, roofline)."""
    from harness.results.store import load_run

    if not run_dirs:
        raise UserError("give at least one run folder")
    peaks: dict[str, Any] = {}
    env: dict[str, Any] = {}
    manifests: dict[str, Any] = {}
    dirs: dict[str, Path] = {}
    frames = []
    dropped: list[str] = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a run folder")
        frame = load_run(run_dir)
        if frame.empty:
            raise UserError(f"{run_dir} has no records yet (records.jsonl is empty): nothing to analyse; finish it with attnbench run --resume {run_dir}")
        dropped.extend(frame.attrs.get("dropped_partial_lines", []))
        run_id = run_dir.name
        frame["run_id"] = frame["run_id"].fillna(run_id).replace("", run_id)
        ids = set(frame["run_id"].dropna()) or {run_id}
        stored_peaks = roofline.read_peaks(run_dir)
        run_env, manifest = read_optional(run_dir / ENV, Environment), read_optional(run_dir / MANIFEST, Manifest)
        if manifest is not None:
            pair_cases(manifest, run_dir / MANIFEST)  # every pair a case that can exist, as resume and db add check it
        for rid in ids:
            peaks[rid] = stored_peaks
            env[rid] = run_env.to_dict() if run_env else {}
            manifests[rid] = manifest.to_dict() if manifest else {}
            dirs[rid] = run_dir
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    notes = [f"{path}: a truncated last line (a run stopped mid-write) was left out; resume that run to redo the pair" for path in dropped]
    frame = by_device_model(frame, env)
    frame, repeated = one_row_per_pair(frame)
    if not repeated.empty:
        pairs = repeated.drop_duplicates([*CASE_KEY, "backend"])
        notes.append(f"{len(pairs)} (case, backend) pairs were measured by more than one run: each table uses one row per pair, "
                     "the last run's row that carries no contended or suspect flag (else the last run's), and names its run; "
                     "the Repeated pairs table lists every run's median")
    capabilities = declared_capabilities(sorted(set(frame["backend"])), manifests.values())
    return RunData(with_roofline(derive_columns(frame, capabilities), peaks), peaks, env, manifests, dirs, notes, repeated)


def one_row_per_pair(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (case, device model, backend), and every row of a pair measured by several runs (`run_used` marks the kept one).

    The kept row is the last run's among the rows that carry no untrusted flag, else the last run's: a contended
    repeat never hides a quiet measurement of the same pair.
    """
    key = [*CASE_KEY, "backend"]
    repeated_mask = frame.duplicated(key, keep=False)
    if not repeated_mask.any():
        return frame, frame.iloc[0:0].assign(run_used=pd.Series(dtype=bool))
    order = frame.assign(_position=range(len(frame)), _trusted=~untrusted(frame))
    kept_positions = order.sort_values(["_trusted", "_position"], kind="stable").drop_duplicates(key, keep="last")["_position"]
    kept = frame.iloc[sorted(kept_positions)].reset_index(drop=True)
    repeated = frame[repeated_mask].assign(run_used=[p in set(kept_positions) for p in order.loc[repeated_mask, "_position"]])
    return kept, repeated.reset_index(drop=True)


def by_device_model(frame: pd.DataFrame, env: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Name each row's device model (the row's own, from a Ray node, else its run's) in `device_model`, and its case's label.

    Rows measured on different device models (two GPU generations, a Ray cluster of mixed nodes) are never
    ranked against each other: winners, speed-ups and recommendations group by `CASE_KEY` (case id and device
    model), and `case_id` stays as recorded. `case` is what a table shows: the case id, followed by
    `@ <device model>` when the rows hold more than one model.
    """
    def run_device(run_id: Any) -> str:
        before = (env.get(run_id) or {}).get("before") or {}
        return str(before.get("device_name") or before.get("device_type") or "unknown device")

    frame = frame.copy()
    own = frame["device_name"] if "device_name" in frame.columns else pd.Series([None] * len(frame), index=frame.index)
    frame["device_model"] = [str(d) if isinstance(d, str) and d else run_device(r) for d, r in zip(own, frame["run_id"])]
    mixed = frame["device_model"].nunique() > 1
    frame["case"] = frame["case_id"] + " @ " + frame["device_model"] if mixed else frame["case_id"]
    return frame


def case_key(frame: pd.DataFrame) -> list[str]:
    """The columns that name one analysed case in `frame` (`CASE_KEY`; only `case_id` in a frame built without device models)."""
    return [c for c in CASE_KEY if c in frame.columns]


def case_labels(frame: pd.DataFrame) -> pd.Series:
    """Each row's case as a table shows it (`by_device_model`'s `case`; the case id in a frame without it)."""
    return frame["case"] if "case" in frame.columns else frame["case_id"]


def declared_capabilities(backends: Iterable[str], manifests: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, bool]]:
    """Each backend's capabilities: as a run's manifest recorded them, else as the installed registry declares them."""
    found: dict[str, dict[str, bool]] = {}
    for manifest in manifests:
        found.update(manifest.get("capabilities") or {})
    missing = [b for b in backends if b not in found]
    if missing:
        from harness.backends.registry import load_registry  # torch, and every plugin: only for a run that did not record them

        registry = load_registry()
        for name in missing:
            if name in registry:
                try:
                    found[name] = registry.get(name).capabilities()
                except UserError:
                    pass  # a plugin that no longer loads: its rows keep the defaults
    return found


def derive_columns(frame: pd.DataFrame, capabilities: Mapping[str, Mapping[str, bool]]) -> pd.DataFrame:
    """Add `S` (= S_kv), `q_len` ('=S' for square cases, else S_q), `D` (= H·d_k), typed flags and each row's backend capabilities."""
    from harness.backends.capabilities import CAPABILITY_DEFAULTS

    frame = frame.copy()
    for name in ("B", "S_q", "S_kv", "H", "H_kv", "d_k", "d_v"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("Int64")
    frame["S"] = frame["S_kv"]
    frame["q_len"] = np.where(frame["S_q"] == frame["S_kv"], "=S", frame["S_q"].astype(str))
    frame["D"] = frame["H"] * frame["d_k"]
    frame["window"] = frame["window"].astype(object).where(frame["window"].notna(), None)
    for name in ("causal", "padding"):
        frame[name] = frame[name].fillna(False).astype(bool)
    frame["agree_ok"] = frame["agree"].map(lambda a: a is True)
    for name, default in CAPABILITY_DEFAULTS.items():  # undeclared (an unknown backend): the defaults every Backend starts from
        frame[name] = frame["backend"].map(lambda b, n=name, d=default: bool(capabilities.get(b, {}).get(n, d)))
    for name in ("latency_ms_median", "latency_ms_p20", "latency_ms_p80", "tflops", "gbps", "arithmetic_intensity", "peak_mem_bytes", "max_abs_err", "err_bound"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    return frame


def with_roofline(frame: pd.DataFrame, peaks: Mapping[str, dict[str, Any] | None]) -> pd.DataFrame:
    """Add pct_peak_flops, pct_peak_bw, bound, attainable TFLOP/s, the clock-scaled and datasheet shares and `impossible` from each row's run peaks."""
    from harness.analysis.datasheets import datasheet_of

    def column(name: str) -> pd.Series:
        return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index)

    rows = []
    for run_id, dtype, tflops, gbps, intensity, status, median, high, sm, mem, model in zip(
        frame["run_id"], frame["dtype"], frame["tflops"], frame["gbps"], frame["arithmetic_intensity"], frame["status"],
        column("latency_ms_median"), column("latency_ms_ci95_high"), column("gpu_sm_clock_mhz_median"),
        column("gpu_mem_clock_mhz_median"), column("device_model"),
    ):
        run_peaks = peaks.get(run_id)
        measured = status == "ok"
        slowest = num(high) / num(median) if num(high) and num(median) else None
        rows.append(roofline.roofline_row(
            num(tflops) if measured else None, num(gbps) if measured else None, num(intensity),
            roofline.peak_tflops(run_peaks, dtype), roofline.peak_gbps(run_peaks),
            slowest=slowest, peaks=run_peaks, dtype=dtype, sm_clock_mhz=sm, mem_clock_mhz=mem,
            sheet=datasheet_of(model if isinstance(model, str) else None),
        ))
    extra = pd.DataFrame(rows, index=frame.index)
    return pd.concat([frame.drop(columns=[c for c in extra.columns if c in frame.columns]), extra], axis=1)


def num(value: Any) -> float | None:
    """A finite float, or None for anything else (None, NaN, text)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that were measured (status ok)."""
    return frame[frame["status"] == "ok"]


def is_core(frame: pd.DataFrame) -> pd.Series:
    """True for rows of backends that compute the case's attention core (not the layer, the projections or MLA)."""
    return frame["attention_core"].astype(bool)


def agreeing_rows(frame: pd.DataFrame, *, flagged: bool = False) -> pd.DataFrame:
    """Attention-core rows that were measured, agree with the float64 reference and carry no untrusted flag: the only rows that may win.

    `flagged=True` keeps the contended and suspect rows too: the candidates before `harness.analysis.trust` leaves them out.
    """
    rows = frame[(frame["status"] == "ok") & frame["agree_ok"] & is_core(frame)]
    return rows if flagged else rows[~untrusted(rows)]


def trusted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows that carry no untrusted flag: what a fit or a crossover is drawn from."""
    rows = ok_rows(frame)
    return rows[~untrusted(rows)]


def group_key_columns(frame: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The fixed-parameter columns present in `frame`, minus `exclude`."""
    skip = set(exclude)
    return [c for c in GROUP_FIELDS if c in frame.columns and c not in skip]


def describe_group(key: Mapping[str, Any]) -> str:
    """A short label for fixed parameters, e.g. `B1 H8 Hkv2 dk64 fp32 causal`."""
    parts = []
    for name, prefix in (("B", "B"), ("H", "H"), ("H_kv", "Hkv"), ("d_k", "dk")):
        if name in key and key[name] is not None:
            parts.append(f"{prefix}{key[name]}")
    if "d_v" in key and key.get("d_v") is not None and key.get("d_v") != key.get("d_k"):
        parts.append(f"dv{key['d_v']}")
    if key.get("q_len") not in (None, "=S"):
        parts.append(f"Sq{key['q_len']}")
    if key.get("dtype"):
        parts.append(str(key["dtype"]))
    if key.get("causal"):
        parts.append("causal")
    if key.get("window") is not None and key.get("window") == key.get("window"):
        parts.append(f"win{int(key['window'])}")
    if key.get("padding"):
        parts.append("pad")
    if key.get("mode") not in (None, "fwd"):
        parts.append(str(key["mode"]))
    named = {"B", "H", "H_kv", "d_k", "d_v", "q_len", "dtype", "causal", "window", "padding", "mode", "device", "device_model"}
    for name in GROUP_FIELDS:  # any other field, by its name, where it is not the Case's default
        value = key.get(name)
        if name in named or value is None or value != value or value == _CASE_DEFAULTS.get(name, None) or value is False:
            continue
        parts.append(name if value is True else f"{name}={value}")
    return " ".join(parts)


def groups(frame: pd.DataFrame, keys: list[str]):
    """groupby that keeps None/NaN keys (window) and yields (dict key, sub-frame)."""
    if frame.empty:
        return
    for values, sub in frame.groupby(keys, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        yield {k: (None if (isinstance(v, float) and math.isnan(v)) else v) for k, v in zip(keys, values)}, sub
