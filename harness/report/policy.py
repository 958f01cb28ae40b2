"""The report's policy section: the backend policy of the report's runs (harness.policy), a table per device: bucket → choice, margin, evidence."""

from __future__ import annotations

import pandas as pd

from harness import analysis
from harness.policy.build import build_policy, table_rows
from harness.policy.sources import runs_of
from harness.report.page import esc
from harness.report.writer import Section, Table


def policy_section(data: analysis.RunData, cv: float = 0.0) -> Section:
    """Per device model, each shape bucket's chosen backend, its margin over the runner-up by compare's rule, its evidence, and the gaps."""
    runs = runs_of(data)
    names = " ".join(sorted({str(d) for d in data.dirs.values()}))
    body = ["<p>What <code>attnbench policy</code> writes for these runs, as a framework would load it (docs/policy.md): per shape "
            "bucket (dtype, mode, causal, score variant, head dim, H/H<sub>kv</sub>, batch layout, log2 steps of S<sub>q</sub> and "
            "S<sub>kv</sub>) the backend chosen from trusted rows only, its margin over the runner-up by the rule <code>compare</code> uses, "
            "and the rows it rests on. A bucket with no trusted answer, or a step never measured, is a gap: measure it. "
            f"Write it with <code>attnbench policy {esc(names)} --out policy.json</code>.</p>"]
    policy = build_policy(runs, cv=cv)
    if not policy["devices"]:
        body.append('<p class="muted">No attention-core row in these runs: no policy.</p>')
    for device, held in policy["devices"].items():
        rows = table_rows(held)
        body.append(f"<h3>{esc(device)}: {len(held['buckets'])} buckets answered, {len(held['gaps'])} gaps</h3>")
        if rows:
            body.append(Table(pd.DataFrame(rows)))
    return Section("policy", "The policy of these runs", body, nav="Policy")
