"""`attnbench export`: a run as pytest-benchmark JSON read back by the real `pytest-benchmark compare`, and as
flashinfer-bench traces validated by flashinfer-bench's own pydantic `Trace` model."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runs import TINY_BUDGET, attnbench_in_process, cli_env, refused, write_suite
from h200_data import H200, needs_h200

#: compare prints a table's times in one unit per table, named in its header: seconds per unit.
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@pytest.fixture(scope="module")
def h200_run(tmp_path_factory) -> Path:
    """A copy of the real H200 run folder (records gunzipped), with up to 1,000 raw samples per ok row."""
    if H200 is None:
        pytest.skip("the H200 measurements (shared/data/h200-2026-11-29) are not on this machine")
    run = tmp_path_factory.mktemp("h200") / "gpu-slice"
    run.mkdir()
    for name in ("manifest.json", "env.json", "peaks.json"):
        shutil.copy(H200 / name, run / name)
    with gzip.open(H200 / "records.jsonl.gz", "rb") as packed:
        (run / "records.jsonl").write_bytes(packed.read())
    return run


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    """A real tiny CPU run made by the CLI (sdpa and naive, two sizes): what every machine can export.

    In this process (its workers are still processes of their own): what is tested is the export, not the run's process.
    """
    tmp = tmp_path_factory.mktemp("cpu")
    suite = write_suite(tmp / "tiny.toml", ["sdpa", "naive"], [8, 16], budget=TINY_BUDGET)
    with pytest.MonkeyPatch.context() as patch:
        ran = attnbench_in_process(["run", "--suite", suite, "--device", "cpu", "--out", tmp / "results", "--run-id", "tiny", "--quiet"],
                                   None, env=cli_env(tmp), monkeypatch=patch)
    assert ran.code == 0
    return tmp / "results" / "tiny"


def records(run: Path) -> list[dict]:
    """The run's records as every reader sees them (one row per pair: a re-measure in its first row's place)."""
    from harness.results.store import read_records

    return read_records(run).records


def compare_medians(path: Path) -> dict[str, tuple[float, float]]:
    """Run the real `pytest-benchmark compare` on an exported file; each benchmark's printed median and its table's unit, in seconds."""
    ran = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path), "--columns=median", "--sort=name"],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    medians, scale = {}, None
    for line in ran.stdout.splitlines():
        header = re.match(r"Name \(time in (\w+)\)", line)
        if header:
            scale = UNITS[header.group(1)]
            continue
        # A row: the name (its source file after it in parentheses, when compare shows one), the median, its ratio to the table's best.
        row = re.match(r"(\S+)(?: \([^)]*\))?\s+([0-9.,]+) \(", line)
        if row:
            medians[row.group(1)] = (float(row.group(2).replace(",", "")) * scale, scale)
    return medians


def export(capsys, run: Path, fmt: str, out: Path, *extra: str):
    """Run `attnbench export` in process; its exit status and stdout."""
    ran = attnbench_in_process(["export", run, "--format", fmt, "--out", out, *extra], capsys)
    return ran.code, ran.out


def check_pytest_benchmark(run: Path, out: Path, capsys) -> None:
    """Export `run` as pytest-benchmark JSON; compare's table shows every ok row, at the median the row recorded."""
    code, printed = export(capsys, run, "pytest-benchmark", out)
    rows = records(run)
    ok = [r for r in rows if r["status"] == "ok"]
    assert code == 0 and printed.strip() == f"exported {len(ok)} benchmarks ({len(rows) - len(ok)} rows not ok left out) to {out}"
    document = json.loads(out.read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(document)
    assert {"id", "time", "author_time", "dirty", "project", "branch"} <= set(document["commit_info"])
    assert len(document["attnbench_skipped"]) == len(rows) - len(ok)
    exported = {b["name"]: b for b in document["benchmarks"]}
    shown = compare_medians(out)
    for row in ok:
        name = f"{row['case_id']}-{row['backend']}"
        stats = exported[name]["stats"]
        # The recorded median is the median of the row's own samples (harness.measure: sample_ms are per call, iterations divided out).
        assert stats["median"] == pytest.approx(row["latency_ms_median"] / 1e3, rel=1e-12)
        assert stats["median"] == pytest.approx(statistics.median(row["sample_ms"]) / 1e3, rel=1e-12)
        assert stats["rounds"] == len(row["sample_ms"]) == row["samples"]
        assert exported[name]["group"] == row["case_id"] and exported[name]["params"]["backend"] == row["backend"]
        assert exported[name]["extra_info"]["latency_ms_median"] == row["latency_ms_median"]
        # compare prints 4 decimals in its table's unit (one unit per group, set by the group's fastest figure): within half the last.
        value, unit = shown[name]
        assert value == pytest.approx(row["latency_ms_median"] / 1e3, abs=0.5e-4 * unit * (1 + 1e-9)), name
    assert set(shown) == set(exported)


@pytest.mark.slow
@needs_h200
def test_h200_run_exports_to_pytest_benchmark_compare(h200_run, tmp_path, capsys):
    """84 ok H200 rows, each with 1,000 samples: compare shows each at its recorded median."""
    check_pytest_benchmark(h200_run, tmp_path / "h200.json", capsys)


@pytest.mark.slow
def test_cpu_run_exports_to_pytest_benchmark_compare(cpu_run, tmp_path, capsys):
    """A run made here by the CLI exports the same way."""
    check_pytest_benchmark(cpu_run, tmp_path / "cpu.json", capsys)


def validate_traces(run: Path, out: Path, capsys) -> list:
    """Export `run` as flashinfer-bench traces; every line is a valid `Trace` (their model); exported plus left out is every row."""
    data = pytest.importorskip("flashinfer_bench.data", reason="flashinfer-bench (pip install flashinfer-bench) validates the traces")
    code, printed = export(capsys, run, "flashinfer-bench", out)
    assert code == 0, printed
    lines = out.read_text().splitlines()
    traces = [data.Trace.model_validate(json.loads(line)) for line in lines]
    match = re.fullmatch(rf"exported (\d+) traces \((\d+) rows not ok or of no flashinfer-bench kind left out\) to {re.escape(str(out))}",
                         printed.strip())
    assert match and int(match.group(1)) == len(traces) and len(traces) + int(match.group(2)) == len(records(run))
    by_pair = {f"{r['case_id']}-{r['backend']}": r for r in records(run)}
    for t in traces:
        row = next(r for key, r in by_pair.items() if r["backend"] == t.solution and t.evaluation.log.split()[4] == key)
        expected = data.EvaluationStatus.PASSED if row["agree"] else data.EvaluationStatus.INCORRECT_NUMERICAL
        assert t.evaluation.status == expected and t.evaluation.correctness.max_absolute_error == pytest.approx(row["max_abs_err"])
        if expected is data.EvaluationStatus.PASSED:
            assert t.evaluation.performance.latency_ms == row["latency_ms_median"]
        assert t.definition == f"gqa_ragged_prefill{'_causal' if row['causal'] else ''}_h{row['H']}_kv{row['H_kv']}_d{row['d_k']}"
        assert t.workload.axes == {"len_indptr": row["B"] + 1, "total_q": row["B"] * row["S_q"], "total_kv": row["B"] * row["S_kv"]}
    return traces


@needs_h200
def test_h200_run_exports_flashinfer_traces(h200_run, tmp_path, capsys):
    """The H200 ok rows that were checked become traces on hardware NVIDIA_H200; unsupported and unchecked ones are left out."""
    traces = validate_traces(h200_run, tmp_path / "h200.jsonl", capsys)
    assert traces and {t.evaluation.environment.hardware for t in traces} == {"NVIDIA_H200"}


def test_cpu_run_exports_flashinfer_traces(cpu_run, tmp_path, capsys):
    """A run made here by the CLI exports valid traces too."""
    assert validate_traces(cpu_run, tmp_path / "cpu.jsonl", capsys)


def test_export_refusals(cpu_run, tmp_path, capsys):
    """Not a run, nothing ok, an --out in a run or already there, an unknown format: one line (or argparse's usage), exit 2."""
    out = tmp_path / "x.json"
    refused(capsys, ["export", tmp_path, "--format", "pytest-benchmark", "--out", out], ["not a run folder"])
    refused(capsys, ["export", cpu_run, "--format", "pytest-benchmark", "--out", cpu_run / "x.json"], ["inside the run folder"])
    empty = tmp_path / "empty"
    shutil.copytree(cpu_run, empty)
    (empty / "records.jsonl").write_text("".join(json.dumps({**r, "status": "error", "reason": "boom", "sample_ms": None}) + "\n"
                                                 for r in records(cpu_run)))
    refused(capsys, ["export", empty, "--format", "pytest-benchmark", "--out", out], ["nothing to export"])
    assert not out.exists()
    out.write_text("mine")
    refused(capsys, ["export", cpu_run, "--format", "pytest-benchmark", "--out", out], ["exists", "--force"])
    assert out.read_text() == "mine"
    assert export(capsys, cpu_run, "pytest-benchmark", out, "--force")[0] == 0 and json.loads(out.read_text())["benchmarks"]
    # The CLI's UsageParser words argparse's usage error as one line, exit 2.
    refused(capsys, ["export", cpu_run, "--format", "csv", "--out", out], ["--format", "invalid choice: 'csv'"])
