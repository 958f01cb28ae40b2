"""From measured rows to answers: roofline, the S² crossover, scaling laws, memory against its model, winners.

Everything here reads records (a pandas DataFrame from `harness.results.store.load_run`) and the
peaks stored with a run; nothing rewrites a record. Rules that every table obeys:

- a winner is chosen only among rows with `status == ok` and `agree` true;
- a fit needs at least three points, and says so when it has fewer;
- a crossover outside the sweep is a bound ("S* > 2048"), never an extrapolated number;
- a percentage of peak above 100 % is flagged impossible, never shown as a win.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.measure import roofline
from harness.errors import UserError

#: Case fields held fixed when something is plotted or fitted against S (S_q and S_kv vary).
GROUP_FIELDS = ("B", "H", "H_kv", "d_k", "d_v", "dtype", "device", "causal", "mode", "window", "padding", "q_len")
#: The same, without the batch size or the KV heads (the axes of the winner maps).
DEFAULT_BASELINE = "sdpa-math"
#: The backend whose rows are the projection term of the crossover.
PROJECTIONS = "projections"
#: Backends whose memory model is the materialised score and probability matrices.
MATERIALIZING_BACKENDS = frozenset({"naive", "sdpa-math", "naive-compiled"})
MATERIALIZING_FAMILIES = frozenset({"eager"})
MIN_FIT_POINTS = 3
#: Families whose rows time something other than the case's attention core (the whole layer, the
#: projections alone, MLA's latent form): never ranked against the cores, never a crossover curve.
NON_CORE_FAMILIES = frozenset({"layer", "mla"})


# -- loading -----------------------------------------------------------------------------------
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


def load(run_dirs: Sequence[Path | str]) -> RunData:
    """Load runs, their peaks, env.json and manifest, and add the derived columns (S, D, roofline)."""
    import json

    from harness.results.store import load_run

    if not run_dirs:
        raise UserError("give at least one run folder")
    peaks: dict[str, Any] = {}
    env: dict[str, Any] = {}
    manifests: dict[str, Any] = {}
    dirs: dict[str, Path] = {}
    frames = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a run folder")
        frame = load_run(run_dir)
        run_id = run_dir.name
        frame["run_id"] = frame["run_id"].fillna(run_id).replace("", run_id)
        ids = set(frame["run_id"].dropna()) or {run_id}
        stored_peaks = roofline.read_peaks(run_dir)
        env_path, manifest_path = run_dir / "env.json", run_dir / "manifest.json"
        for rid in ids:
            peaks[rid] = stored_peaks
            env[rid] = json.loads(env_path.read_text()) if env_path.exists() else {}
            manifests[rid] = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
            dirs[rid] = run_dir
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    notes = []
    duplicated = frame.duplicated(["case_id", "backend"], keep="last")
    if duplicated.any():  # the same pair measured by several runs: the later run's row stands
        notes.append(f"{int(duplicated.sum())} (case, backend) pairs were measured by more than one run; the row of the run given last is used")
        frame = frame[~duplicated].reset_index(drop=True)
    return RunData(with_roofline(derive_columns(frame), peaks), peaks, env, manifests, dirs, notes)


def derive_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `S` (= S_kv), `q_len` ('=S' for square cases, else S_q), `D` (= H·d_k) and typed flags."""
    frame = frame.copy()
    for name in ("B", "S_q", "S_kv", "H", "H_kv", "d_k", "d_v"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("Int64")
    frame["S"] = frame["S_kv"]
    frame["q_len"] = np.where(frame["S_q"] == frame["S_kv"], "=S", frame["S_q"].astype(str))
    frame["D"] = frame["H"] * frame["d_k"]
    frame["window"] = frame["window"].astype(object).where(frame["window"].notna(), None)
    for name in ("causal", "padding"):
        frame[name] = frame[name].fillna(False).astype(bool)
    frame["agree_ok"] = frame["agree"].map(lambda a: a is True or a == 1 or (isinstance(a, str) and a.lower() == "true"))
    for name in ("latency_ms_median", "latency_ms_p20", "latency_ms_p80", "tflops", "gbps", "arithmetic_intensity", "peak_mem_bytes", "max_abs_err", "err_bound"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    return frame


def with_roofline(frame: pd.DataFrame, peaks: Mapping[str, dict[str, Any] | None]) -> pd.DataFrame:
    """Add pct_peak_flops, pct_peak_bw, bound, attainable TFLOP/s and `impossible` from each row's run peaks."""
    rows = []
    for run_id, dtype, tflops, gbps, intensity, status in zip(
        frame["run_id"], frame["dtype"], frame["tflops"], frame["gbps"], frame["arithmetic_intensity"], frame["status"]
    ):
        run_peaks = peaks.get(run_id)
        measured = status == "ok"
        rows.append(roofline.roofline_row(
            _num(tflops) if measured else None, _num(gbps) if measured else None, _num(intensity),
            roofline.peak_tflops(run_peaks, dtype), roofline.peak_gbps(run_peaks),
        ))
    extra = pd.DataFrame(rows, index=frame.index)
    return pd.concat([frame.drop(columns=[c for c in extra.columns if c in frame.columns]), extra], axis=1)


def _num(value: Any) -> float | None:
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
    return ~frame["family"].isin(NON_CORE_FAMILIES) & (frame["backend"] != PROJECTIONS)


def agreeing_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Attention-core rows that were measured and agree with the float64 reference: the only rows that may win."""
    return frame[(frame["status"] == "ok") & frame["agree_ok"] & is_core(frame)]


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
    return " ".join(parts)


def _groups(frame: pd.DataFrame, keys: list[str]):
    """groupby that keeps None/NaN keys (window) and yields (dict key, sub-frame)."""
    if frame.empty:
        return
    for values, sub in frame.groupby(keys, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        yield {k: (None if (isinstance(v, float) and math.isnan(v)) else v) for k, v in zip(keys, values)}, sub


# -- power-law fits ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    """y ∝ x^exponent on log-log axes, with R²; exponent None (and a note) when it cannot be fitted."""

    exponent: float | None
    r2: float | None
    n: int
    prefactor: float | None = None
    note: str = ""


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> Fit:
    """Least-squares line through (log x, log y): needs ≥ 3 distinct positive x with positive y."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y) if _num(a) and _num(b) and float(a) > 0 and float(b) > 0]
    n = len(pairs)
    distinct = len({a for a, _ in pairs})
    if distinct < MIN_FIT_POINTS:
        return Fit(None, None, n, note=f"needs ≥ {MIN_FIT_POINTS} points with distinct S, has {distinct}")
    lx = np.log([a for a, _ in pairs])
    ly = np.log([b for _, b in pairs])
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (slope * lx + intercept)
    total = ly - ly.mean()
    ss_tot = float((total**2).sum())
    r2 = 1.0 - float((residual**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return Fit(float(slope), r2, n, float(math.exp(intercept)))


def scaling_fits(frame: pd.DataFrame) -> pd.DataFrame:
    """Per backend and fixed parameters: latency ∝ S^β and peak memory ∝ S^α over the measured rows, with R²."""
    rows = ok_rows(frame)
    keys = ["backend", *group_key_columns(rows)]
    out = []
    for key, sub in _groups(rows, keys):
        sub = sub.sort_values("S")
        lat = fit_power_law(sub["S"], sub["latency_ms_median"])
        mem = fit_power_law(sub["S"], sub["peak_mem_bytes"])
        out.append({
            **key, "group": describe_group(key), "S_values": ",".join(str(int(s)) for s in sorted(set(sub["S"]))),
            "beta_latency": lat.exponent, "r2_latency": lat.r2, "n_latency": lat.n, "note_latency": lat.note,
            "alpha_memory": mem.exponent, "r2_memory": mem.r2, "n_memory": mem.n, "note_memory": mem.note,
        })
    return pd.DataFrame(out)


# -- memory against its model ------------------------------------------------------------------
def memory_model(backend: str, family: str | None, B: int, H: int, S_q: int, S_kv: int, d_v: int, itemsize: int) -> tuple[float, str]:
    """The analytic peak of one call (bytes) and the model's name.

    Materialising backends (naive, the SDPA math kernel): the scores and the probabilities,
    `2·B·H·S_q·S_kv` elements of the case dtype (the naive backend computes in that dtype).
    Fused kernels: `O(B·H·S·d)`, taken as the output `B·H·S_q·d_v` they must allocate.
    """
    if backend in MATERIALIZING_BACKENDS or (family or "") in MATERIALIZING_FAMILIES:
        return float(2 * B * H * S_q * S_kv * itemsize), "2·B·H·S_q·S_kv (scores + weights)"
    return float(B * H * S_q * d_v * itemsize), "B·H·S_q·d_v (output; O(B·H·S·d))"


def memory_vs_model(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured peak beside the analytic one, with their ratio, for every measured attention row (fwd)."""
    from harness.suite.inputs import torch_dtype

    rows = ok_rows(frame)
    rows = rows[is_core(rows) & (rows["mode"] == "fwd")]
    out = []
    for _, r in rows.iterrows():
        model, name = memory_model(r["backend"], r.get("family"), int(r["B"]), int(r["H"]), int(r["S_q"]), int(r["S_kv"]), int(r["d_v"]), torch_dtype(str(r["dtype"])).itemsize)
        peak = _num(r["peak_mem_bytes"])
        out.append({
            "case_id": r["case_id"], "backend": r["backend"], "S": int(r["S"]), "group": describe_group(r),
            "peak_mem_bytes": peak, "model_bytes": model, "model": name,
            # A zero reading is below the meter's resolution (CPU RSS grows by pages), not a free call.
            "ratio": peak / model if peak and model > 0 else None,
        })
    return pd.DataFrame(out)


# -- the S² crossover ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Crossing:
    """Where a rising curve (the core) overtakes another (the projections) over a sweep of S.

    `s_star` is set only when the curves cross inside the sweep; otherwise `bound` is `<` (the core
    is already slower at the smallest S) or `>` (it never catches up) and `limit` is that S.
    """

    s_star: float | None
    bound: str | None
    limit: int | None
    crossings: int
    note: str = ""

    def text(self) -> str:
        """`1234`, `> 2048` or `< 64`."""
        if self.s_star is not None:
            return f"{self.s_star:,.0f}"
        if self.bound is not None:
            return f"{self.bound} {self.limit:,}"
        return "n/a"

    def over(self, D: int) -> str:
        """S*/D as text, a bound when S* is one."""
        if self.s_star is not None:
            return f"{self.s_star / D:.2f}"
        if self.bound is not None and self.limit is not None:
            return f"{self.bound} {self.limit / D:.2f}"
        return "n/a"


def find_crossing(S: Sequence[float], t_core: Sequence[float], t_proj: Sequence[float]) -> Crossing:
    """The S at which t_core overtakes t_proj, interpolated on log-log axes between the two bracketing points.

    Between S_i (core below) and S_{i+1} (core at or above), log t is taken as linear in log S for
    both curves, so the ratio r = t_core/t_proj crosses 1 at
    log S* = log S_i + (0 − log r_i)·(log S_{i+1} − log S_i)/(log r_{i+1} − log r_i).
    When the curves cross more than once (noise near the crossing) the last upward crossing is
    reported, the one after which the core stays above within the sweep, and the count is noted.
    """
    points = sorted((float(s), float(c), float(p)) for s, c, p in zip(S, t_core, t_proj) if _num(s) and _num(c) and _num(p) and c > 0 and p > 0)
    if len(points) < 2:
        return Crossing(None, None, None, 0, note=f"needs ≥ 2 values of S measured for both curves, has {len(points)}")
    log_s = [math.log(s) for s, _, _ in points]
    log_r = [math.log(c / p) for _, c, p in points]
    ups = [i for i in range(len(points) - 1) if log_r[i] < 0 <= log_r[i + 1]]
    downs = [i for i in range(len(points) - 1) if log_r[i] >= 0 > log_r[i + 1]]
    crossings = len(ups) + len(downs)
    if log_r[-1] < 0:
        note = "core stays below the projections over the whole sweep" if not ups else "core overtook, then fell back below by the largest S"
        return Crossing(None, ">", int(points[-1][0]), crossings, note)
    if not ups:
        return Crossing(None, "<", int(points[0][0]), crossings, "core already slower than the projections at the smallest S")
    i = ups[-1]
    frac = (0.0 - log_r[i]) / (log_r[i + 1] - log_r[i])
    s_star = math.exp(log_s[i] + frac * (log_s[i + 1] - log_s[i]))
    note = f"curves cross {crossings} times; the last upward crossing is reported" if crossings > 1 else ""
    return Crossing(s_star, None, None, crossings, note)


def crossovers(frame: pd.DataFrame) -> pd.DataFrame:
    """S* per attention backend, model width D and fixed parameters, beside the FLOP model's 2D and the rule S ≈ D."""
    from harness.measure.theory import model_crossover

    rows = ok_rows(frame)
    proj = rows[rows["backend"] == PROJECTIONS]
    # Core rows that disagree with the reference are not attention worth timing; unchecked ones are kept.
    core = rows[is_core(rows) & (rows["agree"].map(lambda a: a is not False and a != 0))]
    if proj.empty or core.empty:
        return pd.DataFrame()
    keys = group_key_columns(rows)
    out = []
    proj_groups = {tuple(k.values()): sub for k, sub in _groups(proj, keys)}
    for key, sub in _groups(core, ["backend", *keys]):
        pkey = tuple(v for k, v in key.items() if k != "backend")
        psub = proj_groups.get(pkey)
        if psub is None:
            continue
        merged = sub[["S", "latency_ms_median"]].merge(psub[["S", "latency_ms_median"]], on="S", suffixes=("_core", "_proj"))
        if merged.empty:
            continue
        crossing = find_crossing(merged["S"], merged["latency_ms_median_core"], merged["latency_ms_median_proj"])
        D = int(key["H"]) * int(key["d_k"])
        out.append({
            "backend": key["backend"], "D": D, **{k: v for k, v in key.items() if k != "backend"}, "group": describe_group(key),
            "S_star": crossing.s_star, "S_star_text": crossing.text(), "S_star_over_D": crossing.over(D),
            "bound": crossing.bound, "model_S_star": model_crossover(D), "rule_of_thumb_S": D,
            "S_min": int(merged["S"].min()), "S_max": int(merged["S"].max()), "points": len(merged),
            "crossings": crossing.crossings, "note": crossing.note,
        })
    return pd.DataFrame(out)


# -- winners -------------------------------------------------------------------------------------
def winners(frame: pd.DataFrame, baseline: str = DEFAULT_BASELINE) -> pd.DataFrame:
    """Per case, the fastest agreeing backend, its margin over the runner-up and its speedup over `baseline`."""
    rows = agreeing_rows(frame)
    out = []
    for case_id, sub in rows.groupby("case_id", sort=False):
        sub = sub.sort_values("latency_ms_median")
        best = sub.iloc[0]
        second = sub.iloc[1] if len(sub) > 1 else None
        base = sub[sub["backend"] == baseline]
        base_ms = float(base["latency_ms_median"].iloc[0]) if not base.empty else None
        out.append({
            "case_id": case_id, **{k: best[k] for k in ("B", "S_q", "S_kv", "S", "H", "H_kv", "d_k", "dtype", "causal", "mode")},
            "winner": best["backend"], "winner_ms": float(best["latency_ms_median"]),
            "runner_up": second["backend"] if second is not None else None,
            "runner_up_ms": float(second["latency_ms_median"]) if second is not None else None,
            "margin_pct": 100.0 * (float(second["latency_ms_median"]) / float(best["latency_ms_median"]) - 1.0) if second is not None else None,
            "within_noise": bool(second is not None and float(second["latency_ms_p20"]) <= float(best["latency_ms_p80"])),
            "candidates": len(sub), "baseline": baseline, "baseline_ms": base_ms,
            "speedup_vs_baseline": base_ms / float(best["latency_ms_median"]) if base_ms else None,
        })
    return pd.DataFrame(out)


def speedups(frame: pd.DataFrame, baseline: str = DEFAULT_BASELINE) -> pd.DataFrame:
    """Cases × backends: baseline median ÷ backend median (agreeing rows only; > 1 is faster than the baseline)."""
    rows = agreeing_rows(frame)
    base = rows[rows["backend"] == baseline].set_index("case_id")["latency_ms_median"]
    if base.empty:
        return pd.DataFrame()
    rows = rows[rows["case_id"].isin(base.index)]
    table = rows.pivot_table(index="case_id", columns="backend", values="latency_ms_median", aggfunc="first")
    return table.rdiv(base, axis=0).reindex(base.index)


def winner_map(frame: pd.DataFrame, axis: str, dtype: str) -> pd.DataFrame:
    """S × `axis` (B or H_kv) for one dtype: per cell, the backend that wins the most cases, and how many of them.

    Only square cases (S_q = S_kv); the other parameters vary inside a cell, which is why the
    count is shown (`won`/`cases`); ties go to the lower geometric-mean time of the tied winners.
    """
    wins = winners(frame)
    if wins.empty:
        return pd.DataFrame()
    wins = wins[(wins["dtype"] == dtype) & (wins["S_q"] == wins["S_kv"])]
    out = []
    for (s, a), sub in wins.groupby(["S", axis], sort=True):
        counts = sub["winner"].value_counts()
        top = counts[counts == counts.max()].index.tolist()
        if len(top) > 1:
            geo = {b: float(np.exp(np.log(sub.loc[sub["winner"] == b, "winner_ms"]).mean())) for b in top}
            top = [min(geo, key=geo.get)]
        out.append({"S": int(s), axis: int(a), "winner": top[0], "won": int(counts[top[0]]), "cases": len(sub)})
    return pd.DataFrame(out)


# -- model presets and recommend --------------------------------------------------------------
#: Attention shapes of published models (H, H_kv, d_k, and the sliding window where there is one).
#: Used only when `harness.suite.presets` (the presets of `attnbench run --model`) is not there.
MODEL_SHAPES: dict[str, dict[str, int | None]] = {
    "transformer-base": {"H": 8, "H_kv": 8, "d_k": 64},
    "gpt2-xl": {"H": 25, "H_kv": 25, "d_k": 64},
    "gpt3-175b": {"H": 96, "H_kv": 96, "d_k": 128},
    "llama2-7b": {"H": 32, "H_kv": 32, "d_k": 128},
    "llama2-70b": {"H": 64, "H_kv": 8, "d_k": 128},
    "llama3-8b": {"H": 32, "H_kv": 8, "d_k": 128},
    "llama3-70b": {"H": 64, "H_kv": 8, "d_k": 128},
    "llama3-405b": {"H": 128, "H_kv": 8, "d_k": 128},
    "mistral-7b": {"H": 32, "H_kv": 8, "d_k": 128, "window": 4096},
}


def _shape_from(entry: Any) -> dict[str, Any] | None:
    get = entry.get if isinstance(entry, Mapping) else (lambda k, d=None: getattr(entry, k, d))
    H, d_k = get("H"), get("d_k")
    if H is None or d_k is None:
        return None
    return {"H": int(H), "H_kv": int(get("H_kv", H) or H), "d_k": int(d_k), "window": get("window")}


def model_shape(name: str) -> dict[str, Any]:
    """H, H_kv, d_k (and window) of a model preset: from `harness.suite.presets` when it exists, else MODEL_SHAPES."""
    key = name.strip().lower()
    try:
        models = importlib.import_module("harness.suite.presets")
    except ImportError:
        models = None
    known: list[str] = []
    if models is not None:
        for attr in ("MODELS", "PRESETS"):
            table = getattr(models, attr, None)
            if isinstance(table, Mapping):
                known.extend(str(k) for k in table)
                for k, entry in table.items():
                    if str(k).lower() == key and (shape := _shape_from(entry)) is not None:
                        return shape
    if key in MODEL_SHAPES:
        return {"window": None, **MODEL_SHAPES[key]}
    names = sorted(set(known) | set(MODEL_SHAPES))
    raise UserError(f"unknown model {name!r}: known models are {', '.join(names)}")


@dataclass
class Recommendation:
    """The answer for one measured case: the winner, the runner-up, and the rows it is based on."""

    case_id: str
    winner: str | None
    winner_ms: float | None
    runner_up: str | None
    runner_up_ms: float | None
    margin_pct: float | None
    rows: pd.DataFrame
    #: True when the winner's and the runner-up's p20–p80 ranges overlap: the order may be noise.
    within_noise: bool = False

    def lines(self) -> list[str]:
        """The human answer, then one line per row it used."""
        if self.winner is None:
            head = f"{self.case_id}: no backend ran and agreed with the reference; nothing to recommend"
        elif self.runner_up is None:
            head = f"{self.case_id}: {self.winner} ({self.winner_ms:.4g} ms), the only backend that ran and agreed"
        else:
            head = (f"{self.case_id}: {self.winner} ({self.winner_ms:.4g} ms), {self.margin_pct:.1f}% faster than "
                    f"the runner-up {self.runner_up} ({self.runner_up_ms:.4g} ms)")
            if self.within_noise:
                head += "; within noise (their p20–p80 ranges overlap): either is a fair choice"
        out = [head, "  based on these rows:"]
        for _, r in self.rows.sort_values("latency_ms_median", na_position="last").iterrows():
            if r["status"] == "ok":
                agree = "agrees" if r["agree_ok"] else ("not checked" if r["agree"] is None else "DISAGREES (excluded)")
                out.append(f"    {r['backend']:<16} {r['latency_ms_median']:>10.4g} ms  p20–p80 {r['latency_ms_p20']:.4g}–{r['latency_ms_p80']:.4g}  {agree}")
            else:
                out.append(f"    {r['backend']:<16} {r['status']}: {r['reason']}")
        return out


def recommend(frame: pd.DataFrame, query: Mapping[str, Any]) -> list[Recommendation]:
    """Answer from measured rows for the cases matching `query` (fields: B, S, H, H_kv, d_k, dtype, causal, window).

    Unspecified fields match anything; `S` means S_q = S_kv = S. Raises UserError naming the
    measured values when the run holds no case of that shape: it never interpolates or guesses.
    """
    rows = frame[is_core(frame)]
    for name, value in query.items():
        if value is None:
            continue
        if name == "S":
            match = (rows["S_q"] == value) & (rows["S_kv"] == value)
        elif name == "window":
            match = rows["window"].map(lambda w: w is not None and w == w and int(w) == int(value))
        else:
            match = rows[name] == value
        if not match.any():
            column = rows["S_kv"] if name == "S" else rows[name]
            seen = [str(v) for v in sorted(column.dropna().unique(), key=lambda v: (not isinstance(v, (int, np.integer)), v if isinstance(v, (int, np.integer)) else str(v)))]
            given = ", ".join(f"{k}={v}" for k, v in query.items() if v is not None)
            raise UserError(f"the run measured no case with {given}: {name} was measured at {', '.join(seen) or 'nothing'} only; run a suite with that shape first")
        rows = rows[match]
    out = []
    for case_id, sub in rows.groupby("case_id", sort=True):
        good = sub[(sub["status"] == "ok") & sub["agree_ok"]].sort_values("latency_ms_median")
        best = good.iloc[0] if len(good) else None
        second = good.iloc[1] if len(good) > 1 else None
        out.append(Recommendation(
            case_id, best["backend"] if best is not None else None, float(best["latency_ms_median"]) if best is not None else None,
            second["backend"] if second is not None else None, float(second["latency_ms_median"]) if second is not None else None,
            100.0 * (float(second["latency_ms_median"]) / float(best["latency_ms_median"]) - 1.0) if second is not None else None,
            sub, second is not None and float(second["latency_ms_p20"]) <= float(best["latency_ms_p80"]),
        ))
    return out
