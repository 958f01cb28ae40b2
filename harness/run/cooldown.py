"""`attnbench run --cooldown`: between pairs on CUDA, wait until the GPU is back near the temperature it idled at.

A pair measured on a GPU still hot from the one before may run at a lower clock (thermal limits),
which drift-fair ordering evens out but does not remove. The idle temperature is the one env.json
recorded before the sweep; the wait ends when the GPU is within `tolerance_c` of it, or after at
most `max_s` seconds, and the row says how long it waited (`cooldown_s`) and whether it cooled.
A CPU run has no temperature reading here, so `--cooldown` is refused there rather than faked.

The temperature is read through the one NVML reader (harness.telemetry.nvml) by `GpuTemperature`, a seam
tests replace with a fake sequence.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.errors import UserError
from harness.files import MAX_DOCUMENT_BYTES, parse_json, read_regular
from harness.results.run_options import AUTO_MAX_S, parse_cooldown  # noqa: F401 - the option's parsing lives with the option
from harness.run.rundir import ENV
from harness.telemetry import nvml

#: Cool enough: at most this many °C above the idle temperature.
TOLERANCE_C = 3.0
#: Seconds between two temperature readings (NVML updates the temperature about once a second).
POLL_S = 1.0


class GpuTemperature:
    """GPU temperatures through one NVML session (harness.telemetry.nvml, the one NVML reader), started at the first
    reading and held for the worker's life; every reading None where NVML cannot start (no nvidia-ml-py, no driver)."""

    def __init__(self) -> None:
        self.session: nvml.NvmlSession | None = None
        self.unavailable = False

    def _session(self) -> nvml.NvmlSession | None:
        if self.session is None and not self.unavailable:
            try:
                self.session = nvml.NvmlSession.start()
            except Exception:  # noqa: BLE001 - no pynvml, no driver: "cannot say", which the cool-down reports
                self.unavailable = True
        return self.session

    def __call__(self, index: int) -> float | None:
        """The temperature (°C) of NVML device `index`, or None where NVML cannot say."""
        session = self._session()
        return None if session is None else nvml.temperature_c(session, index)

    def index_of_uuid(self, uuid: str) -> int | None:
        """NVML's index of the GPU named by `uuid`, or None."""
        session = self._session()
        return None if session is None else nvml.index_of_uuid(session, uuid)


def nvml_index(environ: Mapping[str, str], temperatures: GpuTemperature | None = None) -> int | None:
    """The NVML index of the GPU this process computes on: the first of CUDA_VISIBLE_DEVICES (an index or a UUID), else 0."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return 0 if visible is None else None
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return int(first)
    # A UUID (GPU-…); a MIG id has no temperature of its own and ends up None.
    return (temperatures or GpuTemperature()).index_of_uuid(first)


def idle_temperature_c(env_json: Path, index: int | None) -> float | None:
    """The temperature NVML device `index` had before the sweep, from the run's env.json (None when not recorded)."""
    try:
        data = parse_json(read_regular(env_json, "env.json", MAX_DOCUMENT_BYTES), env_json)
    except UserError:  # absent, not a regular file (never block on a FIFO), too large or not JSON: not recorded
        return None
    before = data.get("telemetry_before") if isinstance(data, dict) else None
    if not isinstance(before, list):
        return None
    for gpu in before:
        if isinstance(gpu, dict) and gpu.get("index") == index and isinstance(gpu.get("temperature_c"), (int, float)):
            return float(gpu["temperature_c"])
    return None


@dataclass(frozen=True)
class Waited:
    """How one cool-down ended: seconds waited, and a sentence when it did not reach the idle temperature."""

    seconds: float
    problem: str | None = None


@dataclass
class Cooldown:
    """Waits, before a pair, until GPU `index` is within `tolerance_c` of `idle_c`, for at most `max_s` seconds."""

    max_s: float
    index: int | None
    idle_c: float | None
    tolerance_c: float = TOLERANCE_C
    poll_s: float = POLL_S
    read: Callable[[int], float | None] = field(default_factory=GpuTemperature)
    sleep: Callable[[float], Any] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def wait(self) -> Waited:
        """Poll the temperature until cool or `max_s` has passed; what it waited and, if it never cooled, why."""
        if self.index is None:
            return Waited(0.0, "no cool-down: cannot tell which NVML device CUDA_VISIBLE_DEVICES names")
        if self.idle_c is None:
            return Waited(0.0, "no cool-down: env.json holds no idle temperature for this GPU")
        target = self.idle_c + self.tolerance_c
        start = self.clock()
        while True:
            temperature = self.read(self.index)
            waited = self.clock() - start
            if temperature is None:
                return Waited(waited, "cool-down stopped: NVML gave no temperature")
            if temperature <= target:
                return Waited(waited)
            if waited >= self.max_s:
                return Waited(waited, f"cool-down gave up after {waited:.0f} s (--cooldown {self.max_s:g}): "
                                      f"GPU at {temperature:g} °C, idle {self.idle_c:g} °C + {self.tolerance_c:g}")
            self.sleep(min(self.poll_s, max(0.0, self.max_s - waited)))


def worker_cooldown(max_s: float, run_dir: Path) -> Cooldown:
    """The cool-down of a worker of run `run_dir`: its GPU (from CUDA_VISIBLE_DEVICES) and that GPU's idle temperature."""
    temperatures = GpuTemperature()
    index = nvml_index(os.environ, temperatures)
    return Cooldown(max_s=max_s, index=index, idle_c=idle_temperature_c(Path(run_dir) / ENV, index), read=temperatures)
