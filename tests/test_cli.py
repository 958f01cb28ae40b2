"""The command line as a user meets it: listings, one-line errors with exit code 2, and a real run."""

import json

import pandas as pd
import pytest

from tests.cli_runs import assert_one_line_error, attnbench, attnbench_in_process, write_suite


@pytest.mark.e2e
def test_backends_json_lists_availability(capsys):
    result = attnbench_in_process(["backends", "--json"], capsys)
    assert result.code == 0, result.err
    rows = {row["name"]: row for row in json.loads(result.out)}
    assert rows["naive"]["available"] is True and rows["naive"]["reason"] is None
    assert {"name", "available", "reason"} <= set(rows["sdpa-cudnn"])


GOOD = ["B = [1]", "S = [64]", "H = [8]", "d_k = [32]"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--suite", "nosuch"], "unknown suite 'nosuch'"),
        (["run", "--suite", "quick", "--backends", "naive,flashy"], "unknown backend 'flashy'"),
        (["run", "--suite", "quick", "--device", "tpu"], "unknown device 'tpu'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["gpu-check", "--cpu", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["run", "--suite", "quick", "--only", "no-such-pair"], "matches no pair"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args, message, tmp_path, capsys):
    # In process (the process-level path is test_existing_run_folder_is_not_overwritten's).
    assert_one_line_error(attnbench_in_process([*args, "--out", tmp_path] if args[0] == "run" else args, capsys), message)


@pytest.mark.parametrize(
    "grid, message",
    [
        (["B = [1]", "S = [64]", "H = [8]", "H_kv = [3]", "d_k = [32]"], "H=8 is not divisible by H_kv=3"),
        (["B = [1]", "S = [64]", "H = [8]", "d_k = [0]"], "field 'd_k' has value 0"),
        (["B = [1]", "S = [64]", "H = [8]", "d_k = [32]", 'dtype = ["fp12"]'], "unknown dtype 'fp12'"),
        (["B = [1]", "S = [64]", "H = [8]", "d_k = [32]", "heads = [2]"], "unknown field 'heads'"),
    ],
)
def test_bad_suite_files_name_the_field(grid, message, tmp_path, capsys):
    suite = write_suite(tmp_path / "bad.toml", grid=grid, budget="")
    assert_one_line_error(attnbench_in_process(["run", "--suite", suite, "--out", tmp_path / "out"], capsys), message)


@pytest.mark.e2e
def test_existing_run_folder_is_not_overwritten(tmp_path, capsys):
    suite = write_suite(tmp_path / "bad.toml", grid=GOOD, budget="")
    first = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path, "--run-id", "r", "--backends", "naive"], capsys)
    assert first.code == 0, first.err
    before = (tmp_path / "r" / "records.jsonl").read_bytes()
    second = attnbench(["run", "--suite", suite, "--out", tmp_path, "--run-id", "r", "--backends", "naive"], timeout_s=600)
    # The real process: exit 2 and one line, no traceback (the other usage errors are checked in-process above).
    assert_one_line_error(second, "--force")
    assert (tmp_path / "r" / "records.jsonl").read_bytes() == before


@pytest.mark.e2e
def test_quick_suite_end_to_end_on_a_tiny_grid(tmp_path, capsys):
    """`attnbench run --suite quick` restricted to a few pairs: folder, files, a row per pair (the run's own process is
    test_existing_run_folder_is_not_overwritten's; here the workers are what runs)."""
    result = attnbench_in_process(["run", "--suite", "quick", "--out", tmp_path, "--run-id", "q",
                                   "--only", "B1-Sq128-Skv128-H8-Hkv2-dk64", "--backends", "naive,sdpa,sdpa-flash,sdpa-cudnn"], capsys)
    assert result.code == 0, result.err
    run_dir = tmp_path / "q"
    assert f"results: {run_dir}" in result.out
    for name in ("records.jsonl", "records.csv", "env.json", "manifest.json"):
        assert (run_dir / name).is_file(), name
    frame = pd.read_csv(run_dir / "records.csv")
    # 2 dtypes × 2 causal settings × 4 backends.
    assert len(frame) == 16
    assert frame.groupby(["case_id", "backend"]).size().max() == 1
    assert set(frame[frame.backend == "sdpa-cudnn"].status) == {"unsupported"}
    assert frame[frame.backend == "sdpa-cudnn"].reason.str.contains("CUDA").all()
    ok = frame[frame.status == "ok"]
    assert len(ok) == 12 and ok.agree.all()
    assert (ok.latency_ms_median > 0).all() and (ok.tflops > 0).all()
    # Every row says how precise its median is, and what set its number of samples. naive's bf16 call (~22 ms on an
    # AVX2 CPU) fits the 50 ms budget a few times; on a machine slowed 2-3x it is one sample, and the row says so.
    sampled, few = ok[ok.samples >= 6], ok[ok.samples < 6]
    assert sampled.latency_ms_ci95_low.notna().all() and few.latency_ms_ci95_low.isna().all()
    assert ((sampled.latency_ms_ci95_low <= sampled.latency_ms_median) & (sampled.latency_ms_median <= sampled.latency_ms_ci95_high)).all()
    assert set(sampled.stopped_by) <= {"precision", "budget", "min_rounds", "max_rounds"}
    assert set(few.stopped_by) <= {"call_exceeds_budget", "first_call"} and (few.latency_ms_median > 20).all()
    # sdpa's fused calls (sub-ms here, a few ms on a loaded machine) are always sampled: chosen by backend, not by a
    # latency threshold that another process's load would move.
    fused = ok[ok.backend.isin(["sdpa", "sdpa-flash"])]
    assert len(fused) == 8 and (fused.samples >= 6).all() and fused.latency_ms_ci95_low.notna().all()
    # `attnbench run` runs its workers' loop without pytest: pytest-benchmark's files are `pytest suites/`'s
    # (tests/test_pytest_benchmark_contract.py checks that they hold the records' samples).
    assert not list(run_dir.glob("pytest-benchmark-*.json"))
    env = json.loads((run_dir / "env.json").read_text())
    assert env["before"]["torch"] and env["before"]["cpu_model"]
