"""Another process on the GPU during a row's timed samples makes the row contended: NVML's process list read around the samples, with a fake NVML."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from harness.backends.registry import load_registry
from harness.execution.execute import PairRunner, execute
from harness.execution.resources import PairResources
from harness.measure.contention import with_gpu_processes
from harness.measure.timing import Budget
from harness.suite.cases import Case
from harness.telemetry import nvml
from harness.telemetry.gpu_state import DeviceUse, GpuReading, NvmlTelemetry, StateSampler, Telemetry, other_processes
from harness.telemetry.session import TelemetrySession

#: Functions pynvml really exports, from nvidia-ml-py 12.560.30's pynvml.py (github.com/XuehaiPan/nvidia-ml-py, a mirror
#: of NVIDIA's releases, commit 51b9f1363c753ba855424a9c03f8eabe05ccb784): `def nvmlDeviceGetComputeRunningProcesses(handle)`
#: returns a list of process infos (c_nvmlProcessInfo_v3_t: pid, usedGpuMemory, gpuInstanceId, computeInstanceId) and
#: `def nvmlDeviceGetUtilizationRates(handle)` a c_nvmlUtilization_t (gpu, memory, in %).
REAL_PYNVML = frozenset({
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetUtilizationRates",
})
OWN, PARENT = os.getpid(), os.getppid()


def _process(pid: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=512 << 20, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


class FakePynvml:
    """pynvml's process and utilisation calls, answering from lists (one answer per call, the last repeated); records each name asked for."""

    def __init__(self, processes=((OWN,),), gpu_pct=(35,)):
        self.processes, self.gpu_pct, self.asked = [list(p) for p in processes], list(gpu_pct), []

    def __getattr__(self, name):
        self.asked.append(name)
        if name == "nvmlDeviceGetComputeRunningProcesses":
            return lambda handle: [_process(pid) for pid in (self.processes.pop(0) if len(self.processes) > 1 else self.processes[0])]
        if name == "nvmlDeviceGetUtilizationRates":
            return lambda handle: SimpleNamespace(gpu=self.gpu_pct.pop(0) if len(self.gpu_pct) > 1 else self.gpu_pct[0], memory=10)
        raise AttributeError(name)


def test_the_nvml_functions_called_are_ones_pynvml_exports():
    fake = FakePynvml()
    NvmlTelemetry(fake, "handle").device_use()
    assert {nvml.COMPUTE_PROCESSES, nvml.UTILIZATION} <= REAL_PYNVML
    assert fake.asked and set(fake.asked) <= REAL_PYNVML


def test_device_use_reads_the_pids_and_the_gpu_percentage():
    use = NvmlTelemetry(FakePynvml(processes=[(OWN, 4242)], gpu_pct=[87]), "handle").device_use()
    assert use == DeviceUse(frozenset({OWN, 4242}), 87.0)


@pytest.mark.parametrize("nv", [
    SimpleNamespace(),  # an nvidia-ml-py without either function
    SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda h: (_ for _ in ()).throw(RuntimeError("NVML_ERROR_NOT_SUPPORTED")),
                    nvmlDeviceGetUtilizationRates=lambda h: (_ for _ in ()).throw(RuntimeError("NVML_ERROR_NOT_SUPPORTED"))),
    SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda h: [object()], nvmlDeviceGetUtilizationRates=lambda h: object()),
], ids=["missing", "not-supported", "odd-answers"])
def test_nvml_that_cannot_tell_is_none_not_a_crash(nv):
    assert NvmlTelemetry(nv, "handle").device_use() == DeviceUse(None, None)


def test_other_processes_leave_out_the_harness_own_and_say_none_when_nvml_cannot_tell():
    own = frozenset({OWN, PARENT})
    assert other_processes([frozenset({OWN}), frozenset({OWN})], own) == 0
    assert other_processes([frozenset({OWN, PARENT}), frozenset({OWN})], own) == 0  # the supervisor waiting on its worker
    assert other_processes([frozenset({OWN}), frozenset({OWN, 7, 8})], own) == 2
    assert other_processes([frozenset({OWN, 7}), frozenset({OWN})], own) == 1  # it left as the samples ended: it ran during them
    # In a container NVML names processes by the host's pids: one of those listed is this one.
    assert other_processes([frozenset({91001}), frozenset({91001})], own) == 0
    assert other_processes([frozenset({91001, 91002})], own) == 1
    assert other_processes([frozenset(), frozenset()], own) is None  # this process is on the device: NVML hides the list
    assert other_processes([None, None], own) is None


def test_gpu_processes_make_a_row_contended_and_leave_the_cpu_verdict_otherwise():
    assert with_gpu_processes(False, 1) is True and with_gpu_processes(None, 3) is True
    assert with_gpu_processes(False, 0) is False and with_gpu_processes(True, 0) is True
    assert with_gpu_processes(False, None) is False and with_gpu_processes(None, None) is None


class BlindGpu:
    """A GpuTelemetry at full clock with no device_use (as a telemetry that cannot list processes)."""

    def read(self) -> GpuReading:
        return GpuReading(1980, 3201, 45, 300.0, 0)

    def sustained_sm_clock_mhz(self):
        return 1980

    def energy_mj(self):
        return None


class FakeGpu(BlindGpu):
    """A GpuTelemetry at full clock whose device_use answers from `uses` in turn."""

    def __init__(self, uses):
        self.uses = list(uses)

    def device_use(self) -> DeviceUse:
        return self.uses.pop(0)


def _window(gpu) -> object:
    sampler = StateSampler(Telemetry(gpu), period_s=None)
    sampler.around(lambda fn, **kw: [fn(), [1e-3]][-1])(lambda: None)
    return sampler.summary


def test_the_sampler_reads_who_is_on_the_device_as_the_samples_start_and_end():
    state = _window(FakeGpu([DeviceUse(frozenset({OWN}), 20.0), DeviceUse(frozenset({OWN, 555}), 96.0)]))
    assert state.other_processes == 1 and state.utilization_pct == 96.0
    assert state.columns()["gpu_other_processes"] == 1 and state.columns()["gpu_utilization_pct"] == 96.0
    quiet = _window(FakeGpu([DeviceUse(frozenset({OWN}), 30.0), DeviceUse(frozenset({OWN}), 31.0)]))
    assert quiet.other_processes == 0
    unknown = _window(BlindGpu())
    assert unknown.other_processes is None and unknown.utilization_pct is None and unknown.throttled is False


CASE = Case(B=1, S_q=64, S_kv=64, H=2, H_kv=2, d_k=16, d_v=16)
TINY = Budget(warmup_s=0.01, measure_s=0.05, min_rounds=6, max_rounds=50, precision=0.0)


def _run(gpu):
    resources = PairResources(TelemetrySession(open_gpu=lambda device: Telemetry(gpu)))
    return execute(CASE, load_registry().get("naive"), PairRunner(budget=TINY, resources=resources))


def test_a_row_timed_beside_another_gpu_process_is_contended_with_its_cpu_evidence_kept():
    record = _run(FakeGpu([DeviceUse(frozenset({OWN, 31337}), 99.0), DeviceUse(frozenset({OWN, 31337}), 100.0)]))
    assert record.status.value == "ok" and record.gpu_other_processes == 1 and record.gpu_utilization_pct == 100.0
    assert record.contended is True
    assert record.involuntary_switches is not None and record.cpu_wall_ratio is not None  # the CPU's evidence is still the row's


def test_a_row_alone_on_its_gpu_keeps_the_cpu_verdict_and_says_zero_others(monkeypatch):
    from harness.measure import timing
    from harness.measure.contention import CpuProbe, CpuReading

    # A CPU that reads quiet whatever the shared test machine is doing: the GPU's count alone is under test.
    clock = iter(range(10**6))
    quiet = CpuProbe(wall=lambda: float(next(clock)), cpu=time.process_time, switches=lambda: 0, run_wait=lambda: 0.0)
    monkeypatch.setattr(timing, "CpuProbe", lambda *a, **k: quiet)
    record = _run(FakeGpu([DeviceUse(frozenset({OWN}), 5.0), DeviceUse(frozenset({OWN}), 6.0)]))
    assert record.status.value == "ok" and record.gpu_other_processes == 0 and record.contended is False
