"""What the stopping rule leaves in a row and a report: stopped_by and drift in the record, the flags that say so,
the CPU's capability in env.json, and why bf16 rows are slow on a CPU without native bf16."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.execution.outcome import PairOutcome, to_record
from harness.measure.stats import Drift, Stats
from harness.measure.timing import Measurement, Plan
from harness.results.record import Status
from harness.suite.cases import Case, parse_case_id
from tests.synthetic_runs import PEAKS, synthetic_record, write_run

AVX2_ENV = {"before": {"device_type": "cpu", "device_name": "AMD EPYC", "torch": "2.x", "cpu_capability": "AVX2", "cpu_bf16_native": False}}


def test_the_record_carries_what_stopped_the_samples_and_their_drift():
    from harness.backends.registry import load_registry

    case = parse_case_id("B1-Sq32-Skv32-H2-Hkv2-dk16-fp32")
    plan = Plan(iterations=1, rounds=30, warmup_calls=1, warmup_s=0.0, call_s=1e-3, stop="budget")
    samples = [1e-3] * 10 + [1.03e-3] * 20
    m = Measurement(stats=Stats.from_samples(samples), plan=plan, clock_resolution_s=1e-9, stopped_by="precision",
                    drift=Drift(pct=3.0, significant=True))
    record = to_record(case, load_registry(plugins=False).get("naive"), PairOutcome(Status.OK, measurement=m))
    assert (record.stopped_by, record.drift_pct, record.drifted) == ("precision", 3.0, True)  # the loop's stop, not the plan's
    few = Measurement(stats=Stats.from_samples([3.2]), plan=plan, clock_resolution_s=1e-9, stopped_by="call_exceeds_budget")
    row = to_record(case, load_registry(plugins=False).get("naive"), PairOutcome(Status.OK, measurement=few))
    assert row.stopped_by == "call_exceeds_budget" and row.drift_pct is None and row.drifted is None
    assert row.latency_ms_ci95_low is None  # one sample: no interval claimed


def test_cpu_capability_names_torchs_instruction_set_and_whether_bf16_is_native(tmp_path):
    import torch

    from harness.env import cpu_capability, cpu_flags, fingerprint

    assert cpu_capability({"avx2", "fma"}) == {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16_native": False}
    assert cpu_capability({"avx512f", "avx512_bf16"})["cpu_bf16_native"] is True
    assert cpu_capability({"amx_tile", "amx_bf16"})["cpu_bf16_native"] is True
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx2", "fma"}
    assert cpu_flags(str(tmp_path / "missing")) is None
    env = fingerprint("cpu")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and isinstance(env["cpu_bf16_native"], (bool, type(None)))


def _flags_html(tmp_path: Path, name: str, records, env=None) -> str:
    from harness.report import build_report

    page = build_report([write_run(tmp_path / "results" / name, records, peaks=PEAKS, env=env)], out_root=tmp_path / "reports")
    return page.read_text()


@pytest.mark.slow
def test_drifting_rows_and_rows_short_of_the_minimum_are_flagged_and_bf16_emulation_is_explained(tmp_path):
    fp32 = Case(B=2, S_q=1024, S_kv=1024, H=8, H_kv=2, d_k=64, d_v=64, dtype="fp32")
    bf16 = fp32.replace(dtype="bf16")
    drifting = synthetic_record(fp32, "sdpa", 10.0)
    drifting.drifted, drifting.drift_pct, drifting.stopped_by, drifting.samples = True, -4.2, "budget", 90
    dear = synthetic_record(bf16, "naive", 3200.0)
    dear.stopped_by, dear.samples = "call_exceeds_budget", 1
    calm = synthetic_record(bf16, "sdpa", 20.0)
    calm.drifted, calm.drift_pct, calm.stopped_by, calm.samples = False, 0.1, "precision", 80
    html = _flags_html(tmp_path, "avx2", [drifting, dear, calm], env=AVX2_ENV)
    section = html.split('<section id="flags">')[1].split("</section>")[0]
    assert "the device changed while the row was measured" in section and "fewer samples than the minimum" in section
    assert "2 of 3 measured rows carry a flag" in section
    assert "2 of 3 measured rows carry a sample flag (1 drifting while measured, 1 with fewer samples than the minimum)" in html
    slow = "2 bf16 rows ran on a CPU without native bf16 (torch&#x27;s CPU capability AVX2; no avx512_bf16 or amx_bf16)"
    assert slow in section and slow in html.split('<section id="choose">')[0]  # in the flags and in the overview
    assert "1 of them took fewer samples than the minimum" in section
    native = {"before": {**AVX2_ENV["before"], "cpu_capability": "AVX512", "cpu_bf16_native": True}}
    assert "without native bf16" not in _flags_html(tmp_path, "avx512", [dear, calm], env=native)


@pytest.mark.parametrize("budget,message", [
    ("min_measure_share = 1.5", "budget field 'min_measure_share' has value 1.5"),
    ("fewest_rounds = 0", "budget field 'fewest_rounds' has value 0"),
])
def test_a_toml_budget_refuses_bad_stopping_fields_in_one_line(tmp_path, budget, message):
    from harness.suite.catalog import suite_from_toml

    path = tmp_path / "s.toml"
    path.write_text(f"[budget]\n{budget}\n[[grid]]\nB = 1\nS = 8\nH = 1\nd_k = 8\n")
    with pytest.raises(UserError, match=message):
        suite_from_toml(path)


def test_what_a_toml_budget_leaves_out_is_the_devices_budget(tmp_path):
    from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET
    from harness.suite.catalog import suite_from_toml

    path = tmp_path / "s.toml"
    path.write_text("[budget]\nmeasure_s = 0.3\n[[grid]]\nB = 1\nS = 8\nH = 1\nd_k = 8\n")
    suite = suite_from_toml(path)
    on_cpu, on_gpu = suite.on_device("cpu").budget, suite.on_device("cuda").budget
    assert on_cpu.measure_s == on_gpu.measure_s == 0.3  # what the file sets holds on both
    assert on_cpu == dataclasses.replace(QUICK_BUDGET, measure_s=0.3) and on_gpu == dataclasses.replace(CUDA_BUDGET, measure_s=0.3)


def test_a_toml_budget_sets_the_stopping_fields():
    from harness.suite.catalog import suite_from_toml

    suite = suite_from_toml(Path(__file__).resolve().parent.parent / "suites" / "example.toml")
    assert (suite.budget.precision, suite.budget.min_measure_share, suite.budget.fewest_rounds) == (0.01, 0.7, 1)
    assert json.loads(json.dumps(suite.budget.__dict__))["fewest_rounds"] == 1
