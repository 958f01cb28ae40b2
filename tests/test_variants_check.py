"""The score variants end to end on the CPU: `attnbench check --suite variants` agrees for naive, sdpa, sdpa-math and flex
wherever they support a variant and names why where they do not, and the CPU variant of models-2026 runs."""

from __future__ import annotations

import json

import pytest

from harness.results.store import read_records
from tests.cli_runs import attnbench_in_process


def _checked(capsys, *args: str) -> tuple[int, list[dict]]:
    ran = attnbench_in_process(["check", "--suite", "variants", "--device", "cpu", "--json", *args], capsys)
    return ran.code, json.loads(ran.out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_of_every_variant_agrees_for_naive_and_sdpa_or_names_why(capsys):
    code, rows = _checked(capsys, "--backends", "naive,sdpa,sdpa-math")
    assert code == 0 and len(rows) == 234
    assert {r["verdict"] for r in rows} <= {"agree", "unsupported"}
    assert all(r["verdict"] == "agree" for r in rows if r["backend"] == "naive")  # every variant, d_k 64/128/256, fp32/bf16
    for r in rows:
        if r["verdict"] == "unsupported":
            assert r["backend"] != "naive" and ("softcap" in r["reason"] or "sinks" in r["reason"]), r
    sdpa_alibi = [r for r in rows if r["backend"] == "sdpa" and "-alibi" in r["case_id"]]
    assert len(sdpa_alibi) == 12 and all(r["verdict"] == "agree" for r in sdpa_alibi)  # ALiBi as SDPA's float bias


@pytest.mark.compile
@pytest.mark.timeout(300)
def test_flex_computes_softcap_alibi_and_the_scale_and_says_why_not_sinks_on_a_cpu(capsys):
    # The one test of flex's dense score_mods against the reference (each is a cold compile): at these shapes a backend
    # that ignored cap50, cap30 or ALiBi disagrees (naive without them: max errors 8e-3, 2e-2 and more, far over fp32's bound).
    code, rows = _checked(capsys, "--backends", "flex", "--only", "dk128-fp32-causal")
    assert code == 0 and len(rows) == 7
    verdicts = {r["case_id"].split("causal")[-1] or "plain": r for r in rows}
    assert {k for k, r in verdicts.items() if r["verdict"] == "agree"} == {"plain", "-cap50", "-cap30", "-alibi", "-scale0.0625"}
    assert all("return_lse" in r["reason"] for k, r in verdicts.items() if "sinks" in k)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_cpu_variant_of_models_2026_runs_and_reports_what_each_variant_costs(tmp_path, capsys):
    ran = attnbench_in_process(["run", "--suite", "models-2026", "--backends", "naive,sdpa", "--device", "cpu",
                                "--out", str(tmp_path / "results"), "--run-id", "m", "--quiet", "--report"], capsys)
    assert ran.code == 0, ran.err
    rows = read_records(tmp_path / "results" / "m").records
    from harness.suite.catalog import suite_on_device

    assert len(rows) == 2 * len(suite_on_device("models-2026", "cpu").cases) and {r["status"] for r in rows} == {"ok", "unsupported"}
    assert all(r["agree"] is True for r in rows if r["status"] == "ok")
    assert {r["backend"] for r in rows if r["status"] == "unsupported"} == {"sdpa"}  # SDPA has no softcap and no sinks
    page = (tmp_path / "reports" / "m" / "index.html").read_text()
    assert '<section id="variants">' in page
