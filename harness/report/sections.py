"""The report's sections, as data: each returns a `Section` of prose, tables, figures and CSVs for the writer.

Prose is markup built here with `esc`; tables and figures stay data until `harness.report.writer` renders
them, and every CSV a section names is written by the writer alone.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness import analysis
from harness.env import FINGERPRINT_KEYS
from harness.analysis.difference import RULE_TEXT, Variation
from harness.analysis.winners import no_winner_reason, unanswered_cases, wins_per_backend
from harness.results.documents import CAPABILITIES
from harness.report import figures as figs
from harness.report.flags import emulated_bf16_note, flag_summary, flags_section, trust_summary
from harness.report.page import commands, esc, fmt
from harness.report.policy import policy_section
from harness.report.profiling import profiling_section
from harness.report.repeats import repeats_section
from harness.report.published import published_section
from harness.report.roofline import roofline_section
from harness.report.variants import models_section, variants_section
from harness.report.determinism import determinism_section
from harness.report.runtime import runtime_section
from harness.report.serving import serving_sections
from harness.report.state_energy import state_energy_section, state_summary
from harness.report.telemetry import telemetry_html
from harness.report.writer import Csv, Section, Table


def rows_per_node(frame: pd.DataFrame) -> str | None:
    """How many rows each Ray node gave (`10.0.0.1: 12 rows, 10.0.0.2: 6 rows`); None for rows that name no node (a local run)."""
    if "node" not in frame.columns:
        return None
    counts = frame["node"].dropna().astype(str).value_counts()
    if counts.empty:
        return None
    local = int(frame["node"].isna().sum())
    parts = [f"{node}: {n} row{'s' if n != 1 else ''}" for node, n in sorted(counts.items())]
    return ", ".join(parts + ([f"this machine (no node): {local} row{'s' if local != 1 else ''}"] if local else []))


def _overview(data: analysis.RunData, ok: pd.DataFrame, wins: pd.DataFrame, baseline: str) -> Section:
    frame = data.frame
    counts = frame["status"].value_counts()
    cards = [
        ("runs", ", ".join(data.dirs)),
        ("suite", ", ".join(sorted({str(m.get("suite", "?")) for m in data.manifests.values()}))),
        ("device", ", ".join(sorted({str(e.get("before", {}).get("device_name") or e.get("before", {}).get("device_type") or "?") for e in data.env.values()}))),
        ("rows", f"{len(frame)} ({', '.join(f'{n} {s}' for s, n in counts.items())})"),
        ("cases", str(frame["case_id"].nunique())),
        ("backends", ", ".join(sorted(frame["backend"].dropna().unique()))),
    ]
    nodes = rows_per_node(frame)
    if nodes:
        cards.insert(4, ("rows per node", nodes))
    body = [f'<p class="muted">generated {esc(datetime.now(timezone.utc).isoformat(timespec="seconds"))} from the measured rows of the runs below; '
            "every number here is recomputed from records.jsonl.</p>"]
    body.append("".join(f'<div class="card">{esc(k)}<b>{esc(v)}</b></div>' for k, v in cards))
    warnings = list(data.notes)
    impossible = ok[ok["impossible"].fillna(False).astype(bool)]
    if len(impossible):
        beaten = "; ".join(sorted(set(impossible["impossible_ceiling"].dropna()))) if "impossible_ceiling" in impossible else ""
        warnings.append(f"{len(impossible)} measured rows are above the best ceiling this run measured ({beaten}), even at the top of their "
                        "95 % intervals: they are impossible, so the FLOP or byte count is wrong or the ceiling measurement was disturbed. "
                        "They are flagged in the roofline table and are not wins.")
    above_busy = ok[ok["above_contended_ceiling"].fillna(False).astype(bool)] if "above_contended_ceiling" in ok.columns else ok.iloc[0:0]
    if len(above_busy):
        warnings.append(f"{len(above_busy)} measured rows are above a ceiling that was measured while the machine was contended: that "
                        "ceiling bounds nothing, so their % of peak is not known (re-run on a quiet machine to measure the peaks).")
    missing = [rid for rid, p in data.peaks.items() if not p or not p.get("matmul")]
    if missing:
        warnings.append(f"no measured peaks for {', '.join(missing)}: % of peak and the bound are left empty.")
    for note in (trust_summary(frame, wins), flag_summary(frame), emulated_bf16_note(frame, data.env)):
        if note:
            warnings.append(note)
    throttled = state_summary(frame)
    if throttled:
        warnings.append(throttled)
    if len(data.dirs) > 1:
        from harness.analysis.compare import environment_differences

        envs = list(data.env.items())
        for rid, env in envs[1:]:
            for diff in environment_differences(envs[0][1], env):
                warnings.append(f"{envs[0][0]} and {rid} differ: {diff}")
    body.extend(f'<div class="warn">{esc(w)}</div>' for w in warnings)
    body.append("<h3>Wins per backend (cases where it was fastest among at least two rows that agree; a case it alone ran is "
                "counted apart, as only candidate, never as a win)</h3>")
    if wins.empty:
        body.append(f'<p class="muted">No backend won a case: {esc(no_winner_reason(frame[analysis.is_core(frame)]))}.</p>')
    else:
        body.append(Table(wins_per_backend(wins), scroll=False))
    return Section("overview", "Overview", body, nav="Overview")


def _ratio_cell(value: Any, row: Any) -> tuple[str, str]:
    if value is None or value != value:
        return "", ""
    return (f"{fmt(value)}× (within noise)", "bad") if row["within_noise"] else (f"{fmt(value)}×", "")


def _winner_cell(value: Any, row: Any) -> tuple[str, str]:
    """A winner, or 'only candidate: X' where no other backend ran and agreed (never a win)."""
    return (f"only candidate: {value}", "bad") if row["only_candidate"] else (str(value), "")


def _unanswered(frame: pd.DataFrame, wins: pd.DataFrame) -> list:
    """The cases with no winner, each with why (`no_winner_reason`): nothing supported, no row agreed, or every agreeing row flagged."""
    rows = unanswered_cases(frame, wins)
    if rows.empty:
        return []
    return [f"<h3>Cases with no answer ({len(rows)})</h3>", Table(rows, headers=["case", "why there is no answer"])]


def _non_core(frame: pd.DataFrame) -> list[str]:
    return sorted(set(frame.loc[~frame["attention_core"].astype(bool), "backend"]))


def _choose(frame, wins, speed, baseline, colors, variation) -> Section:
    body = [f"<p>For each case, the fastest backend among rows with status <code>ok</code> that agree with the float64 reference; "
            f"rows that were contended or suspect are shown elsewhere but never chosen (left out, counted per case); "
            f"the runner-up's time is given as a multiple of the winner's, marked within noise unless {esc(RULE_TEXT)} "
            f"({esc(variation.describe() if variation else 'no variation given: report --variation FILE')}); speedups are against <code>{esc(baseline)}</code>. "
            f"Backends that declare they time another problem ({esc(', '.join(_non_core(frame)) or 'none in this run')}: the whole layer, "
            "the projections alone, MLA) are not ranked against the attention cores.</p>"]
    if wins.empty:
        body.append(f'<div class="warn">No winner in any case: {esc(no_winner_reason(frame[analysis.is_core(frame)]))}.</div>')
        body.extend(_unanswered(frame, wins))
        return Section("choose", "The backend to choose", body, nav="Backend to choose")
    body.append(Csv(wins, "winners.csv"))
    runs = ["winner_run"] if len(set(wins["winner_run"].dropna())) > 1 else []  # which run a row came from, where there are several
    body.append(Table(wins, columns=["case", "winner", "winner_ms", "runner_up", "runner_up_ms", "runner_up_ratio", "candidates", "left_out",
                                     "faster_left_out", "speedup_vs_baseline", *runs],
                      headers=["case", "winner", "winner ms", "runner-up", "runner-up ms", "runner-up ÷ winner", "agreeing backends",
                               "left out (flagged)", "faster, but left out", f"speedup vs {baseline}", *(["winner's run"] if runs else [])],
                      formats={"runner_up_ratio": _ratio_cell, "winner": _winner_cell}))
    body.extend(_unanswered(frame, wins))
    body.append(commands("The command that re-measures each winner alone (run it from the checkout's root)",
                         [(f"{r.case}: {r.winner}", r.winner_repro) for r in wins.itertuples()]))
    if not speed.empty:
        body.append(Csv(speed, "speedup_vs_baseline.csv", index=True))
        body.append(f"<h3>Speedup against {esc(baseline)} (baseline time ÷ backend time; above 1 is faster)</h3>")
        body.append(Table(speed, index=True))
    else:
        body.append(f'<p class="muted">The baseline {esc(baseline)} has no agreeing row in this run: no speedups (choose another with --baseline).</p>')
    for f in figs.winner_map_figures(frame, colors, wins):
        body.append(f)
    return Section("choose", "The backend to choose", body, nav="Backend to choose")


def _latency(frame, ok, colors) -> Section:
    body = []
    for f in figs.latency_figures(frame, colors):
        body.append(f)
    if not ok.empty:
        pivot = ok.pivot_table(index="case", columns="backend", values="latency_ms_median", aggfunc="first")
        pivot = pivot.reindex(list(dict.fromkeys(ok["case"])))
        body.append(Csv(pivot, "latency_ms.csv", index=True))
        body.append("<h3>Median latency (ms), case × backend</h3>")
        body.append(Table(pivot, index=True))
        chosen = _sdpa_choices(ok)
        if not chosen.empty:
            body.append("<h3>The kernel SDPA's dispatcher chose (backend <code>sdpa</code>)</h3>")
            body.append(Csv(chosen, "sdpa_kernel.csv"))
            body.append(Table(chosen.groupby("sdpa_kernel").agg(cases=("case_id", "count"), example=("case_id", "first")).reset_index(),
                              headers=["kernel", "cases", "example case"], scroll=False))
    else:
        body.append('<p class="muted">No measured rows.</p>')
    return Section("latency", "Latency", body, nav="Latency")


def _sdpa_choices(ok: pd.DataFrame) -> pd.DataFrame:
    """Per case, the kernel torch's dispatcher picked for the `sdpa` backend (from the row's notes)."""
    rows = ok[ok["backend"] == "sdpa"]
    kernels = rows["notes"].map(lambda n: n.get("sdpa_kernel") if isinstance(n, dict) else None)
    return pd.DataFrame({"case_id": rows["case_id"], "sdpa_kernel": kernels})[kernels.notna()]


def _crossover(frame, cross, colors) -> Section:
    body = ["<p>The attention core (scores, softmax, weighted sum) against the layer's projections (Q, K, V and output, "
            "<code>2·B·S·D²·(2 + 2·H_kv/H)</code> FLOPs): by FLOPs the core (<code>4·B·S²·D</code>, half of it causal) overtakes at "
            "<code>S* = D·(1 + H_kv/H)</code>, twice that causal (<code>2D</code> for MHA); "
            "the measured <code>S*</code> is where its median time overtakes the projections', interpolated on log-log axes "
            "between the two sweep points that bracket it. Outside the sweep it is a bound, never an extrapolation.</p>"]
    if cross.empty:
        body.append('<p class="muted">This run has no pair of projections and attention-core rows on the same cases: run '
                    "<code>attnbench run --suite crossover</code> (or any suite that includes the <code>projections</code> backend).</p>")
        return Section("crossover", "The S² crossover against D", body, nav="Crossover S*")
    body.append(Csv(cross, "crossover.csv"))
    shown = cross.sort_values(["D", "group", "backend"])
    body.append(Table(shown, columns=["backend", "D", "group", "S_star_text", "S_star_over_D", "model_S_star", "rule_of_thumb_S", "S_min", "S_max", "note"],
                      headers=["backend", "D", "fixed parameters", "measured S*", "S*/D", "model S* (FLOPs)", "rule of thumb S ≈ D", "S from", "S to", "note"],
                      formats={"S_star_text": lambda v, r: (v, "good" if r["bound"] is None or r["bound"] != r["bound"] else "bad")}))
    for f in figs.crossover_figures(frame, cross, colors):
        body.append(f)
    return Section("crossover", "The S² crossover against D", body, nav="Crossover S*")


def _scaling(frame, fits) -> Section:
    body = [f"<p>Per backend with every other parameter fixed: latency ∝ S<sup>β</sup> and peak memory ∝ S<sup>α</sup>, least squares on log-log axes, "
            f"with R². A fit needs at least {analysis.MIN_FIT_POINTS} values of S; with fewer the table says so. "
            "Quadratic attention shows β → 2 at large S; materialising backends show α ≈ 2 (the S×S scores), fused kernels α ≈ 1.</p>"]
    if fits.empty:
        body.append('<p class="muted">No measured rows to fit.</p>')
        return Section("scaling", "Scaling laws", body, nav="Scaling")
    body.append(Csv(fits, "scaling.csv"))
    summary = fits.groupby("backend").agg(
        groups=("group", "count"),
        beta_fitted=("beta_latency", lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum())),
        beta_median=("beta_latency", lambda s: pd.to_numeric(s, errors="coerce").median()),
        alpha_median=("alpha_memory", lambda s: pd.to_numeric(s, errors="coerce").median()),
        alpha_fitted=("alpha_memory", lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum())),
    ).reset_index()
    body.append("<h3>Summary per backend (median over the fixed-parameter groups)</h3>")
    body.append(Table(summary, headers=["backend", "groups", "groups with a latency fit", "median β (latency)", "median α (memory)", "groups with a memory fit"], scroll=False))

    def exponent(name_exp: str, name_r2: str, name_note: str):
        def cell(value, row):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return row[name_note], "bad"
            return f"{value:.2f} (R² {row[name_r2]:.3f})", ""
        return cell

    body.append("<h3>Every fit</h3>")
    body.append(Table(fits, columns=["backend", "group", "S_values", "beta_latency", "alpha_memory"],
                      headers=["backend", "fixed parameters", "S measured", "β latency (R²)", "α memory (R²)"],
                      formats={"beta_latency": exponent("beta_latency", "r2_latency", "note_latency"),
                               "alpha_memory": exponent("alpha_memory", "r2_memory", "note_memory")}))
    return Section("scaling", "Scaling laws", body, nav="Scaling")


def _memory(frame, memory, fits, colors) -> Section:
    body = ["<p>Measured peak memory of one call beside its model: materialising backends (naive, SDPA's math kernel) hold the "
            "scores and the probabilities, <code>2·B·H·S_q·S_kv</code> elements of the case's dtype (the naive backend computes in that "
            "dtype); fused kernels need <code>O(B·H·S·d)</code>, modelled as the output they allocate. A ratio near 1 means the model "
            "explains the memory; far above it, something else is held.</p>"]
    for f in figs.memory_figures(frame, fits, colors):
        body.append(f)
    if memory.empty:
        body.append('<p class="muted">No measured rows.</p>')
        return Section("memory", "Memory against its model", body, nav="Memory")
    body.append(Csv(memory, "memory_model.csv"))
    pivot = memory.pivot_table(index="case", columns="backend", values="ratio", aggfunc="first")
    pivot = pivot.reindex(list(dict.fromkeys(memory["case"])))
    body.append(Csv(pivot, "memory_ratio.csv", index=True))
    models = memory.groupby("backend")["model"].first().reset_index()
    body.append(Table(models, headers=["backend", "model"], scroll=False))
    body.append("<h3>Measured ÷ model, case × backend</h3><p class=\"muted\">Blank: no measurement, or a reading of zero "
                "(below the meter's resolution; on the CPU the resident set grows by whole pages).</p>")
    body.append(Table(pivot, index=True))
    return Section("memory", "Memory against its model", body, nav="Memory")


def _agreement(frame, ok, colors) -> Section:
    body = ["<p>Each measured row is checked against a float64 reference computed from the same inputs; a row agrees when its "
            "largest error is within twice the eager computation's error in the same dtype plus a floor. Rows that disagree never win.</p>"]
    if ok.empty:
        body.append('<p class="muted">No measured rows.</p>')
        return Section("agreement", "Agreement with the reference", body, nav="Agreement")
    state = ok["agree"].map(lambda a: "agrees" if a is True else ("not checked" if a is None or (isinstance(a, float) and math.isnan(a)) else "disagrees"))
    counts = pd.crosstab(ok["backend"], state)
    body.append(Table(counts, index=True, scroll=False))
    for f in figs.agreement_figure(frame, colors):
        body.append(f)
    bad = ok[state == "disagrees"][["case_id", "backend", "max_abs_err", "err_bound", "rel_err"]]
    body.append(Csv(ok[["case_id", "backend", "max_abs_err", "err_bound", "rel_err", "agree"]], "agreement.csv"))
    if len(bad):
        body.append("<h3>Rows that disagree</h3>")
        body.append(Table(bad))
    return Section("agreement", "Agreement with the reference", body, nav="Agreement")


def _failures(frame) -> Section:
    rows = frame[frame["status"] != "ok"]
    if rows.empty:
        return Section("failures", "Rows that did not run", ['<p class="muted">Every pair ran.</p>'], nav="Failures")
    grouped = (rows.assign(reason=rows["reason"].fillna(""))
               .groupby(["backend", "status", "reason"], sort=True)
               .agg(rows=("case_id", "count"), example=("case_id", "first")).reset_index())
    return Section("failures", "Rows that did not run", [
        Csv(rows[["case_id", "backend", "status", "reason", "repro"]], "failures.csv"),
        "<p>Unsupported, out-of-memory, failed, crashed and timed-out pairs, with the reason each gave (identical reasons grouped).</p>",
        Table(grouped, headers=["backend", "status", "reason", "rows", "example case"]),
        commands("The command that re-runs each of these pairs alone (attach it to a bug report)",
                 [(f"{r.case_id}: {r.backend} ({r.status})", r.repro) for r in rows.itertuples()]),
    ], nav="Failures")


def _capability_matrix(run_dir: Path | None) -> str:
    """The run's capabilities.txt (what each of its backends serves, per feature and dtype, with every refusal's reason), folded."""
    path = run_dir / CAPABILITIES if run_dir is not None else None
    if path is None or path.is_symlink() or not path.is_file():  # a run from before the matrix, or a link: nothing read through it
        return ""
    return (f"<details><summary>What each backend serves (✓), refuses (✗n: reasons below its table) or has no case for (·), "
            f"per feature and dtype, as this run's harness declares it ({esc(CAPABILITIES)})</summary><pre>{esc(path.read_text())}</pre></details>")


def _environment(data: analysis.RunData) -> Section:
    body = []
    for rid, env in data.env.items():
        # The fingerprint is taken once; what changes during a run (clocks, temperatures) is the telemetry below.
        before = env.get("before") or {}
        keys = [k for k in FINGERPRINT_KEYS if k in before] + sorted(k for k in before if k not in FINGERPRINT_KEYS)
        rows = pd.DataFrame([{"field": k, "value": json.dumps(before.get(k)) if isinstance(before.get(k), (dict, list)) else before.get(k)}
                             for k in keys])
        body.append(f"<h3>{esc(rid)}</h3>")
        body.append(Table(rows, scroll=False) if not rows.empty else '<p class="muted">no env.json in this run</p>')
        body.append(telemetry_html(env.get("telemetry_before"), env.get("telemetry_after")))
        manifest = data.manifests.get(rid) or {}
        if manifest:
            body.append(f'<p class="muted">suite {esc(manifest.get("suite"))}, {esc(len(manifest.get("pairs", [])))} pairs, created {esc(manifest.get("created_utc"))}, '
                        f'backends {esc(", ".join(manifest.get("backends", [])))}</p>')
        body.append(_capability_matrix(data.dirs.get(rid)))
    return Section("environment", "Environment", body, nav="Environment")


def sections(data: analysis.RunData, baseline: str, variation: Variation | None = None) -> list[Section]:
    """Every section of the report, in page order, computed from the loaded runs; `variation` widens the winners' intervals."""
    frame = data.frame
    colors = figs.backend_colors(frame["backend"].dropna())
    wins = analysis.winners(frame, baseline, cv=variation.cv if variation else 0.0)
    speed = analysis.speedups(frame, baseline)
    fits = analysis.scaling_fits(frame)
    ok = analysis.ok_rows(frame)
    return [
        _overview(data, ok, wins, baseline),
        _choose(frame, wins, speed, baseline, colors, variation),
        policy_section(data, variation.cv if variation else 0.0),
        _latency(frame, ok, colors),
        *serving_sections(frame, colors, baseline),
        flags_section(frame, data.env),
        state_energy_section(frame, baseline, colors),
        roofline_section(data, ok, colors),
        _crossover(frame, analysis.crossovers(frame), colors),
        _scaling(frame, fits),
        _memory(frame, analysis.memory_vs_model(frame), fits, colors),
        profiling_section(frame),
        _agreement(frame, ok, colors),
        _failures(frame),
        runtime_section(data),
        _environment(data),
    ] + [s for s in (models_section(frame, wins), variants_section(frame, variation.cv if variation else 0.0),
                     determinism_section(frame), published_section(data), repeats_section(data.repeated)) if s is not None]
