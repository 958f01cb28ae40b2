"""`python -m harness.child JOB`: the one entry point of the harness's child processes, and the commands that start them.

The CUDA-only jobs (gpu-check on a GPU, profile-ncu) cannot run here: their commands are checked
as data, and the jobs that run on the CPU (peaks, stability, gpu-check --device cpu) run for real.
"""

import inspect
import json
import sys

import pytest
import torch

from harness import child
from harness.process import jobs
from harness.errors import UserError
from harness.run import rundir
from harness.process.children import ChildResult, child_command, run_child
from tests.cli_runs import Ran, assert_one_line_error

CASE_ID = "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32"
CHILD_ERROR = "attnbench child: error: "


def test_every_job_in_the_table_is_a_function_of_its_own_argv():
    assert {"gpu-check", "profile-ncu", "stability", "peaks"} <= set(jobs.JOBS)
    for job in jobs.JOBS:
        function = jobs.job_function(job)
        assert list(inspect.signature(function).parameters) == ["argv"], job


def test_a_childs_command_is_harness_child_with_this_interpreter_and_an_unknown_job_is_a_bug():
    assert child_command("peaks", "--device", "cuda") == [sys.executable, "-m", "harness.child", "peaks", "--device", "cuda"]
    with pytest.raises(ValueError, match="no job 'nosuch'"):
        child_command("nosuch")


@pytest.mark.parametrize("argv, words", [
    ([], ["no job named", "peaks"]),
    (["nosuch"], ["unknown job 'nosuch'", "gpu-check, profile-ncu, stability, peaks"]),
    (["peaks", "--nosuch"], ["unrecognized arguments: --nosuch"]),
    (["peaks", "--device", "tpu"], ["invalid choice: 'tpu'"]),
    (["stability", CASE_ID, "--backend", "naive", "--measure-s", "0.1"], ["--device"]),
    (["gpu-check", "naive", "--device", "tpu"], ["invalid choice: 'tpu'"]),
    (["profile-ncu", CASE_ID], ["--backend"]),
], ids=["no-job", "unknown-job", "unknown-option", "bad-device", "stability-without-device", "gpu-check-bad-device", "ncu-without-backend"])
def test_a_usage_error_of_a_child_is_one_line_and_exit_2(capsys, argv, words):
    assert_one_line_error(Ran(child.main(argv), *capsys.readouterr()), *words, prefix=CHILD_ERROR)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_the_gpu_check_job_refuses_in_one_line_without_cuda(capsys):
    assert_one_line_error(Ran(child.main(["gpu-check", "naive"]), *capsys.readouterr()), "no CUDA device is present", prefix=CHILD_ERROR)


@pytest.mark.slow
def test_the_stability_job_measures_in_a_fresh_process():
    done = run_child(child_command("stability", CASE_ID, "--device", "cpu", "--backend", "naive", "--measure-s", "0.02"), timeout_s=300)
    assert done.ok, done.describe()
    (record,) = done.objects
    assert record["case_id"] == CASE_ID and record["backend"] == "naive" and record["status"] == "ok"
    assert record["latency_ms_median"] > 0


def test_the_gpu_check_job_runs_one_backend_on_the_cpu(capsys):
    assert child.main(["gpu-check", "naive", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    from harness.checks.gpu import cases_for

    assert len(rows) == len(cases_for("naive", "cpu")) and {r["backend"] for r in rows} == {"naive"}
    # Every case runs but the FP8 one, which naive refuses with its reason (it has no FP8 kernel).
    refused = [r for r in rows if r["status"] != "ok"]
    assert [(r["status"], r["dtype"]) for r in refused] == [("unsupported", "fp8_e4m3")] and "no FP8 kernel" in refused[0]["reason"]


@pytest.mark.slow
def test_the_cuda_peaks_are_measured_by_the_peaks_job_as_the_run_folder_builds_it(tmp_path, monkeypatch):
    started = []

    def capture(command, timeout_s=None, env=None):
        started.append(list(command))
        return ChildResult(1, (), "not started: captured by the test")

    monkeypatch.setattr(rundir, "run_child", capture)
    path = rundir.write_peaks(tmp_path, "cuda", ["bf16"])
    (command,) = started
    assert command[:4] == [sys.executable, "-m", "harness.child", "peaks"]
    assert command[4:] == ["--device", "cuda", "--dtypes", "bf16", "--out", str(path)]
    assert "peak measurement failed (exit 1: not started" in json.loads(path.read_text())["errors"]["measure"]
    # The same command, on the CPU and in fp32, runs for real: the job accepts what write_peaks builds.
    on_cpu = [{"cuda": "cpu", "bf16": "fp32"}.get(arg, arg) for arg in command]
    done = run_child(on_cpu, timeout_s=300)
    assert done.returncode == 0, done.describe()
    peaks = json.loads(path.read_text())
    assert peaks["device"] == "cpu" and peaks["matmul"]["fp32"]["tflops"] > 0 and peaks["copy"]["gbps"] > 0


def test_gpu_check_starts_each_backend_as_the_gpu_check_job_fresh_on_cuda_forked_on_a_cpu(monkeypatch):
    from harness.checks import gpu as gpu_check
    from harness.process import children, forkserver

    started = []

    def fresh(command, timeout_s=None, env=None):
        started.append(("fresh", list(command), timeout_s))
        return ChildResult(1, (), "captured")

    def forked(argv, env, timeout_s=None):
        started.append(("forked", list(argv), timeout_s))
        return ChildResult(1, (), "captured")

    monkeypatch.setattr(children, "run_child", fresh)
    monkeypatch.setattr(forkserver, "run_forked_job", forked)
    (row,) = gpu_check._child("sdpa-cudnn", "cuda", 42.0)
    assert started == [("fresh", child_command("gpu-check", "sdpa-cudnn", "--device", "cuda"), 42.0)]
    assert row.status == "crashed" and "exit 1: captured" in row.reason
    started.clear()
    gpu_check._child("naive", "cpu", 42.0)  # CUDA cannot be used in a fork of a process that initialised it; a CPU child can
    assert started == [("forked", ["gpu-check", "naive", "--device", "cpu"], 42.0)]


def test_stability_starts_each_measurement_as_the_stability_job(monkeypatch):
    from harness.checks import stability
    from harness.suite.cases import parse_case_id

    started = []

    def capture(command, timeout_s=None, env=None):
        started.append(list(command))
        return ChildResult(1, (), "captured")

    monkeypatch.setattr(stability, "run_child", capture)
    with pytest.raises(UserError, match="exit 1: captured"):
        stability.measure_in_fresh_process(parse_case_id(CASE_ID, "cpu"), "naive", 0.25)
    assert started == [child_command("stability", CASE_ID, "--device", "cpu", "--backend", "naive", "--measure-s", "0.25")]


def test_profile_runs_the_profile_ncu_job_under_ncu(monkeypatch):
    from harness.process import children
    from harness.profiling import ncu
    from harness.run import profile_pair
    from harness.suite.cases import parse_case_id

    started = []

    def capture(command, timeout_s=None, env=None):
        started.append(list(command))
        return ChildResult(1, (), "captured")

    monkeypatch.setattr(ncu, "ncu_available", lambda: None)
    monkeypatch.setattr(ncu, "current_capability", lambda: (9, 0))
    monkeypatch.setattr(children, "run_child", capture)
    case = parse_case_id(CASE_ID, "cpu").replace(device="cuda", mode="bwd")
    assert profile_pair.ncu_kernels(case, "sdpa").why_not == "failed (exit 1: captured)"
    (command,) = started
    assert command[0] == "ncu" and "--profile-from-start" in command
    expected = child_command("profile-ncu", case.id, "--backend", "sdpa")
    assert command[-len(expected):] == expected
