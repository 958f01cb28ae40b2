"""The CUDA clock: device time between events, without the host's launch time, whatever the GPU's clock state; and the L2 flush.

Each reading records an event and waits for it, then queues a GPU spin and starts the next interval
after it, so the host's Python launch time falls inside the spin, not the sample. The spin's real
length is measured with its own events every time (a GPU idling at 345 MHz spins ten times slower
than one at 1980 MHz), and a reading whose host gap outran the spin is counted as leaked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from harness.errors import Unsupported
from harness.measure.timing import Budget, Clock, measure
from harness.private_api import refused_signature

#: Bounds of the spin the CUDA clock queues after each reading (seconds), and its multiple of the host gap.
SPIN_MIN_S = 20e-6
SPIN_MAX_S = 2e-3
SPIN_FIRST_S = 100e-6
SPIN_FACTOR = 2.0
#: Cycles of the spin that gives a new clock its first rate estimate, and how many recent spins' rates it keeps.
CALIBRATION_CYCLES = 1_000_000
RECENT_SPINS = 16


def spin_problem(torch_module: object) -> str | None:
    """Why the private `torch.cuda._sleep(cycles)`, the spin under every CUDA sample, cannot be called here, or None."""
    sleep = getattr(getattr(torch_module, "cuda", None), "_sleep", None)
    version = getattr(torch_module, "__version__", "?")
    if not callable(sleep):
        return f"torch {version} has no torch.cuda._sleep (the private spin the CUDA clock is built on): CUDA pairs cannot be timed"
    signature = refused_signature(sleep, CALIBRATION_CYCLES)
    if signature:
        return f"torch {version}: torch.cuda._sleep{signature} no longer takes a cycle count: CUDA pairs cannot be timed"
    return None


def spin_seconds(host_gaps: Sequence[float]) -> float:
    """How long the GPU should spin after a reading: twice the longest recent host gap between readings, bounded."""
    if not host_gaps:
        return SPIN_FIRST_S
    return min(SPIN_MAX_S, max(SPIN_MIN_S, SPIN_FACTOR * max(host_gaps)))


@dataclass(frozen=True)
class _Spin:
    """A queued spin: its cycles, the host time it was queued at, and the events around it."""

    cycles: int
    queued_at: float
    start: object
    end: object


class CudaEventClock:
    """Device time from CUDA events, without the host's launch overhead in the interval.

    Each reading records an event and waits for it, then queues a spin kernel (`torch.cuda._sleep`)
    and records, after it, the event the next interval starts from. While the GPU spins, the host
    enqueues the timed call, so the interval holds device work only, not the time Python takes to
    reach the first kernel launch (which would dominate µs-scale decode kernels: an idle GPU starts
    the interval at the reading, not at the first kernel). The spin lasts twice the longest recent
    host gap between readings (bounded by SPIN_MAX_S).

    `_sleep` counts cycles, and the GPU's clock moves (an idle H200 reads 345 MHz, a busy one ten
    times that), so each spin is bracketed by its own events and its real length re-measures the
    rate the next spin is sized with: this clock's own recent rates, the fastest of them, since a
    rate read low makes every spin too short. A reading whose host gap outran the spin before it
    (the GPU may have idled waiting for the launch, and that wait is in the interval) is counted in
    `leaked`, by reading number (`readings` counts them). Readings accumulate the intervals in a
    Python float, because `Event.elapsed_time` is single precision in milliseconds and loses
    microseconds when measured against an event recorded long ago.
    """

    #: The tick CUDA documents for cudaEventElapsedTime ("around 0.5 microseconds"). Read back to back, this
    #: clock differs by the spin it queues per reading (1.3-10 µs on the H200), which is no tick: `too_short` reads this.
    resolution_s = 0.5e-6

    def __init__(self, device: object = None, *, torch_module: object = None, host_clock: Clock = time.perf_counter) -> None:
        if torch_module is None:
            import torch as torch_module
        problem = spin_problem(torch_module)
        if problem:
            raise Unsupported(problem)
        self._torch = torch_module
        self._device = device
        self._host = host_clock
        self._gaps: list[float] = []
        self._elapsed_s = 0.0
        self._rates: list[float] = [self._calibrate()]
        self.readings = 0
        self.leaked: list[int] = []
        first = self._event()
        first.synchronize()
        self._spin = self._queue_spin(SPIN_FIRST_S)

    def _event(self) -> object:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _calibrate(self) -> float:
        """A first estimate of spin cycles per second, from one spin on an idle stream."""
        a = self._event()
        self._torch.cuda._sleep(CALIBRATION_CYCLES)
        b = self._event()
        b.synchronize()
        return CALIBRATION_CYCLES / max(a.elapsed_time(b) / 1e3, 1e-9)

    @property
    def cycles_per_s(self) -> float:
        """The spin rate the next spin is sized with."""
        return max(self._rates)

    def _queue_spin(self, seconds: float) -> _Spin:
        cycles = max(1, int(seconds * self.cycles_per_s))
        queued_at = self._host()
        start = self._event()
        self._torch.cuda._sleep(cycles)
        return _Spin(cycles, queued_at, start, self._event())

    def __call__(self) -> float:
        entered = self._host()
        spin = self._spin
        event = self._event()
        event.synchronize()
        self.readings += 1
        spin_s = spin.start.elapsed_time(spin.end) / 1e3
        if spin_s > 0:
            self._rates = (self._rates + [spin.cycles / spin_s])[-RECENT_SPINS:]
        host_gap = entered - spin.queued_at
        if host_gap > spin_s:
            self.leaked.append(self.readings)
        if self.readings > 1:  # the wait from construction to first use is no gap between readings
            self._gaps = (self._gaps + [host_gap])[-RECENT_SPINS:]
        self._elapsed_s += spin.end.elapsed_time(event) / 1e3
        self._spin = self._queue_spin(spin_seconds(self._gaps))
        return self._elapsed_s


class L2Flusher:
    """Evicts the GPU's L2 by writing a buffer of at least twice its size (run between samples, untimed)."""

    def __init__(self, device: object = None) -> None:
        import torch

        props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
        self.nbytes = max(2 * l2, 256 * 2**20)
        self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device or "cuda")

    def __call__(self) -> None:
        self._buffer.zero_()


#: How the fixed overhead is sampled: a floor of microseconds, so a short run of one-call samples does.
OVERHEAD_BUDGET = Budget(warmup_s=0.05, measure_s=0.05, min_sample_s=0.0, min_rounds=30, max_rounds=300, precision=0.0)


@dataclass(frozen=True)
class FixedOverhead:
    """What a clock reads per sample beyond the kernels: an almost empty kernel's between-readings median minus its own kernel time.

    The empty kernel's own work is subtracted, not ignored: a one-element kernel still runs about
    a microsecond, which is 3 % of a 35 µs kernel, the tolerance a pair is judged by.
    """

    #: Median time between the clock's readings around the empty kernel, and that kernel's profiled time.
    between_s: float
    kernel_s: float
    #: Half the width of the median's 95 % interval: how precisely `seconds` is known.
    spread_s: float
    samples: int

    @property
    def seconds(self) -> float:
        """The fixed overhead per sample (as measured: negative would mean the profiler saw more than the clock)."""
        return self.between_s - self.kernel_s

    def to_dict(self) -> dict[str, float]:
        """Plain numbers, for a child to print and its parent to read back (`from_dict`)."""
        return {"between_s": self.between_s, "kernel_s": self.kernel_s, "spread_s": self.spread_s, "samples": self.samples}

    @classmethod
    def from_dict(cls, obj: dict) -> "FixedOverhead":
        """The overhead `to_dict` wrote."""
        return cls(float(obj["between_s"]), float(obj["kernel_s"]), float(obj["spread_s"]), int(obj["samples"]))


def measure_fixed_overhead(empty_step: Callable[[], object], clock: Clock, kernel_time_s: Callable[[Callable[[], object]], float], *,
                           setup: Callable[[], object] | None = None, budget: Budget = OVERHEAD_BUDGET) -> FixedOverhead:
    """Time `empty_step` as pairs are timed (same clock, same `setup`: the L2 flush) and subtract its own kernel time.

    `kernel_time_s(step)` is the profiler's kernel time of one call. The spread is half the
    median's 95 % interval, or half the p20–p80 range with too few samples for one.
    """
    stats = measure(empty_step, clock, budget, setup=setup).stats
    interval = stats.median_interval()
    low, high = interval if interval is not None else (stats.p20, stats.p80)
    return FixedOverhead(stats.median, float(kernel_time_s(empty_step)), (high - low) / 2, stats.n)
