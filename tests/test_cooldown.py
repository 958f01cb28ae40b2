"""`--cooldown`: the wait between pairs, against fake temperature sequences (no GPU here), and its wiring into the worker and the CLI."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.errors import UserError
from harness.backends.registry import load_registry
from harness.execution.execute import PairRunner, Phases
from harness.run.cooldown import AUTO_MAX_S, Cooldown, idle_temperature_c, nvml_index, parse_cooldown
from harness.run.worker import Finished, WorkerLoop
from harness.results.record import pair_key
from harness.suite.catalog import load_suite
from tests.cli_runs import write_suite


class FakeGpu:
    """Temperatures read in turn (the last one repeats), on a clock that only the cool-down's own sleeps advance."""

    def __init__(self, temperatures: list[float | None]) -> None:
        self.temperatures, self.now, self.reads = list(temperatures), 0.0, 0

    def read(self, index: int) -> float | None:
        self.reads += 1
        return self.temperatures.pop(0) if len(self.temperatures) > 1 else self.temperatures[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def cooldown(self, max_s: float, idle_c: float | None = 40.0) -> Cooldown:
        return Cooldown(max_s=max_s, index=0, idle_c=idle_c, tolerance_c=3.0, poll_s=1.0, read=self.read, sleep=self.sleep, clock=lambda: self.now)


def test_it_waits_until_the_gpu_is_back_near_its_idle_temperature():
    gpu = FakeGpu([70, 60, 50, 43, 41])
    waited = gpu.cooldown(max_s=30).wait()
    assert waited.seconds == pytest.approx(3.0) and waited.problem is None and gpu.reads == 4  # cool at the 4th reading


def test_a_gpu_that_never_cools_is_waited_for_at_most_the_limit_and_the_row_says_so():
    gpu = FakeGpu([80])
    waited = gpu.cooldown(max_s=5).wait()
    assert waited.seconds == pytest.approx(5.0)
    assert "gave up after 5 s" in waited.problem and "80 °C" in waited.problem and "idle 40 °C" in waited.problem


def test_without_an_idle_temperature_or_a_reading_it_says_why_instead_of_waiting():
    assert "no idle temperature" in FakeGpu([80]).cooldown(max_s=5, idle_c=None).wait().problem
    gpu = FakeGpu([None])
    waited = gpu.cooldown(max_s=5).wait()
    assert waited.seconds == 0 and "no temperature" in waited.problem


def test_the_idle_temperature_is_the_one_env_json_recorded_before_the_sweep(tmp_path):
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"telemetry_before": [{"index": 0, "temperature_c": 31}, {"index": 1, "temperature_c": 36}]}))
    assert idle_temperature_c(env, 1) == 36.0 and idle_temperature_c(env, 2) is None
    env.write_text(json.dumps({"telemetry_before": {"unavailable": "no NVML"}}))
    assert idle_temperature_c(env, 0) is None
    assert nvml_index({}) == 0 and nvml_index({"CUDA_VISIBLE_DEVICES": "3,1"}) == 3 and nvml_index({"CUDA_VISIBLE_DEVICES": ""}) is None


def test_cooldown_values():
    assert parse_cooldown(None) is None and parse_cooldown("auto") == AUTO_MAX_S and parse_cooldown("12.5") == 12.5
    for bad in ("0", "-3", "soon", "inf"):
        with pytest.raises(UserError, match="--cooldown"):
            parse_cooldown(bad)


@pytest.mark.parametrize("args, message", [
    (["--cooldown"], "a CPU run has no such reading"),
    (["--cooldown", "soon"], "--cooldown takes 'auto' or a number of seconds"),
])
def test_cooldown_mistakes_are_one_line(args, message, tmp_path, capsys):
    assert main(["run", "--suite", "quick", "--device", "cpu", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_the_worker_waits_before_each_pair_and_records_the_wait(tmp_path):
    suite = load_suite(str(write_suite(tmp_path / "two.toml", ["naive"], [8, 16])))
    gpu = FakeGpu([52, 48, 45, 42, 41])  # hot before the first pair (3 polls to cool), cool before the second
    loop = WorkerLoop("run", "0", PairRunner(budget=suite.budget, phases=Phases(check=False)), load_registry(),
                      cooldown=gpu.cooldown(30))
    seen = []
    for event in loop.events((pair_key(c, b), c, b) for c, b in suite.pairs(["naive"])):
        # The wait is over before the pair is announced: a cool-down never counts against the pair's --timeout.
        seen.append((type(event).__name__, gpu.now))
        if isinstance(event, Finished):
            seen[-1] += (event.record.case.S_q, event.record.cooldown_s)
    assert seen == [("Started", 3.0), ("Finished", 3.0, 8, 3.0), ("Started", 3.0), ("Finished", 3.0, 16, 0.0)]


def test_the_cooldown_reads_temperatures_through_one_nvml_session_of_the_one_nvml_reader(monkeypatch):
    """run/cooldown.py once called nvmlInit on every reading (and never nvmlShutdown) beside telemetry/nvml.py's sessions."""
    import sys
    import types

    from harness.run.cooldown import GpuTemperature

    fake = types.ModuleType("pynvml")
    fake.inits = 0
    fake.NVML_TEMPERATURE_GPU = 0
    fake.nvmlInit = lambda: setattr(fake, "inits", fake.inits + 1)
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    fake.nvmlDeviceGetTemperature = lambda handle, sensor: {0: 41, 3: 67}[handle[1]]
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: ("gpu", 3) if uuid == "GPU-abc" else None
    fake.nvmlDeviceGetIndex = lambda handle: handle[1]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    temperatures = GpuTemperature()
    assert nvml_index({"CUDA_VISIBLE_DEVICES": "GPU-abc,GPU-def"}, temperatures) == 3
    assert [temperatures(3), temperatures(0), temperatures(3)] == [67.0, 41.0, 67.0]
    assert fake.inits == 1  # one session for the worker's readings
    assert nvml_index({"CUDA_VISIBLE_DEVICES": "MIG-xyz"}, temperatures) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: every reading says it cannot say
    assert GpuTemperature()(0) is None
