"""What a score variant costs: the report pairs each variant's row with the same backend's row of the same case without it."""

from __future__ import annotations

import pytest

from harness.analysis.variants import variant_costs
from harness.report import build_report
from harness.suite.cases import Case
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, write_run

PLAIN = Case(B=1, S_q=160, S_kv=160, H=16, H_kv=8, d_k=64, d_v=64, causal=True)


def _rows():
    return [synthetic_record(PLAIN, "naive", 2.0), synthetic_record(PLAIN.replace(softcap=50.0), "naive", 3.0),
            synthetic_record(PLAIN, "flex", 1.0), synthetic_record(PLAIN.replace(softcap=50.0), "flex", 1.02),
            synthetic_record(PLAIN.replace(sinks=True), "naive", 2.2),
            synthetic_record(PLAIN.replace(softcap=30.0, S_q=1), "naive", 0.5)]  # no plain twin at S_q = 1: no pair


def test_each_variant_row_is_paired_with_its_plain_twin_of_the_same_backend():
    costs = variant_costs(frame_of(_rows())).set_index(["variant", "backend"])
    assert sorted(costs.index) == [("sinks", "naive"), ("softcap", "flex"), ("softcap", "naive")]
    assert costs.loc[("softcap", "naive"), "ratio"] == 1.5 and costs.loc[("softcap", "naive"), "differs"]
    assert costs.loc[("softcap", "flex"), "ratio"] == 1.02 and not costs.loc[("softcap", "flex"), "differs"]  # ±1 % intervals overlap
    assert costs.loc[("sinks", "naive"), "ratio"] == 1.1


@pytest.mark.slow
def test_a_flagged_twin_is_no_pair_and_the_report_shows_the_section(tmp_path):
    rows = _rows()
    rows[0].contended = True  # naive's plain row ran beside other work: its softcap cost is not known
    costs = variant_costs(frame_of(rows))
    assert ("softcap", "naive") not in set(zip(costs["variant"], costs["backend"]))
    page = build_report([write_run(tmp_path / "results" / "v", _rows(), peaks=PEAKS)], out_root=tmp_path / "reports").read_text()
    assert '<section id="variants">' in page and "variant_cost_summary.csv" in page
    plain_only = build_report([write_run(tmp_path / "results" / "p", _rows()[:1], peaks=PEAKS)], out_root=tmp_path / "reports").read_text()
    assert '<section id="variants">' not in plain_only


def test_the_winner_per_model_and_tp_degree_counts_the_cases_of_its_layers():
    from harness.analysis.models import model_winners

    # gpt-oss-20b on one GPU of TP 8: 8 query heads, its 8 KV heads down to 1, head dim 64, sinks, and a 128-token window
    # on its sliding layers (harness/suite/presets.py).
    sliding = Case(B=1, S_q=160, S_kv=160, H=8, H_kv=1, d_k=64, d_v=64, causal=True, window=128, sinks=True)
    rows = [synthetic_record(sliding, "naive", 2.0), synthetic_record(sliding, "flex", 1.0),
            synthetic_record(sliding.replace(window=None), "naive", 2.5), synthetic_record(sliding.replace(window=None), "flex", 3.0)]
    table = model_winners(frame_of(rows)).set_index(["model", "tp", "layer_kind", "phase"])
    # one answer per layer kind: the sliding layers' case and the full layers' case are different problems
    assert table.loc[("gpt-oss-20b", 8, "sliding", "prefill"), "winner"] == "flex" and table.loc[("gpt-oss-20b", 8, "sliding", "prefill"), "won"] == 1
    assert table.loc[("gpt-oss-20b", 8, "full", "prefill"), "winner"] == "naive" and table.loc[("gpt-oss-20b", 8, "full", "prefill"), "cases"] == 1
    assert table.loc[("gpt-oss-20b", 8, "full", "prefill"), "runner_up"] == "flex"
    assert ("gpt-oss-20b", 1, "sliding", "prefill") not in table.index
