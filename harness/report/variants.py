"""The report's Score variants section: what softcap, sinks and ALiBi cost each backend at the same shape (`harness.analysis.variants`)."""

from __future__ import annotations

import pandas as pd

from harness.analysis.variants import variant_costs
from harness.report.page import fmt
from harness.report.writer import Csv, Section, Table


def variants_section(frame: pd.DataFrame, cv: float = 0.0) -> Section | None:
    """The section, or None when the run has no case with a variant beside its plain twin."""
    costs = variant_costs(frame, cv)
    if costs.empty:
        return None
    body = ["<p>Each row: one backend's case with a score variant (logit softcap, attention sinks, ALiBi) against the same backend's "
            "case without it, both measured, agreeing with the float64 reference and neither contended nor suspect. <em>ratio</em> is the "
            "time with the variant over the time without; <em>differs</em> is the rule of the backend-choice table. A backend that cannot "
            "compute a variant exactly is unsupported for it (its reason is in Failures), never shown here with an approximation.</p>"]
    summary = costs.groupby(["variant", "backend"], sort=True)["ratio"].agg(["count", "median", "min", "max"]).reset_index()
    body += [f"<h3>Per variant and backend ({len(summary)})</h3>", Csv(summary, "variant_cost_summary.csv"),
             Table(summary, headers=["variant", "backend", "cases", "median ratio", "min", "max"], scroll=False),
             "<h3>Every pair</h3>", Csv(costs, "variant_costs.csv"),
             Table(costs, columns=["variant", "value", "backend", "group", "with_ms", "without_ms", "ratio", "differs"],
                   headers=["variant", "value", "backend", "fixed parameters", "with (ms)", "without (ms)", "ratio", "differs"],
                   formats={"ratio": lambda v, r: (f"{fmt(v)}×", "" if r["differs"] else "muted")})]
    return Section("variants", "Score variants: what softcap, sinks and ALiBi cost", body, nav="Variants")


def models_section(frame: pd.DataFrame, wins: pd.DataFrame) -> Section | None:
    """The winner per published model and TP degree, or None when no measured case is a layer of a preset."""
    from harness.analysis.models import model_winners

    table = model_winners(frame, wins)
    if table.empty:
        return None
    body = ["<p>Which backend to choose for a published model's attention on one GPU of tensor parallel degree TP: each model "
            "(harness/suite/presets.py, with its source) is sharded at TP 1, 2, 4 and 8 (H/TP query heads, H_kv/TP KV heads or one "
            "replicated), and a measured case counts for every model and TP whose layers have its shape at any S; models that share "
            "a shape share its cases. <em>won</em> of <em>cases</em>: how many of the model's measured cases the backend won, among "
            "rows that agree and are neither contended nor suspect.</p>",
            Csv(table, "model_winners.csv"),
            Table(table, headers=["model", "TP", "phase", "winner", "won", "cases"], scroll=False)]
    return Section("models", "The backend to choose per model and TP degree", body, nav="Models")
