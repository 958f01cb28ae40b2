"""The GPU's state while a pair's timed samples ran: SM and memory clocks, temperature, power and throttle reasons.

NVML (nvidia-ml-py) is reached through one small seam, `GpuTelemetry` (its calls are harness.telemetry.nvml's,
the one NVML reader), so tests inject a fake and the harness never needs a GPU to be tested. `StateSampler` brackets the timed samples the way the
peak-memory meter does: one reading as they start, one as they end, and a background thread reading
every SAMPLE_PERIOD_S in between (at most MAX_READINGS). The thread costs the timed samples little:
ctypes releases the GIL for each NVML call, so the launching thread only waits for the thread's few
lines of Python every 20 ms, and CUDA samples are device time between events (the host's gaps are
covered by the clock's spin). It cannot be pinned off the launching core (the CPU's cores are shared
and not ours to assign), which is why it is slow rather than pinned.

A row is `throttled` when, in at least THROTTLED_SHARE of the window's readings, a power, thermal or hardware
slowdown reason (SLOWDOWN_BITS) was set or the SM clock was more than SUSTAINED_TOLERANCE below the device's sustained
clock: the clock NVML reports as the device's maximum, or the application clock target where an administrator set it
lower (then that is what the GPU is meant to run at). A throttled row decides no winner and no gate
(harness.analysis.trust), as nvbench discards samples taken below its throttle threshold; a dip in fewer readings is
named in `throttle_reason` but leaves the row trusted (a median moves little when a tenth of its samples are slowed). The idle bit (0x1) alone is not throttling; a clock still ramping from idle is.

As the window starts and as it ends, the sampler also asks NVML which compute processes are on the device and how busy
it is (`DeviceUse`): another process there during the samples shares the SMs and the memory bandwidth with the timed
calls, so the row is `contended` as a CPU row is when another process takes its cores.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

from harness.results.vocabulary import SLOWDOWN_BITS, THROTTLE_BITS, throttle_words  # noqa: F401 - re-exported
from harness.telemetry import nvml

SAMPLE_PERIOD_S = 0.02
MAX_READINGS = 500
#: A lowest SM clock this far below the sustained clock marks the row throttled (clocks move in ~15 MHz steps).
SUSTAINED_TOLERANCE = 0.03
#: The share of a window's readings that must be slowed (a slowdown reason set, or the SM clock below the sustained one) to
#: mark the row throttled: a clock still ramping from idle in the first reading of a long window moves its median little.
THROTTLED_SHARE = 0.1
#: What a CPU row says instead of GPU state.
NO_GPU = "no NVIDIA GPU: a CPU row has no GPU clocks, power or throttle reasons to read"



@dataclass(frozen=True)
class GpuReading:
    """One NVML reading: clocks in MHz, temperature in °C, power in W, and the throttle reason bits."""

    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None
    power_w: float | None
    throttle_reasons: int | None


@dataclass(frozen=True)
class DeviceUse:
    """Who is on the device now: the compute processes' pids and the GPU utilisation %, each None where NVML cannot tell."""

    pids: frozenset[int] | None
    utilization_pct: float | None


def other_processes(seen: Sequence[frozenset[int] | None], own: frozenset[int]) -> int | None:
    """How many processes besides the harness's `own` pids NVML listed on the device in any of `seen`, None when it could not tell."""
    known = [pids for pids in seen if pids is not None]
    if not known:
        return None
    pids = frozenset().union(*known)
    if pids & own:
        return len(pids - own)
    if not pids:
        # This process holds a context on the device while it is timed: a list without it is NVML hiding processes (MIG, no privileges).
        return None
    # Listed, but not under our pid: NVML names processes in another pid namespace (a container's), and one of them is this one.
    return len(pids) - 1


class GpuTelemetry(Protocol):
    """What the harness reads of the GPU a process runs on."""

    def read(self) -> GpuReading:
        """The device's state now."""
        ...

    def sustained_sm_clock_mhz(self) -> float | None:
        """The SM clock the device is meant to hold under load (None when NVML cannot say)."""
        ...

    def energy_mj(self) -> float | None:
        """The device's total-energy counter in mJ (None where the GPU has none)."""
        ...


class NvmlTelemetry:
    """GpuTelemetry over pynvml for one device handle."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.pynvml, self.handle = pynvml, handle

    def read(self) -> GpuReading:
        """Clocks, temperature, power and throttle reasons, each None where NVML refuses."""
        nv, h = self.pynvml, self.handle
        return GpuReading(
            sm_clock_mhz=nvml.call(nv, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
            mem_clock_mhz=nvml.call(nv, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM),
            temperature_c=nvml.call(nv, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
            power_w=nvml.watts(nvml.call(nv, "nvmlDeviceGetPowerUsage", h)),
            throttle_reasons=nvml.throttle_reasons(nv, h),
        )

    def energy_mj(self) -> float | None:
        """NVML's total energy since the driver loaded, in mJ (Volta and later)."""
        return nvml.call(self.pynvml, "nvmlDeviceGetTotalEnergyConsumption", self.handle)

    def device_use(self) -> DeviceUse:
        """The compute processes on the device and its utilisation now."""
        return DeviceUse(nvml.device_pids(self.pynvml, self.handle), nvml.utilization_pct(self.pynvml, self.handle))

    def sustained_sm_clock_mhz(self) -> float | None:
        """The device's maximum SM clock, or its application clock target where that is set lower."""
        nv, h = self.pynvml, self.handle
        top = nvml.call(nv, "nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_SM)
        target = nvml.call(nv, "nvmlDeviceGetClock", h, nv.NVML_CLOCK_SM, getattr(nv, "NVML_CLOCK_ID_APP_CLOCK_TARGET", 1))
        known = [c for c in (top, target) if c]
        return float(min(known)) if known else None


@dataclass(frozen=True)
class Telemetry:
    """This process's GPU telemetry, or why there is none; `close()` releases the NVML session it was opened on."""

    gpu: GpuTelemetry | None
    reason: str | None = None
    session: nvml.NvmlSession | None = field(default=None, compare=False, repr=False)

    def close(self) -> None:
        """Release the NVML session behind `gpu` (nothing to do for a fake or for none)."""
        if self.session is not None:
            self.session.close()


def open_nvml() -> Telemetry:
    """NVML for the current CUDA device, or the reason it cannot be read (no nvidia-ml-py, no driver); the caller closes it."""
    try:
        session = nvml.NvmlSession.start()
    except ImportError:
        return Telemetry(None, "nvidia-ml-py (pynvml) is not installed: no GPU clocks, power or energy per row")
    except Exception as exc:  # noqa: BLE001 - no driver: the rows say so
        return Telemetry(None, f"NVML did not start: {' '.join(str(exc).split())[:200]}")
    try:
        return Telemetry(NvmlTelemetry(session.pynvml, session.cuda_device_handle()), session=session)
    except Exception as exc:  # noqa: BLE001 - no device, or not one NVML can name: the rows say so
        session.close()
        return Telemetry(None, f"NVML did not start: {' '.join(str(exc).split())[:200]}")


def open_telemetry(device: str) -> Telemetry:
    """The telemetry of a device type, newly opened: NVML on CUDA, none (with the reason) on the CPU."""
    return open_nvml() if device.startswith("cuda") else Telemetry(None, NO_GPU)


@dataclass(frozen=True)
class StateSummary:
    """The GPU's state over one window, as a row stores it (units in the names), or why it was not read."""

    sm_clock_mhz_min: float | None = None
    sm_clock_mhz_median: float | None = None
    mem_clock_mhz_median: float | None = None
    temperature_c_max: float | None = None
    power_w_mean: float | None = None
    throttle_reasons: int | None = None
    readings: int = 0
    sustained_sm_clock_mhz: float | None = None
    throttled: bool | None = None
    throttle_reason: str | None = None
    unavailable: str | None = None
    other_processes: int | None = None
    utilization_pct: float | None = None

    def columns(self) -> dict[str, Any]:
        """The record's GPU state columns."""
        return {
            "gpu_sm_clock_mhz_min": self.sm_clock_mhz_min, "gpu_sm_clock_mhz_median": self.sm_clock_mhz_median,
            "gpu_mem_clock_mhz_median": self.mem_clock_mhz_median, "gpu_temperature_c_max": self.temperature_c_max,
            "gpu_power_w_mean": self.power_w_mean, "gpu_throttle_reasons": self.throttle_reasons,
            "gpu_state_readings": self.readings or None, "gpu_sustained_sm_clock_mhz": self.sustained_sm_clock_mhz,
            "throttled": self.throttled, "throttle_reason": self.throttle_reason, "gpu_state_reason": self.unavailable,
            "gpu_other_processes": self.other_processes, "gpu_utilization_pct": self.utilization_pct,
        }


def _values(readings: list[GpuReading], name: str) -> list[float]:
    return [float(v) for v in (getattr(r, name) for r in readings) if v is not None]


def summarize(readings: list[GpuReading], sustained_mhz: float | None) -> StateSummary:
    """Min/median SM clock, median memory clock, max temperature, mean power, OR-ed reasons, and the throttled verdict."""
    sm, mem, temp, power = (_values(readings, n) for n in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w"))
    masks = [r.throttle_reasons for r in readings if r.throttle_reasons is not None]
    reasons = functools.reduce(lambda a, b: a | b, masks, 0) if masks else None
    floor = sustained_mhz * (1 - SUSTAINED_TOLERANCE) if sustained_mhz else None
    is_low = [r.sm_clock_mhz is not None and floor is not None and r.sm_clock_mhz < floor for r in readings]
    slowed = sum(1 for r, low in zip(readings, is_low) if low or (r.throttle_reasons or 0) & SLOWDOWN_BITS)
    read = sum(1 for r in readings if r.sm_clock_mhz is not None or r.throttle_reasons is not None)
    low = sum(is_low)
    of = f" in {low} of {read} readings" if read > 1 else ""
    why = []
    if reasons is not None and reasons & SLOWDOWN_BITS:
        why.append(f"NVML reported {throttle_words(reasons & SLOWDOWN_BITS)} ({hex(reasons & SLOWDOWN_BITS)})")
    if low:
        why.append(f"SM clock fell to {min(sm):.0f} MHz, below the sustained {sustained_mhz:.0f} MHz{of}")
    judged = bool(sm) or reasons is not None
    return StateSummary(
        sm_clock_mhz_min=min(sm) if sm else None, sm_clock_mhz_median=statistics.median(sm) if sm else None,
        mem_clock_mhz_median=statistics.median(mem) if mem else None, temperature_c_max=max(temp) if temp else None,
        power_w_mean=statistics.fmean(power) if power else None, throttle_reasons=reasons, readings=len(readings),
        sustained_sm_clock_mhz=sustained_mhz, throttled=read > 0 and slowed >= THROTTLED_SHARE * read if judged else None,
        throttle_reason="; ".join(why) or None, unavailable=None if judged else "NVML returned no clock or throttle reason",
    )


@dataclass
class StateSampler:
    """Readings of one GPU over a window: at its start, its end, and every `period_s` between (None: no thread)."""

    telemetry: Telemetry
    period_s: float | None = SAMPLE_PERIOD_S
    readings: list[GpuReading] = field(default_factory=list)
    #: The last window's summary, set when `around`'s loop ends.
    summary: StateSummary | None = None
    #: The timing process, which NVML lists on the device beside any other, and its parent (a supervisor or the
    #: `stability` command), which waits for it: should it hold a context on the device, it runs nothing there meanwhile.
    own_pids: frozenset[int] = field(default_factory=lambda: frozenset({os.getpid(), os.getppid()}))

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uses: list[DeviceUse] = []

    def _read_use(self) -> None:
        # Only as the window starts and ends: listing processes costs more than a clock reading, and a rival lasts longer.
        read = getattr(self.telemetry.gpu, "device_use", None)  # a telemetry without it (a test's fake) cannot tell
        if read is not None:
            self._uses.append(read())

    def start(self) -> None:
        """Read once and start the background readings."""
        gpu = self.telemetry.gpu
        if gpu is None:
            return
        self._uses = []
        self._read_use()
        self.readings = [gpu.read()]
        self._stop.clear()
        if self.period_s:
            self._thread = threading.Thread(target=self._run, name="gpu-state-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s) and len(self.readings) < MAX_READINGS:
            self.readings.append(self.telemetry.gpu.read())  # type: ignore[union-attr]

    def stop(self) -> StateSummary:
        """Stop the thread, read once more, and summarise the window."""
        gpu = self.telemetry.gpu
        if gpu is None:
            return StateSummary(unavailable=self.telemetry.reason)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.readings.append(gpu.read())
        self._read_use()
        summary = summarize(self.readings, gpu.sustained_sm_clock_mhz())
        busy = [u.utilization_pct for u in self._uses if u.utilization_pct is not None]
        return replace(summary, other_processes=other_processes([u.pids for u in self._uses], self.own_pids) if self._uses else None,
                       utilization_pct=max(busy) if busy else None)

    def around(self, loop: Callable[..., list[float]]) -> Callable[..., list[float]]:
        """`loop` (a timing Loop) with this sampler running exactly while its rounds run."""
        def sampled(fn: Callable[[], object], **kwargs: Any) -> list[float]:
            self.start()
            try:
                return loop(fn, **kwargs)
            finally:
                self.summary = self.stop()

        return sampled
