"""GPU state per row and energy per call, with a fake NVML (clocks that sag, reasons that appear, a coarse energy counter) and a fake RAPL sysfs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.backends.registry import load_registry
from harness.telemetry import energy, gpu_state, nvml
from harness.telemetry.energy import EnergyWindow, RaplEnergy, measure_energy, rapl_counter
from harness.execution.execute import PairRunner, Phases, execute
from harness.execution.resources import PairResources
from harness.telemetry.gpu_state import GpuReading, NvmlTelemetry, StateSampler, Telemetry, summarize
from harness.telemetry.session import TelemetrySession
from harness.measure.timing import Budget
from harness.results.store import RunWriter, load_run, write_csv
from harness.suite.cases import Case
from tests.h200_data import H200, needs_h200

H200_MAX_MHZ = 1980  # the H200's SM clock under load (shared/data/h200-2026-11-29/env.json, after the sweep)


class FakeGpu:
    """GpuTelemetry whose n-th reading is given by the lists (the last repeated), and an optional energy counter."""

    def __init__(self, sm=(H200_MAX_MHZ,), reasons=(0,), sustained=H200_MAX_MHZ, energy_mj=None):
        self.sm, self.reasons, self.sustained, self.energy = list(sm), list(reasons), sustained, energy_mj
        self.calls = 0

    def read(self) -> GpuReading:
        i = self.calls
        self.calls += 1
        pick = lambda values: values[min(i, len(values) - 1)]  # noqa: E731
        return GpuReading(pick(self.sm), 3201, 40 + min(i, 5), 300.0 + 10 * min(i, 5), pick(self.reasons))

    def sustained_sm_clock_mhz(self):
        return self.sustained

    def energy_mj(self):
        return self.energy() if self.energy else None


def _window(gpu: FakeGpu, period_s=None, busy_s=0.0):
    sampler = StateSampler(Telemetry(gpu), period_s=period_s)
    loop = sampler.around(lambda fn, **kw: [time.sleep(busy_s), fn(), [1e-3]][-1])
    loop(lambda: None, setup=None, rounds=1, iterations=1)
    return sampler.summary


# -- state per row ---------------------------------------------------------------------------------
def test_clocks_that_sag_mid_window_mark_the_row_throttled_with_the_clock_it_fell_to():
    # Only the background readings (the 2nd to 4th) see the sag: the window's first and last readings are at full clock.
    gpu = FakeGpu(sm=[H200_MAX_MHZ, 1410, 1410, 1410, H200_MAX_MHZ])
    state = _window(gpu, period_s=0.002, busy_s=0.05)
    assert state.readings > 2 and state.throttled is True
    assert state.sm_clock_mhz_min == 1410 and "SM clock fell to 1410 MHz, below the sustained 1980 MHz" in state.throttle_reason
    assert state.temperature_c_max >= 41 and state.mem_clock_mhz_median == 3201


def test_a_thermal_reason_that_appears_marks_the_row_throttled_even_at_full_clock():
    state = _window(FakeGpu(reasons=[0x0, 0x20]))
    assert state.throttled is True and state.throttle_reasons == 0x20
    assert state.throttle_reason == "NVML reported SW thermal slowdown (0x20)"


def test_the_idle_bit_alone_at_full_clock_is_not_throttling():
    state = _window(FakeGpu(reasons=[0x1, 0x1]))
    assert state.throttled is False and state.throttle_reason is None and state.throttle_reasons == 0x1


def test_a_clock_within_the_tolerance_of_the_sustained_one_is_not_throttling():
    assert summarize([GpuReading(1965, 3201, 50, 400.0, 0)], H200_MAX_MHZ).throttled is False
    assert summarize([GpuReading(1900, 3201, 50, 400.0, 0)], H200_MAX_MHZ).throttled is True


def test_a_cpu_row_has_no_state_and_says_why():
    state = StateSampler(gpu_state.open_telemetry("cpu")).stop()
    assert state.throttled is None and state.unavailable == gpu_state.NO_GPU


def test_nvml_telemetry_calls_pynvml_by_its_names_and_converts_milliwatts():
    calls = []

    def fn(name, value):
        return lambda *args: calls.append(name) or value

    nv = SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_ID_APP_CLOCK_TARGET=1,
        nvmlDeviceGetClockInfo=lambda h, kind: {1: 1980, 2: 3201}[kind], nvmlDeviceGetTemperature=fn("temp", 41),
        nvmlDeviceGetPowerUsage=fn("power", 125643), nvmlDeviceGetCurrentClocksThrottleReasons=fn("reasons", 0x4),
        nvmlDeviceGetTotalEnergyConsumption=fn("energy", 123456789), nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetClock=lambda h, kind, which: 1755,
    )
    gpu = NvmlTelemetry(nv, "handle")
    assert gpu.read() == GpuReading(1980, 3201, 41, 125.643, 0x4)  # an older nvidia-ml-py: "throttle" reasons, not "event"
    assert gpu.energy_mj() == 123456789 and gpu.sustained_sm_clock_mhz() == 1755  # application clocks set below the maximum


def test_the_nvml_device_is_the_cuda_devices_uuid_not_its_index():
    nv = SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda uuid: f"by-uuid {uuid}", nvmlDeviceGetHandleByIndex=lambda i: f"by-index {i}")
    assert nvml.nvml_handle(nv, "0b4a-77", 0) == "by-uuid GPU-0b4a-77"
    assert nvml.nvml_handle(nv, None, 0) == "by-index 0"
    assert nvml.nvml_handle(nv, None, 1, visible=["2", "5"]) == "by-index 5"  # CUDA's device 1 is the machine's GPU 5
    assert nvml.nvml_handle(nv, None, 0, visible=["GPU-aa11"]) == "by-uuid GPU-aa11"
    nobody = SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda uuid: (_ for _ in ()).throw(RuntimeError("not found")))
    with pytest.raises(LookupError, match="cannot tell which NVML device"):
        nvml.nvml_handle(nobody, None, 0, visible=["MIG-x"])


# -- energy per call -------------------------------------------------------------------------------
class CoarseCounter:
    """A 100 W device whose counter steps every 50 ms of a fake clock that each call advances by 1 ms (integer µs: exact)."""

    name = "fake-nvml"

    def __init__(self, step_us=50_000, watts=100):
        self.now_us, self.step_us, self.watts = 0, step_us, watts

    def call(self):
        self.now_us += 1000

    def wall(self):
        return self.now_us / 1e6

    def read_mj(self):
        return (self.now_us // self.step_us) * self.step_us * self.watts / 1000  # W·µs = µJ; /1000 → mJ


def test_energy_between_two_updates_of_a_coarse_counter_is_right_per_call_in_watts_and_per_joule():
    counter = CoarseCounter()
    result = measure_energy(counter.call, counter, call_s=1e-3, window=EnergyWindow(min_s=0.3, max_s=1.0, min_updates=5), wall=counter.wall)
    assert result.reason is None and result.updates == 6 and result.window_s == pytest.approx(0.3)
    assert result.calls == 300 and result.energy_mj == pytest.approx(30_000)
    columns = result.columns(flops=2e9)
    assert columns["energy_mj_per_call"] == pytest.approx(100.0)  # 100 W × 1 ms
    assert columns["avg_power_w"] == pytest.approx(100.0)
    assert columns["gflop_per_joule"] == pytest.approx(20.0)  # 2 GFLOP per 0.1 J
    assert columns["energy_counter"] == "fake-nvml" and columns["energy_window_s"] == pytest.approx(0.3)


def test_too_short_a_window_for_the_counter_gives_no_figure_and_says_why():
    counter = CoarseCounter()
    result = measure_energy(counter.call, counter, call_s=1e-3, window=EnergyWindow(min_s=0.1, max_s=0.2, min_updates=5), wall=counter.wall)
    assert result.mj_per_call is None and result.columns(2e9)["gflop_per_joule"] is None
    assert "moved 3 times in 0.15 s (fewer than 5)" in result.reason  # changes at 0.10, 0.15, 0.20 s after one at 0.05


def test_a_counter_that_never_moves_gives_no_figure():
    counter = CoarseCounter(step_us=10**12)
    result = measure_energy(counter.call, counter, call_s=1e-3, window=EnergyWindow(min_s=0.1, max_s=0.2), wall=counter.wall)
    assert result.mj_per_call is None and "did not move" in result.reason


def _zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_packages_not_their_subzones_and_undoes_a_wrap_around(tmp_path):
    package0 = _zone(tmp_path, "intel-rapl:0", "package-0", 999_000, 1_000_000)
    package1 = _zone(tmp_path, "intel-rapl:1", "package-1", 10_000, 1_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 5, 1_000_000)  # inside package-0: not counted twice
    counter, reason = rapl_counter(tmp_path)
    assert reason is None and isinstance(counter, RaplEnergy) and counter.name == "rapl:package-0+package-1"
    start = counter.read_mj()
    (package0 / "energy_uj").write_text("3000\n")  # wrapped: 999,000 → 1,000,000 → 3,000 is 4,000 µJ
    (package1 / "energy_uj").write_text("16000\n")
    assert counter.read_mj() - start == pytest.approx(10.0)  # (4,000 + 6,000) µJ


def test_no_rapl_means_no_energy_phase_and_the_reason(tmp_path):
    assert rapl_counter(tmp_path / "absent") == (None, "no RAPL energy counters on this machine")
    calls = []
    found = TelemetrySession().energy_counter("cpu")
    result = energy.pair_energy(lambda: calls.append(1), "cpu", 1e-3, found) if found[0] is None else None
    if result is not None:  # this machine has no readable RAPL: not one call is made
        assert calls == [] and result.reason and result.mj_per_call is None


# -- through the executor into the record, the JSONL and the CSV ------------------------------------
CASE = Case(B=1, S_q=64, S_kv=64, H=2, H_kv=2, d_k=16, d_v=16)
TINY = Budget(warmup_s=0.01, measure_s=0.05, min_rounds=6, max_rounds=50, precision=0.0)


def _faked(gpu: FakeGpu) -> PairResources:
    """A runner's resources whose telemetry, on any device, is the fake GPU."""
    return PairResources(TelemetrySession(open_gpu=lambda device: Telemetry(gpu)))


def test_a_cpu_pair_timed_with_fake_gpu_telemetry_carries_its_state_and_energy_to_the_jsonl_and_csv(tmp_path, monkeypatch):
    began = time.perf_counter()
    fake = FakeGpu(sm=[H200_MAX_MHZ, 1500], reasons=[0x0, 0x40],
                   energy_mj=lambda: int((time.perf_counter() - began) / 0.01) * 1000.0)  # 100 W in 10 ms steps
    monkeypatch.setattr(energy, "CPU_WINDOW", EnergyWindow(min_s=0.1, max_s=3.0))  # room for 5 batches on a loaded 2-core machine
    record = execute(CASE, load_registry().get("naive"), PairRunner(budget=TINY, phases=Phases(energy=True), resources=_faked(fake)))
    assert record.status.value == "ok" and record.throttled is True and record.gpu_state_readings >= 2
    assert record.gpu_sm_clock_mhz_min == 1500 and record.gpu_throttle_reasons == 0x40
    assert "HW thermal slowdown" in record.throttle_reason and "1500 MHz" in record.throttle_reason
    assert record.energy_reason is None and record.energy_counter_updates >= 5 and record.energy_calls > 0
    assert 60 < record.avg_power_w < 160  # the fake's 100 W, read between changes seen at batch ends
    assert record.energy_mj_per_call == pytest.approx(record.avg_power_w * record.energy_window_s * 1e3 / record.energy_calls)
    assert record.gflop_per_joule == pytest.approx(record.flops / (record.energy_mj_per_call / 1e3) / 1e9)
    assert record.time_energy_s >= record.energy_window_s
    writer = RunWriter(tmp_path / "run")
    writer.append(record)
    frame = load_run(tmp_path / "run")
    assert bool(frame["throttled"].iloc[0]) and frame["energy_mj_per_call"].iloc[0] == pytest.approx(record.energy_mj_per_call)
    header = write_csv(tmp_path / "run").read_text().splitlines()[0].split(",")
    assert {"throttled", "throttle_reason", "gpu_sm_clock_mhz_min", "energy_mj_per_call", "avg_power_w", "gflop_per_joule"} <= set(header)


def test_a_plain_cpu_pair_says_why_it_has_no_gpu_state_and_spends_nothing_on_energy_without_a_counter(monkeypatch):
    monkeypatch.setattr(energy, "measure_energy", lambda *a, **k: pytest.fail("an energy phase ran without a counter"))
    no_rapl = PairResources(TelemetrySession(open_rapl=lambda: (None, "no RAPL energy counters on this machine")))
    record = execute(CASE, load_registry().get("naive"), PairRunner(budget=TINY, phases=Phases(energy=True), resources=no_rapl))
    assert record.gpu_state_reason == gpu_state.NO_GPU and record.throttled is None and record.gpu_sm_clock_mhz_min is None
    assert record.energy_reason == "no RAPL energy counters on this machine" and record.energy_mj_per_call is None
    assert record.energy_calls is None and record.time_energy_s is not None


def test_without_energy_asked_no_energy_phase_runs_and_the_row_says_how_to_get_one(monkeypatch):
    """On a GPU the phase costs 0.3-1 s a pair, several times the timed samples: `default` would take far longer, so it is asked for."""
    fake = FakeGpu(sm=[H200_MAX_MHZ], reasons=[0x0], energy_mj=lambda: pytest.fail("the energy counter was read without --energy"))
    monkeypatch.setattr(energy, "measure_energy", lambda *a, **k: pytest.fail("an energy phase ran without --energy"))
    record = execute(CASE, load_registry().get("naive"), PairRunner(budget=TINY, resources=_faked(fake)))
    assert record.status.value == "ok" and record.gpu_state_readings >= 2  # the state is read all the same
    assert record.energy_reason == energy.ENERGY_NOT_ASKED and "--energy" in record.energy_reason
    assert record.energy_mj_per_call is None and record.time_energy_s is None


def test_energy_travels_from_the_command_line_to_the_workers_and_ray_tasks(tmp_path):
    from harness.cli.main import build_parser
    from harness.results.documents import Manifest
    from harness.run.worker import run_phases

    assert build_parser().parse_args(["run", "--suite", "quick", "--energy"]).energy is True
    assert build_parser().parse_args(["run", "--suite", "quick"]).energy is False
    manifest = Manifest.from_dict({"run_id": "r", "energy": True, "timer": "kernels", "profile": True, "check": False}, "manifest.json")
    assert run_phases(manifest) == Phases(check=False, timer="kernels", energy=True, profile=True)
    assert run_phases(Manifest.from_dict({"run_id": "r"}, "manifest.json")) == Phases()


def test_env_records_whether_application_clocks_were_set_away_from_their_default():
    from harness.telemetry.nvml import CLOCKS_LOCKED_NOTE, application_clocks

    def reader(clocks):
        return lambda name, args=(): clocks.get(args) if name == "nvmlDeviceGetClock" else None

    default = {("NVML_CLOCK_SM", "NVML_CLOCK_ID_APP_CLOCK_TARGET"): 1980, ("NVML_CLOCK_SM", "NVML_CLOCK_ID_APP_CLOCK_DEFAULT"): 1980,
               ("NVML_CLOCK_MEM", "NVML_CLOCK_ID_APP_CLOCK_TARGET"): 3201, ("NVML_CLOCK_MEM", "NVML_CLOCK_ID_APP_CLOCK_DEFAULT"): 3201}
    assert application_clocks(reader(default))["clocks_locked"] is False
    locked = application_clocks(reader({**default, ("NVML_CLOCK_SM", "NVML_CLOCK_ID_APP_CLOCK_TARGET"): 1410}))
    assert locked["clocks_locked"] is True and locked["app_sm_clock_target_mhz"] == 1410 and locked["clocks_locked_note"] == CLOCKS_LOCKED_NOTE
    assert application_clocks(reader({}))["clocks_locked"] is None  # NVML would not say


@needs_h200
def test_the_h200s_own_readings_a_clock_still_at_idle_is_throttled_and_the_clock_after_the_sweep_is_not():
    env = json.loads((H200 / "env.json").read_text())

    def reading(gpu):
        return GpuReading(gpu["sm_clock_mhz"], gpu["mem_clock_mhz"], gpu["temperature_c"], gpu["power_w"], gpu["throttle_reasons"])

    before, after = env["telemetry_before"][0], env["telemetry_after"][0]
    cold = summarize([reading(before)], before["max_sm_clock_mhz"])  # 345 MHz, GPU idle (0x1): what a first pair could meet
    assert cold.throttled is True and cold.throttle_reason == "SM clock fell to 345 MHz, below the sustained 1980 MHz"
    hot = summarize([reading(after)], after["max_sm_clock_mhz"])  # 1980 MHz, no reason
    assert hot.throttled is False and hot.power_w_mean == pytest.approx(125.643)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_energy_reaches_the_workers_phase(tmp_path, monkeypatch):
    """`run --energy` is in the manifest, the worker's phases and every row's repro; without it the rows say how to ask."""
    from harness.cli.main import main
    from harness.results.store import read_records

    suite = tmp_path / "tiny.toml"
    suite.write_text('name = "tiny"\nbackends = ["naive"]\n[budget]\nwarmup_s = 0.001\nmeasure_s = 0.005\nmin_sample_s = 0.0\n'
                     '[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n')
    for asked in (True, False):
        run_id = f"energy-{asked}"
        assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", run_id, "--quiet", *(["--energy"] if asked else [])]) == 0
        (row,) = read_records(tmp_path / run_id / "records.jsonl").records
        manifest = json.loads((tmp_path / run_id / "manifest.json").read_text())
        assert manifest["energy"] is asked and ("--energy" in row["repro"]) is asked
        if asked:  # this machine may have RAPL or not; either way the phase ran and says what it found
            assert row["energy_reason"] != energy.ENERGY_NOT_ASKED and row["time_energy_s"] is not None
        else:
            assert row["energy_reason"] == energy.ENERGY_NOT_ASKED and row["time_energy_s"] is None
