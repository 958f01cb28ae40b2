"""pytest-benchmark's public interface is all `pytest suites/` uses: the `benchmark(timer=...)` marker and `pedantic`.

The marker's timer is how the harness's clock (CUDA events on a GPU) replaces time.perf_counter;
these tests give the real fixture a fake clock through the marker: if pytest-benchmark stopped
reading the marker's timer, its statistics would come from its own clock and differ from the exact
values the fake clock gives. The last test runs a tiny suite through `pytest suites/` and checks
that pytest-benchmark's JSON holds the samples of the records.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The suites' pytest route runs here as its own pytest, never as an xdist worker of `make test`.
pytestmark = pytest.mark.usefixtures("outside_xdist")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_the_real_fixture_reads_the_markers_clock_in_a_pytest_of_its_own():
    # pytest-benchmark disables itself in any xdist worker, so the fixture's checks run in their own pytest.
    checks = ROOT / "tests" / "benchmark_marker_checks.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(checks)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_unit_test_sessions_run_without_the_suite_plugin(request):
    """The plugin freezes the collector's survivors after collection: no business in a unit-test session."""
    assert not request.config.pluginmanager.has_plugin("harness.run.pytest_plugin")


def test_nothing_sets_pytest_benchmarks_private_timer():
    for path in (ROOT / "harness").rglob("*.py"):
        assert "._timer" not in path.read_text(), path


@pytest.mark.slow
def test_pytest_benchmark_json_holds_the_records_samples(tmp_path):
    """`pytest suites/test_bench.py --benchmark-json`: one benchmark per measured pair, its rounds the record's samples."""
    from tests.cli_runs import write_suite

    suite = write_suite(tmp_path / "tiny.toml", ["naive", "sdpa"], [8, 16])
    run_dir, bench_json = tmp_path / "run", tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "suites" / "test_bench.py"),
                           "--attnbench-suite", str(suite), "--attnbench-run-dir", str(run_dir), "--attnbench-no-check",
                           "--benchmark-json", str(bench_json)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bench = json.loads(bench_json.read_text())
    by_pair = {(b["extra_info"]["case_id"], b["extra_info"]["backend"]): b for b in bench["benchmarks"]}
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["status"] for r in records} == {"ok"}
    for record in records:
        entry = by_pair[(record["case_id"], record["backend"])]
        assert entry["options"]["timer"] == "attnbench_device_clock"
        assert entry["stats"]["rounds"] == record["samples"]
        assert [s * 1e3 for s in entry["stats"]["data"]] == pytest.approx(record["sample_ms"], rel=1e-12)
