"""What a runner's resources open is opened once for its pairs, released by close(), and opened afresh after it.

NVML is a fake module counting its initialisations and shutdowns; the driver's environment is a dict.
"""

from __future__ import annotations

import sys
import types

import pytest

from harness.execution.resources import PairResources
from harness.measure.timers import FlushBuffer, between_sample_setup
from harness.telemetry import gpu_state, nvml
from harness.telemetry.gpu_state import NO_GPU, NvmlTelemetry, Telemetry
from harness.telemetry.session import TelemetrySession


def _counting_pynvml() -> types.ModuleType:
    """A pynvml whose nvmlInit/nvmlShutdown calls are counted in `.inits` and `.shutdowns`."""
    mod = types.ModuleType("pynvml")
    mod.inits = mod.shutdowns = 0

    def init():
        mod.inits += 1

    def shutdown():
        mod.shutdowns += 1

    mod.nvmlInit, mod.nvmlShutdown = init, shutdown
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    mod.nvmlSystemGetDriverVersion = lambda: "550.54"
    return mod


def _nvml_opener(pynvml: types.ModuleType, opened: list[str]):
    """An `open_gpu` that opens a real NvmlSession on the fake module, noting each device it opens."""
    def open_gpu(device: str) -> Telemetry:
        opened.append(device)
        session = nvml.NvmlSession.start(pynvml)
        return Telemetry(NvmlTelemetry(pynvml, "handle"), session=session)

    return open_gpu


def test_a_session_opens_nvml_once_for_its_pairs_and_close_releases_it_then_a_new_use_reopens():
    pynvml, opened = _counting_pynvml(), []
    session = TelemetrySession(open_gpu=_nvml_opener(pynvml, opened))
    first = session.telemetry("cuda")
    assert session.telemetry("cuda") is first and opened == ["cuda"] and pynvml.inits == 1
    session.close()
    assert pynvml.shutdowns == 1 and first.session.closed
    session.close()  # nothing left to release
    assert pynvml.shutdowns == 1
    assert session.telemetry("cuda") is not first and opened == ["cuda", "cuda"] and pynvml.inits == 2
    with session:
        pass
    assert pynvml.shutdowns == 2


def test_a_cpu_device_opens_no_nvml_and_says_why():
    telemetry = TelemetrySession(open_gpu=gpu_state.open_telemetry).telemetry("cpu")
    assert telemetry.gpu is None and telemetry.reason == NO_GPU and telemetry.session is None


def test_nvml_that_starts_but_cannot_name_the_device_is_shut_down_again(monkeypatch):
    pynvml = _counting_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    monkeypatch.setattr(nvml.NvmlSession, "cuda_device_handle", lambda self: (_ for _ in ()).throw(RuntimeError("no CUDA device")))
    telemetry = gpu_state.open_nvml()
    assert telemetry.gpu is None and telemetry.reason == "NVML did not start: no CUDA device"
    assert pynvml.inits == pynvml.shutdowns == 1


def test_the_rapl_counter_is_one_per_session_until_it_is_closed():
    opened = []
    session = TelemetrySession(open_rapl=lambda: opened.append(1) or (None, "no RAPL energy counters on this machine"))
    assert session.energy_counter("cpu") == (None, "no RAPL energy counters on this machine")
    session.energy_counter("cpu")
    assert opened == [1]
    session.close()
    session.energy_counter("cpu")
    assert opened == [1, 1]


def test_the_env_snapshot_holds_its_own_nvml_session_for_its_length_only(monkeypatch):
    from harness.telemetry.nvml import gpu_telemetry

    pynvml = _counting_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    worker = nvml.NvmlSession.start(pynvml)  # a worker's long session, open beside the snapshot's
    (gpu,) = gpu_telemetry()
    assert gpu["driver"] == "550.54" and gpu["index"] == 0
    assert pynvml.inits == 2 and pynvml.shutdowns == 1 and not worker.closed


def test_closing_a_runners_resources_closes_its_telemetry_and_its_flush_buffer():
    pynvml, opened = _counting_pynvml(), []
    resources = PairResources(TelemetrySession(open_gpu=_nvml_opener(pynvml, opened)), FlushBuffer())
    resources.telemetry.telemetry("cuda")
    resources.flush._flusher = object()  # stands for the CUDA buffer this CPU machine cannot make
    with resources:
        pass
    assert pynvml.shutdowns == 1 and resources.flush._flusher is None


def test_a_cpu_pair_makes_no_flush_buffer():
    flush = FlushBuffer()
    assert between_sample_setup("cpu", flush) is None and flush._flusher is None


@pytest.mark.parametrize("address, environ, expected", [
    (None, {}, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}),  # a Ray the run starts itself: loopback only
    ("10.0.0.1:6379", {}, {}),  # a cluster's own address: left as it is
    (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, {"RAY_ADDRESS": "10.0.0.1:6379"}),
    (None, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}),  # the user's own setting wins
])
def test_the_process_turns_ray_driver_with_a_loopback_only_ray_unless_it_joins_a_cluster(address, environ, expected):
    from harness.run.ray_executor import become_driver
    from harness.run.supervisor import RunConfig

    become_driver(RunConfig(suite="quick", executor="ray", ray_address=address), environ)
    assert environ == expected
