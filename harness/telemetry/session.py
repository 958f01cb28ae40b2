"""A process's device telemetry with a lifetime: opened on a pair's first use, shared by the pairs after it, released by close().

Whoever runs pairs holds one (harness.execution.execute's PairRunner does, through its resources), so
NVML is initialised once for a worker's many pairs, not once per pair, and a test makes a fresh session,
or hands it a fake opener, instead of clearing a module's cache.
"""

from __future__ import annotations

from typing import Callable

from harness.telemetry.energy import EnergyCounter, counter_for, rapl_counter
from harness.telemetry.gpu_state import Telemetry, open_telemetry

Found = tuple[EnergyCounter | None, str | None]


class TelemetrySession:
    """The GPU telemetry of each device a process's pairs run on, and the CPU's RAPL counter, each opened once until close()."""

    def __init__(self, open_gpu: Callable[[str], Telemetry] = open_telemetry, open_rapl: Callable[[], Found] = rapl_counter) -> None:
        self._open_gpu, self._open_rapl = open_gpu, open_rapl
        self._telemetry: dict[str, Telemetry] = {}
        self._rapl: Found | None = None

    def telemetry(self, device: str) -> Telemetry:
        """The telemetry of `device` (NVML on CUDA, none with the reason on the CPU), opened on first use."""
        if device not in self._telemetry:
            self._telemetry[device] = self._open_gpu(device)
        return self._telemetry[device]

    def _cpu_counter(self) -> Found:
        # One RAPL counter for the session: its wrap-around bookkeeping spans every pair's phase.
        if self._rapl is None:
            self._rapl = self._open_rapl()
        return self._rapl

    def energy_counter(self, device: str) -> Found:
        """The energy counter of `device` (its GPU's NVML counter, else the CPU's RAPL), or the reason there is none."""
        return counter_for(device, self.telemetry(device), self._cpu_counter)

    def close(self) -> None:
        """Release what was opened (NVML's session); the next use opens afresh."""
        opened, self._telemetry, self._rapl = self._telemetry, {}, None
        for telemetry in opened.values():
            telemetry.close()

    def __enter__(self) -> TelemetrySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
