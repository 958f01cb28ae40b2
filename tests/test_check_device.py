"""`attnbench check` picks a suite's cases for the device as `run` does: the CPU variant on a CPU, never the CUDA grid."""

from __future__ import annotations

import io

import pytest
import torch

from harness.backends.registry import load_registry
from harness.cli.check import run_cli
from harness.cli.main import main
from harness.execution.execute import missing_device, run_pair
from harness.results.record import Status
from harness.run.supervisor import _resolve_suite
from harness.suite.catalog import load_suite
from harness.suite.cases import Case

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's behaviour")]


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["train", "decode", "models"])
def test_check_of_a_cuda_suite_on_a_cpu_checks_its_cpu_variant_and_errs_on_no_pair(suite):
    cpu_cases = _resolve_suite(suite, "cpu")[0].cases  # what `attnbench run --suite S` runs here
    assert load_suite(suite).cpu_cases and all(c.device == "cpu" for c in cpu_cases)
    out = io.StringIO()
    status = run_cli(suite=suite, backends=["naive"], out=out)
    lines = out.getvalue().splitlines()
    summary = next(line for line in lines if line.endswith(("agree", "unsupported", "disagree", "error")) and " pairs: " in line)
    checked = {line.split()[0] for line in lines[1:] if line.split() and line.split()[0].startswith("B")}
    assert checked == {c.id for c in cpu_cases}
    assert "error" not in summary and "Cannot get CUDA" not in out.getvalue()
    assert status == 0, summary


def test_check_on_cuda_without_a_cuda_device_is_one_line_and_exit_2(capsys):
    assert main(["check", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attnbench: error: --device cuda asked for, but torch sees no CUDA device"]


def test_a_cuda_case_that_reaches_a_backend_here_is_unsupported_with_the_reason():
    case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, device="cuda")
    outcome = run_pair(case, load_registry().get("naive"))
    assert outcome.status is Status.UNSUPPORTED
    assert outcome.reason == missing_device(case) and "no CUDA device" in outcome.reason and "\n" not in outcome.reason
    assert missing_device(case.replace(device="cpu")) is None
