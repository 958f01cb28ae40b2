"""The report's Score variants section: what softcap, sinks and ALiBi cost each backend at the same shape (`harness.analysis.variants`)."""

from __future__ import annotations

import pandas as pd

from harness.analysis.frame import is_core
from harness.analysis.variants import VARIANTS, holds_value, variant_costs
from harness.analysis.winners import no_winner_reason
from harness.report.page import esc, fmt
from harness.report.writer import Csv, Section, Table

TITLE = "Score variants: what softcap, sinks and ALiBi cost"


def variants_section(frame: pd.DataFrame, cv: float = 0.0) -> Section | None:
    """The section, or None when the run has no case with a score variant; without a pair to compare, it says why in its place."""
    core = frame[is_core(frame)]
    present = [name for name in VARIANTS if name in core.columns]
    if not any(core[name].map(holds_value).any() for name in present):
        return None
    costs = variant_costs(frame, cv)
    body = ["<p>Each row: one backend's case with a score variant (logit softcap, attention sinks, ALiBi) against the same backend's "
            "case without it, both measured, agreeing with the float64 reference and neither contended nor suspect. <em>ratio</em> is the "
            "time with the variant over the time without; <em>differs</em> is the rule of the backend-choice table. A backend that cannot "
            "compute a variant exactly is unsupported for it (its reason is in Failures), never shown here with an approximation.</p>"]
    if costs.empty:
        with_variant = core[pd.concat([core[name].map(holds_value) for name in present], axis=1).any(axis=1)]
        why = (no_winner_reason(with_variant) or no_winner_reason(core[~core.index.isin(with_variant.index)])
               or "no backend has both a case with a variant and its plain twin among its rows that ran, agree and carry no flag")
        body.append(f'<div class="warn">No variant\'s cost can be told from this run: {esc(why)}.</div>')
        return Section("variants", TITLE, body, nav="Variants")
    summary = costs.groupby(["variant", "backend"], sort=True)["ratio"].agg(["count", "median", "min", "max"]).reset_index()
    body += [f"<h3>Per variant and backend ({len(summary)})</h3>", Csv(summary, "variant_cost_summary.csv"),
             Table(summary, headers=["variant", "backend", "cases", "median ratio", "min", "max"], scroll=False),
             "<h3>Every pair</h3>", Csv(costs, "variant_costs.csv"),
             Table(costs, columns=["variant", "value", "backend", "group", "with_ms", "without_ms", "ratio", "differs"],
                   headers=["variant", "value", "backend", "fixed parameters", "with (ms)", "without (ms)", "ratio", "differs"],
                   formats={"ratio": lambda v, r: (f"{fmt(v)}×", "" if r["differs"] else "muted")})]
    return Section("variants", TITLE, body, nav="Variants")


def models_section(frame: pd.DataFrame, wins: pd.DataFrame) -> Section | None:
    """The winner per published model, TP degree and layer kind, or None when no measured case is a layer of a preset."""
    from harness.analysis.models import model_rows, model_winners

    table = model_winners(frame, wins)
    if table.empty and model_rows(frame).empty:
        return None
    body = ["<p>Which backend to choose for a published model's attention on one GPU of tensor parallel degree TP: each model "
            "(harness/suite/presets.py, with its source; <code>attnbench models</code> lists them) is sharded at TP 1, 2, 4 and 8 "
            "(H/TP query heads, H_kv/TP KV heads or one replicated), and a measured case counts for every model, TP and layer kind "
            "whose layers have its shape (heads, window, softcap, sinks, scale, MLA) at any S; models that share a shape share its "
            "cases. <em>won</em> of <em>cases</em>: how many of the layer kind's measured cases the backend won, among rows that agree "
            "and are neither contended nor suspect, and only of the cases where another backend ran too: a case one backend alone "
            "could run is counted as <em>only candidate</em>, never as a win.</p>"]
    if table.empty:
        why = no_winner_reason(model_rows(frame[is_core(frame)])) or "no case of a model's layers has a winner"
        body.append(f'<div class="warn">No model layer has a winner in this run: {esc(why)}.</div>')
        return Section("models", "The backend to choose per model and TP degree", body, nav="Models")
    body += [Csv(table, "model_winners.csv"),
             Table(table, columns=["model", "tp", "layer_kind", "phase", "winner", "won", "cases", "runner_up", "only_candidate", "note"],
                   headers=["model", "TP", "layer kind", "phase", "winner", "won", "cases with a runner-up", "most frequent runner-up",
                            "only-candidate cases", "note"], scroll=False)]
    return Section("models", "The backend to choose per model and TP degree", body, nav="Models")
