"""Profiling as a user meets it: `attnbench profile`, `run --profile --traces`, and the report's Profiling section (in Chromium)."""

import gzip
import json

import pytest
import torch

from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from harness.cli.main import main
from harness.profiling.categories import column_name
from tests.cli_runs import write_suite
from tests.browser import browse, chromium

CASE_ID = "B1-Sq512-Skv512-H8-Hkv8-dk64-fp32"


@pytest.mark.slow
def test_profile_lists_the_matmuls_and_the_softmax_against_the_median_and_writes_a_trace(tmp_path, capsys):
    assert main(["profile", CASE_ID, "--backend", "naive", "--out", str(tmp_path), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert f"{CASE_ID} on naive (cpu, {torch.get_num_threads()} thread" in out and "agrees with the float64 reference" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("aten::")}
    assert rows["aten::bmm"] == "matmul" and rows["aten::_softmax"] == "softmax"
    # Set against the median either way: a share, or (the profiled pass slower on a busy machine) why there is none.
    assert ("operators cover" in out or "not measurable here" in out) and "reached in aten::" in out
    trace = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("trace: "))
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::bmm" for e in events)


def test_profile_says_in_one_line_why_there_is_no_ncu(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu on it
    assert main(["profile", "B1-Sq64-Skv64-H2-Hkv2-dk16-fp32", "--backend", "sdpa", "--out", str(tmp_path), "--steps", "1", "--ncu"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ncu: ")]
    assert len(lines) == 1 and "CPU case" in lines[0]


def test_profile_of_an_unsupported_pair_is_one_line(tmp_path, capsys):
    assert main(["profile", CASE_ID, "--backend", "sdpa-cudnn", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sdpa-cudnn gives unsupported" in err


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiled")
    suite = write_suite(out / "prof.toml", ["naive", "sdpa", "projections"], [32, 64])
    assert main(["run", "--suite", str(suite), "--out", str(out), "--run-id", "p", "--quiet", "--profile", "--traces",
                 "--report", str(out / "reports"), "--no-check"]) == 0
    return out / "p"


@pytest.mark.slow
def test_run_profile_fills_the_profile_columns_and_writes_a_trace_per_pair(profiled_run):
    rows = read_records(profiled_run).records
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    for r in rows:
        assert r["profile_kernels_per_step"] > 0 and r["profile_kernel_ms_per_step"] > 0 and r["profile_top_kernel"]
        parts = sum(r[column_name(c)] for c in ("matmul", "softmax", "elementwise", "copy/expand", "fused attention", "other"))
        assert parts == pytest.approx(r["profile_kernel_ms_per_step"], rel=1e-6)
        assert (profiled_run / "traces" / f"{r['case_id']}-{r['backend']}.trace.json.gz").exists()
    naive = [r for r in rows if r["backend"] == "naive"]
    assert all(r["profile_ms_matmul"] > 0 and r["profile_ms_softmax"] > 0 for r in naive)
    sdpa = [r for r in rows if r["backend"] == "sdpa"]
    assert all(r["profile_ms_fused_attention"] > 0 for r in sdpa)


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (CI installs the Debian package `chromium`; see .ci/run)")
def test_the_report_shows_the_profiling_section_in_chromium(profiled_run, tmp_path):
    page = profiled_run.parent / "reports" / "p" / "index.html"
    found, console = browse(page, tmp_path)
    assert found["errors"] == [] and console == ""
    assert "profiling" in found["sections"] and found["zero_width"] == 0
    html = page.read_text()
    section = html[html.index('<section id="profiling">'):]
    section = section[: section.index("</section>")]
    assert "Where the time goes" in section and "<img" in section and "matmul" in section


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [
    "B1-Sq128-Skv128-H8-Hkv2-dk64-fp32-causal",     # is_causal
    "B2-Sq16-Skv80-H4-Hkv2-dk32-fp32-causal",       # lower-right CausalBias
    "B2-Sq64-Skv64-H4-Hkv2-dk32-fp32-causal-pad",   # a boolean mask
    "B1-Sq64-Skv64-H4-Hkv4-dk32-bf16",
])
def test_sdpa_names_the_kernel_the_profiler_sees_it_run(case_id):
    from harness.backends.registry import load_registry
    from harness.execution.execute import PairRunner, Phases, execute
    from harness.measure.timing import Budget
    from harness.suite.cases import parse_case_id

    runner = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.001, min_rounds=1, max_rounds=2), phases=Phases(profile=True, profile_steps=1))
    record = execute(parse_case_id(case_id), load_registry().get("sdpa"), runner)
    profiled_flash = record.profile_ms_fused_attention > 0
    assert record.notes["sdpa_kernel"] == ("FLASH_ATTENTION" if profiled_flash else "MATH"), (record.notes, record.profile_top_kernel)


@pytest.mark.e2e
def test_the_timer_a_user_chooses_is_named_in_every_row(tmp_path):
    from harness.results.record import Status

    suite = write_suite(tmp_path / "t.toml", ["naive"], [32])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "k", "--quiet", "--timer", "kernels", "--no-check"]) == 0
    kernels = read_records(tmp_path / "k").records
    assert [r["timer"] for r in kernels] == ["cpu-operators (profiler)"] and kernels[0]["samples"] >= 10
    assert kernels[0]["latency_ms_median"] > 0
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "g", "--quiet", "--timer", "graph", "--no-check"]) == 0
    graph = read_records(tmp_path / "g").records
    assert graph[0]["status"] == Status.UNSUPPORTED and "CUDA cases only" in graph[0]["reason"]
