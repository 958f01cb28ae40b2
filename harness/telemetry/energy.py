"""Energy per call: a short energy phase after the timed samples, read on NVML's total-energy counter (GPU) or RAPL (CPU).

Why a phase of its own rather than the timed window: CUDA samples are each one call behind an L2
flush and a GPU spin, whose energy is not the call's, and the timed window (about 0.1 s) is shorter
than a few updates of NVML's counter, which moves every 20-100 ms on some GPUs. The phase calls the
step back to back in batches of about BATCH_S, synchronising and reading the counter after each
batch; it opens at the first change of the counter it sees and closes at the last change once
`min_s` has passed with at least `min_updates` changes, so the window lies on the counter's own
update grid. A counter that moves fewer times within `max_s` gives no figure, with the reason: a
coarse counter over a short window is noise. The figure is the board's (or the CPU package's)
whole energy per call, the static power included: what running this call in a loop costs (RAPL's
package counter also holds whatever else ran on the package meanwhile).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from harness.errors import one_line
from harness.errors import is_sticky_cuda_error
from harness.telemetry.gpu_state import Telemetry

#: A row's `energy_reason` when the run did not ask for the energy phase.
ENERGY_NOT_ASKED = "not measured: run with --energy (a phase of 0.3-1 s a pair on a GPU, 0.1-0.3 s on a CPU with RAPL)"
#: The host seconds of calls between two reads of the counter.
BATCH_S = 2e-3
MAX_BATCH_CALLS = 10_000
POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyWindow:
    """How long the energy phase runs: at least `min_s` and `min_updates` counter changes, never past `max_s`."""

    min_s: float
    max_s: float
    min_updates: int = 5


#: NVML's counter is coarse: 0.3 s holds 5 updates of a 60 ms counter; 1 s bounds what a pair may spend.
GPU_WINDOW = EnergyWindow(min_s=0.3, max_s=1.0)
#: RAPL counts in µJ about every millisecond: a tenth of a second is plenty.
CPU_WINDOW = EnergyWindow(min_s=0.1, max_s=0.3)


class EnergyCounter(Protocol):
    """A cumulative energy counter in mJ (only differences matter)."""

    name: str

    def read_mj(self) -> float | None:
        """The counter now, in mJ."""
        ...


class NvmlEnergy:
    """The GPU's total-energy counter through its telemetry."""

    name = "nvml-total-energy"

    def __init__(self, gpu: Any) -> None:
        self.gpu = gpu

    def read_mj(self) -> float | None:
        """NVML's total energy in mJ."""
        return self.gpu.energy_mj()


class RaplEnergy:
    """The CPU packages' RAPL counters (powercap `intel-rapl:N` zones), summed, wrap-around undone."""

    def __init__(self, zones: list[Path]) -> None:
        self.zones = zones
        self.name = "rapl:" + "+".join(_text(z / "name") or z.name for z in zones)
        self._ranges = [int(_text(z / "max_energy_range_uj") or 0) for z in zones]
        self._last: list[int] | None = None
        self._total_uj = 0

    def read_mj(self) -> float | None:
        """Energy counted since the first reading, in mJ; a counter that wrapped past its range is carried over."""
        now = [int((z / "energy_uj").read_text()) for z in self.zones]
        if self._last is not None:
            for before, after, span in zip(self._last, now, self._ranges):
                self._total_uj += after - before if after >= before else after + span - before
        self._last = now
        return self._total_uj / 1e3


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def rapl_counter(root: Path = POWERCAP) -> tuple[RaplEnergy | None, str | None]:
    """The RAPL package counters under `root`, or why there are none (absent, or not readable by this user)."""
    # Top-level zones only: intel-rapl:0:0 (cores) and the like are already counted in their package.
    zones = sorted(z for z in root.glob("intel-rapl:*") if z.name.count(":") == 1 and (z / "energy_uj").exists()) if root.is_dir() else []
    if not zones:
        return None, "no RAPL energy counters on this machine"
    try:
        counter = RaplEnergy(zones)
        counter.read_mj()
    except OSError as exc:
        return None, (f"RAPL energy counters are not readable by this user ({one_line(exc)}); "
                      "energy_uj is root-only on kernels with the PLATYPUS mitigation")
    return counter, None


def counter_for(device: str, telemetry: Telemetry, cpu_counter: Callable[[], tuple[EnergyCounter | None, str | None]]
                ) -> tuple[EnergyCounter | None, str | None]:
    """The energy counter of a device type (its GPU telemetry's, else `cpu_counter()`: RAPL's), or the reason there is none."""
    if telemetry.gpu is not None:
        if telemetry.gpu.energy_mj() is None:
            return None, "NVML has no total-energy counter for this GPU (it needs a Volta or later GPU and driver support)"
        return NvmlEnergy(telemetry.gpu), None
    if device.startswith("cuda"):
        return None, telemetry.reason
    return cpu_counter()


@dataclass(frozen=True)
class EnergyResult:
    """What the energy phase measured (between two counter changes), or why there is no figure."""

    energy_mj: float | None = None
    window_s: float | None = None
    calls: int | None = None
    updates: int | None = None
    counter: str | None = None
    reason: str | None = None

    @property
    def mj_per_call(self) -> float | None:
        """Energy per call in mJ."""
        return self.energy_mj / self.calls if self.energy_mj is not None and self.calls else None

    @property
    def avg_power_w(self) -> float | None:
        """Mean power over the window in W."""
        return self.energy_mj / self.window_s / 1e3 if self.energy_mj is not None and self.window_s else None

    def columns(self, flops: float | None) -> dict[str, Any]:
        """The record's energy columns; GFLOP per joule from the row's FLOPs per call."""
        per_call = self.mj_per_call
        return {
            "energy_mj_per_call": per_call, "avg_power_w": self.avg_power_w,
            "gflop_per_joule": flops / (per_call / 1e3) / 1e9 if flops and per_call else None,
            "energy_window_s": self.window_s, "energy_calls": self.calls, "energy_counter_updates": self.updates,
            "energy_counter": self.counter, "energy_reason": self.reason,
        }


def measure_energy(step: Callable[[], object], counter: EnergyCounter, call_s: float, window: EnergyWindow,
                   wall: Callable[[], float] = time.perf_counter, sync: Callable[[], object] = lambda: None) -> EnergyResult:
    """Call `step` back to back in batches until the counter has moved `min_updates` times over `min_s`; energy between changes."""
    batch = max(1, min(MAX_BATCH_CALLS, math.ceil(BATCH_S / max(call_s, 1e-9))))

    def run_batch() -> tuple[float, float]:
        for _ in range(batch):
            step()
        sync()
        value = counter.read_mj()
        if value is None:
            raise RuntimeError(f"the {counter.name} counter stopped answering")
        return wall(), value

    sync()
    began, previous = wall(), counter.read_mj()
    opened = None  # (time, counter) at the first change seen: the window starts on the counter's grid
    while opened is None:
        t, value = run_batch()
        if value != previous:
            opened = (t, value)
        elif t - began >= window.max_s:
            return EnergyResult(window_s=t - began, updates=0, counter=counter.name,
                                reason=f"the energy counter did not move in {t - began:.2f} s of calls")
    calls = updates = 0
    closed = (opened[0], opened[1], 0)
    previous = opened[1]
    while True:
        t, value = run_batch()
        calls += batch
        if value != previous:
            updates, closed, previous = updates + 1, (t, value, calls), value
        if (t - opened[0] >= window.min_s and updates >= window.min_updates) or t - began >= window.max_s:
            break
    if updates < window.min_updates:
        return EnergyResult(window_s=t - opened[0], calls=calls, updates=updates, counter=counter.name,
                            reason=f"the energy counter moved {updates} times in {t - opened[0]:.2f} s (fewer than "
                                   f"{window.min_updates}): too coarse a counter for a figure per call")
    return EnergyResult(energy_mj=closed[1] - opened[1], window_s=closed[0] - opened[0], calls=closed[2], updates=updates,
                        counter=counter.name)


def pair_energy(step: Callable[[], object], device: str, call_s: float,
                found: tuple[EnergyCounter | None, str | None]) -> EnergyResult:
    """The energy phase of one pair on the counter `found` for its device; no calls at all where there is none (the reason instead)."""
    counter, reason = found
    if counter is None:
        return EnergyResult(reason=reason)
    on_gpu = device.startswith("cuda")
    sync = (lambda: None)
    if on_gpu:
        import torch

        sync = torch.cuda.synchronize
    try:
        return measure_energy(step, counter, call_s, GPU_WINDOW if on_gpu else CPU_WINDOW, sync=sync)
    except Exception as exc:  # noqa: BLE001 - energy is beside the latency: its failure costs the energy columns only
        if is_sticky_cuda_error(exc):
            raise
        return EnergyResult(counter=counter.name, reason=f"energy phase failed: {one_line(exc)}")
