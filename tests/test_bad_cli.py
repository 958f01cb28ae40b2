"""Careless command lines: each gives one line naming the problem and exit 2; a full disk stops a run resumably."""

import json
import os
import resource
from pathlib import Path

import pytest
import torch

from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from harness.cli.main import main
from harness.run.rundir import MANIFEST
from tests.cli_runs import assert_one_line_error, attnbench, refused, write_suite

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-pair run to misuse."""
    out = tmp_path_factory.mktemp("runs")
    suite = write_suite(out / "one.toml", ["naive"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(out), "--run-id", "done", "--quiet"]) == 0
    return out / "done"


@pytest.mark.e2e
@pytest.mark.parametrize("extra, words", [
    (["--suite", "quick"], ["--suite/--model cannot change it"]),
    (["--force"], ["--force"]),
    (["--backends", "sdpa"], ["--backends"]),
    (["--only", "x", "--no-check"], ["--only", "--no-check"]),
], ids=["suite", "force", "backends", "only-and-no-check"])
def test_resume_refuses_options_that_would_be_ignored(finished_run, capsys, extra, words):
    refused(capsys, ["run", "--resume", str(finished_run), "--quiet", *extra], words)


def test_resume_refuses_a_folder_whose_rows_come_from_another_run(finished_run, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in (MANIFEST, "records.jsonl", "suite.toml"):
        (mixed / name).write_bytes((finished_run / name).read_bytes())
    manifest = json.loads((mixed / MANIFEST).read_text())
    manifest["run_id"] = "mixed"
    (mixed / MANIFEST).write_text(json.dumps(manifest))
    refused(capsys, ["run", "--resume", str(mixed), "--quiet"], ["not pairs of run mixed", "mixes runs"])


def test_a_finished_run_leaves_no_claims_pending_list_or_current_files(finished_run):
    left = sorted(p.name for p in finished_run.iterdir())
    assert "claims" not in left and "pending.txt" not in left and not [n for n in left if n.endswith(".current")], left


@pytest.mark.parametrize("argv, words", [
    (["report", "{run}", "--baseline", "nosuch", "--out", "{tmp}"], ["--baseline 'nosuch' has no row", "naive"]),
    (["compare", "{run}", "{run}", "--out", "{tmp}"], ["is a folder"]),
    (["run", "--suite", "{suite}", "--out", "{suite}", "--quiet"], ["cannot create run folder", "Not a directory"]),
    (["run", "--suite", "{suite}", "--out", "{suite}/under", "--quiet"], ["cannot create run folder"]),
    (["stability", "--B", "1", "--S", "8", "--H", "2", "--d-k", "0"], ["d_k must be a positive integer, got 0"]),
], ids=["baseline-names-no-backend", "compare-out-is-a-folder", "out-is-a-file", "out-under-a-file", "stability-dk-0"])
def test_bad_paths_and_values_are_one_line(finished_run, tmp_path, capsys, argv, words):
    suite = write_suite(tmp_path / "s.toml", ["naive"], [8])
    argv = [a.format(run=finished_run, tmp=tmp_path, suite=suite) for a in argv]
    refused(capsys, argv, words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("argv", [["check", "--device", "cuda"], ["stability", "B1-Sq8-Skv8-H2-Hkv2-dk16-fp32", "--device", "cuda"]])
def test_cuda_without_a_gpu_is_one_line(capsys, argv):
    refused(capsys, argv, ["torch sees no CUDA device"])


@pytest.mark.parametrize("argv, words", [
    (["gpu-check", "--nosuch"], ["unrecognized arguments: --nosuch"]),
    (["gpu-check", "--cpu", "extra"], ["unrecognized arguments: extra"]),
    (["gpu-check", "--one", "naive"], ["unrecognized arguments: --one"]),  # the old hidden child flag: children are harness.child's jobs
    (["gpu-check", "--cpu", "--backends", ","], ["--backends", "expected a comma-separated list"]),
    (["gpu-check", "--cpu", "--backends", "naive,naive"], ["naive given more than once"]),
    (["profile", "B1-Sq8-Skv8-H2-Hkv2-dk16-fp32", "--ncu-child"], ["unrecognized arguments: --ncu-child"]),
], ids=["unknown-option", "stray-argument", "old-child-flag", "empty-backends", "backend-twice", "profile-old-child-flag"])
def test_gpu_check_and_profile_usage_errors_are_one_line_like_every_other_command(capsys, argv, words):
    refused(capsys, argv, words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_check_without_a_gpu_is_one_line(capsys):
    refused(capsys, ["gpu-check"], ["no CUDA device is present", "gpu-check has nothing to check"])


def _file_size_limit(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.e2e
def test_a_full_disk_stops_the_run_in_one_line_and_leaves_it_resumable(tmp_path, capsys):
    suite = write_suite(tmp_path / "many.toml", ["naive", "sdpa"], [8, 16, 32, 64, 128, 256])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = ["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "r", "--quiet"]
    # 12 KiB per file: manifest, env and peaks fit, the records file fills up after a few rows (as ulimit -f does).
    cut = attnbench(command, env, timeout_s=300, preexec_fn=_file_size_limit(12 * 1024))
    assert_one_line_error(cut, "--resume")
    run = tmp_path / "r"
    kept = [json.loads(line) for line in (run / "records.jsonl").read_bytes().split(b"\n")[:-1]]
    assert 0 < len(kept) < 12
    # Resumed in this process, with no limit on file sizes (its worker is a subprocess as ever).
    assert main(["run", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    rows = read_records(run).records
    assert len(rows) == 12 and len({(r["case_id"], r["backend"]) for r in rows}) == 12
    assert {r["status"] for r in rows} == {"ok"}
