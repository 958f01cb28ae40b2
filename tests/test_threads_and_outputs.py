"""`run --threads` sets and records the CPU threads a pair is timed with; `--report` and `repro` write beside `--out`;
the run's last line and the pytest route say which rows were contended, whose medians decide no answer."""

from __future__ import annotations

import re

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.measure.threads import apply_threads
from harness.results.run_options import MAX_THREADS, RunOptions
from harness.results.store import read_records
from harness.run.repro import repro_command
from tests.cli_runs import ROOT, attnbench, cli_env, refused, write_suite

# The suites' pytest route runs here as its own pytest, never as an xdist worker of `make test`.
pytestmark = pytest.mark.usefixtures("outside_xdist")

#: A backends plugin that adds no backend but makes every timed measurement contended (the thresholds below any reading),
#: loaded through ATTNBENCH_BACKENDS by the supervisor and by each worker alike.
_BUSY = '''def busy(registry):
    import harness.measure.contention as contention

    contention.CONTENDED_RUN_WAIT = contention.CONTENDED_SWITCH_RATE = -1.0
'''


def _busy_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI or pytest run in which every timed row is contended."""
    (tmp_path / "busy_plugin.py").write_text(_BUSY)
    return cli_env(tmp_path, ATTNBENCH_BACKENDS="busy_plugin:busy", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")


def test_apply_threads_sets_torchs_intra_op_threads_and_returns_the_count_in_effect():
    import torch

    before = torch.get_num_threads()
    try:
        assert apply_threads(1) == 1 and torch.get_num_threads() == 1
        assert apply_threads(None) == 1  # None leaves the count as it is
    finally:
        torch.set_num_threads(before)
    for wrong in (0, -3, MAX_THREADS + 1, True, 2.5):
        with pytest.raises(UserError, match="--threads must be a whole number from 1 to"):
            apply_threads(wrong)


def test_run_refuses_a_thread_count_below_one_in_one_line(tmp_path, capsys):
    refused(capsys, ["run", "--suite", "quick", "--out", tmp_path, "--threads", "0"], ["--threads", "not 0"])


def test_resume_refuses_another_thread_count(tmp_path, capsys):
    refused(capsys, ["run", "--resume", tmp_path / "r", "--threads", "2"], ["--threads cannot change it"])


def test_the_manifest_stores_threads_and_reads_it_back_and_refuses_a_bad_one():
    options = RunOptions(threads=3)
    assert options.to_manifest()["threads"] == 3 and RunOptions.from_manifest(options.to_manifest(), "m.json") == options
    assert RunOptions.from_manifest({}, "m.json").threads is None  # a folder made before --threads: torch's default
    with pytest.raises(UserError, match="m.json: field 'threads' has value 0"):
        RunOptions.from_manifest({"threads": 0}, "m.json")


def test_repro_carries_the_out_folder_and_the_threads_quoted_for_a_shell():
    words = shlex.split(repro_command({"device": "cpu", "threads": 2, "python": "/v/bin/python"}, "/data/my exp/results/r 1",
                                      "B1-Sq8", "naive"))
    options = dict(zip(words[4::2], words[5::2]))
    assert options["--suite"] == "/data/my exp/results/r 1" and options["--out"] == "/data/my exp/results"
    assert options["--threads"] == "2"
    assert "--threads" not in shlex.split(repro_command({"device": "cpu"}, "/runs/r", "B1-Sq8", "naive"))


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    """`run --threads 1 --out <tmp>/x/results --report` from another working directory, every row contended."""
    tmp = tmp_path_factory.mktemp("outputs")
    suite = write_suite(tmp / "tiny.toml", ["naive", "sdpa"], [8])
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    env = _busy_env(tmp)
    done = attnbench(["run", "--suite", suite, "--device", "cpu", "--threads", "1", "--out", tmp / "x" / "results",
                      "--run-id", "r", "--quiet", "--report"], env, timeout_s=200, cwd=cwd)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return tmp, cwd, env, done


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_report_goes_beside_out_and_nothing_lands_in_the_working_directory(busy_run):
    tmp, cwd, _, done = busy_run
    page = tmp / "x" / "reports" / "r" / "index.html"
    assert page.is_file()
    assert done.stdout.strip().splitlines()[-1] == f"report: {page}"
    assert list(cwd.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_row_and_the_manifest_record_the_threads_the_run_set(busy_run):
    tmp = busy_run[0]
    rows = read_records(tmp / "x" / "results" / "r").records
    assert len(rows) == 2 and {r["status"] for r in rows} == {"ok"}
    assert {r["threads"] for r in rows} == {1}
    assert json.loads((tmp / "x" / "results" / "r" / "manifest.json").read_text())["threads"] == 1
    assert all("--threads 1" in r["repro"] for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_runs_last_count_line_names_the_contended_rows(busy_run):
    done = busy_run[3]
    counted = next(line for line in done.stdout.splitlines() if " pairs recorded " in line)
    # Every row is forced contended; a busy machine may make one suspect too ("2 contended, 1 suspect: …").
    assert re.match(r"2 of 2 pairs recorded \(2 ok; 2 contended(, [12] suspect)?: their medians decide no answer\) in ", counted), counted


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rows_repro_run_from_anywhere_writes_its_run_folder_under_the_same_out(busy_run):
    tmp, cwd, env, _ = busy_run
    row = next(r for r in read_records(tmp / "x" / "results" / "r").records if r["backend"] == "naive")
    done = subprocess.run(["sh", "-c", row["repro"]], cwd=cwd, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    (new_dir,) = [d for d in (tmp / "x" / "results").iterdir() if d.name != "r"]
    (new,) = read_records(new_dir).records
    assert (new["case_id"], new["backend"], new["threads"]) == (row["case_id"], "naive", 1)
    assert list(cwd.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pytest_route_marks_contended_rows_in_its_json_and_names_them_at_the_end(tmp_path):
    suite = write_suite(tmp_path / "tiny.toml", ["naive"], [8, 16])
    run_dir, bench_json = tmp_path / "run", tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "suites" / "test_bench.py"),
                           "--attnbench-suite", str(suite), "--attnbench-run-dir", str(run_dir), "--attnbench-no-check",
                           "--attnbench-threads", "1", "--benchmark-json", str(bench_json)],
                          cwd=ROOT, env=_busy_env(tmp_path), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    extra = [b["extra_info"] for b in json.loads(bench_json.read_text())["benchmarks"]]
    assert len(extra) == 2 and all(e["contended"] is True and e["threads"] == 1 for e in extra)
    (line,) = [line for line in done.stdout.splitlines() if "contended or suspect" in line]
    assert "2 of 2 rows" in line and "decide no answer" in line
    assert all(f"{e['case_id']}-naive" in line for e in extra)
    assert {r["threads"] for r in read_records(run_dir).records} == {1}
