"""Timers and statistics: the harness's one measurement path.

`measure()` warms a callable up by time, calibrates how many calls make one sample, then hands
the rounds to a loop: pytest-benchmark's `pedantic` in the suites, a plain loop elsewhere. Either
way the same clock reads the time and the same `Stats` summarise the same samples. The clock is
injected, so tests drive everything with a fake clock and get exact answers.
"""

from __future__ import annotations

import glob
import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

#: A clock returns seconds as a float; only differences between two readings matter.
Clock = Callable[[], float]

#: IQR / median at or above which a measurement is noisy, and suspect (torch.utils.benchmark, pyperf).
NOISY_IQR = 0.10
SUSPECT_IQR = 0.25


class Loop(Protocol):
    """Runs `rounds` samples of `iterations` calls each and returns per-call seconds, one per round.

    Each round reads the clock once before its calls and once after them (the direct loop and
    pytest-benchmark's pedantic mode both do), which is how a clock's per-reading notes are matched
    to samples.
    """

    def __call__(self, fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]: ...


@dataclass(frozen=True)
class Budget:
    """How much time a measurement may spend, and how its samples are sized.

    Warm-up runs for `warmup_s` (at least one call), then the number of calls per sample is set so
    a sample lasts at least `min_sample_s` (CPU; on CUDA each sample is one call between L2
    flushes), and the number of samples so the measurement lasts about `measure_s`.
    """

    warmup_s: float = 0.05
    measure_s: float = 0.25
    min_sample_s: float = 1e-3
    min_rounds: int = 5
    max_rounds: int = 1000
    max_iterations: int = 10_000

    def total_s(self) -> float:
        """The nominal time this budget allows for one measurement."""
        return self.warmup_s + self.measure_s


QUICK_BUDGET = Budget(warmup_s=0.02, measure_s=0.1, min_rounds=5, max_rounds=200)
CUDA_BUDGET = Budget(warmup_s=0.025, measure_s=0.1, min_sample_s=0.0, min_rounds=10, max_rounds=1000)


@dataclass(frozen=True)
class Stats:
    """Summary of per-call latencies in seconds (percentiles by linear interpolation, numpy's default)."""

    samples: tuple[float, ...]
    iterations: int
    median: float
    p20: float
    p80: float
    p25: float
    p75: float
    min: float
    max: float
    mean: float
    stdev: float

    @classmethod
    def from_samples(cls, samples: Sequence[float], iterations: int = 1) -> "Stats":
        """Statistics of per-call samples (each the mean of `iterations` calls)."""
        if not samples:
            raise ValueError("no samples to summarise")
        a = np.asarray(samples, dtype=np.float64)
        p20, p25, p50, p75, p80 = np.percentile(a, [20, 25, 50, 75, 80])
        return cls(
            samples=tuple(float(x) for x in a), iterations=iterations,
            median=float(p50), p20=float(p20), p80=float(p80), p25=float(p25), p75=float(p75),
            min=float(a.min()), max=float(a.max()), mean=float(a.mean()),
            stdev=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        )

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples)

    @property
    def iqr_ratio(self) -> float:
        """Interquartile range over median: the noise measure the flags use."""
        return (self.p75 - self.p25) / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        """IQR/median ≥ 10 %."""
        return self.iqr_ratio >= NOISY_IQR

    @property
    def suspect(self) -> bool:
        """IQR/median ≥ 25 %: the median should not be trusted."""
        return self.iqr_ratio >= SUSPECT_IQR


@dataclass(frozen=True)
class Plan:
    """What calibration decided: calls per sample, samples, and what warm-up cost."""

    iterations: int
    rounds: int
    warmup_calls: int
    warmup_s: float
    call_s: float


@dataclass(frozen=True)
class Measurement:
    """A plan, the statistics of the samples it produced, and what may have distorted them.

    `launch_leaked`: samples whose interval may hold host time, because the host took longer to
    reach the timed call than the GPU spin queued before it lasted (device clocks only; None for
    clocks that cannot tell). `contended`: the process' threads waited for a CPU for at least
    CONTENDED_RUN_WAIT of the timed phase's wall time (or, where the kernel does not report run-queue
    waits, were preempted at least CONTENDED_SWITCH_RATE times a second); None when nothing could be
    read. The evidence: `run_queue_wait_ratio` (thread-seconds spent runnable but not running, per
    wall second), `involuntary_switches` (preemptions during the timed phase) and `cpu_wall_ratio`
    (process CPU time over wall time × intra-op threads).
    """

    stats: Stats
    plan: Plan
    clock_resolution_s: float
    too_short: bool = False
    extra: dict = field(default_factory=dict)
    launch_leaked: int | None = None
    contended: bool | None = None
    run_queue_wait_ratio: float | None = None
    involuntary_switches: int | None = None
    cpu_wall_ratio: float | None = None

    def as_dict(self) -> dict:
        """Plain-dict form (for records)."""
        return asdict(self)


def clock_resolution(clock: Clock, trials: int = 20) -> float:
    """The smallest non-zero difference between successive readings (or 0 for a clock that never moves)."""
    deltas = []
    for _ in range(trials):
        a = clock()
        b = clock()
        while b == a and len(deltas) < trials * 100:
            b = clock()
            deltas.append(0.0)
        if b > a:
            deltas.append(b - a)
    positive = [d for d in deltas if d > 0]
    return min(positive) if positive else 0.0


def direct_loop(clock: Clock) -> Loop:
    """A plain timing loop over `clock`: setup (untimed), then `iterations` calls between two readings."""

    def loop(fn: Callable[[], object], *, setup: Callable[[], object] | None, rounds: int, iterations: int) -> list[float]:
        samples = []
        for _ in range(rounds):
            if setup is not None:
                setup()
            start = clock()
            for _ in range(iterations):
                fn()
            samples.append((clock() - start) / iterations)
        return samples

    return loop


def plan(fn: Callable[[], object], clock: Clock, budget: Budget, setup: Callable[[], object] | None = None) -> Plan:
    """Warm up by time, then size samples and rounds from the fastest warm-up call."""
    calls = 0
    fastest = math.inf
    began = clock()
    while True:
        if setup is not None:
            setup()
        start = clock()
        fn()
        end = clock()
        calls += 1
        fastest = min(fastest, end - start)
        if end - began >= budget.warmup_s:
            break
    warmup_s = clock() - began
    call_s = max(fastest, 1e-9)
    if setup is not None:
        iterations = 1  # a setup (the L2 flush) must precede every call
    else:
        # The relative slack keeps float error (1e-3 / 9.999e-5) from adding an iteration.
        iterations = min(budget.max_iterations, max(1, math.ceil(budget.min_sample_s / call_s * (1 - 1e-9))))
    rounds = round(budget.measure_s / (call_s * iterations))
    rounds = min(budget.max_rounds, max(budget.min_rounds, rounds))
    return Plan(iterations=iterations, rounds=rounds, warmup_calls=calls, warmup_s=warmup_s, call_s=call_s)


#: Thread-seconds waiting for a CPU per wall second at or above which a measurement is contended:
#: a waiting thread can stretch the call by about that fraction, as much as the noise flag tolerates.
CONTENDED_RUN_WAIT = NOISY_IQR
#: Involuntary context switches per wall second that mark contention where run-queue waits are not
#: reported (two runnable tasks sharing a core are switched every few ms: hundreds a second).
CONTENDED_SWITCH_RATE = 100.0


def involuntary_switches() -> int:
    """This process's involuntary context switches so far (all threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def run_queue_wait_s() -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU (/proc schedstat), or None."""
    total_ns, seen = 0, False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as f:
                total_ns += int(f.read().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return total_ns / 1e9 if seen else None


def intra_op_threads() -> int:
    """torch's intra-op thread count if torch is loaded, else 1 (the threads a CPU call can keep busy)."""
    torch = sys.modules.get("torch")
    return max(1, int(torch.get_num_threads())) if torch is not None else 1


@dataclass(frozen=True)
class CpuReading:
    """One reading of the process's CPU accounting (None where this system does not report a counter)."""

    wall_s: float
    cpu_s: float
    involuntary_switches: int | None
    run_wait_s: float | None


class CpuProbe:
    """Reads wall time, process CPU time, preemptions and run-queue waits; every source is injectable, as the clock is."""

    def __init__(
        self,
        wall: Clock = time.perf_counter,
        cpu: Clock = time.process_time,
        switches: Callable[[], int | None] = involuntary_switches,
        run_wait: Callable[[], float | None] = run_queue_wait_s,
        threads: Callable[[], int] = intra_op_threads,
    ) -> None:
        self._wall, self._cpu, self._switches, self._run_wait, self._threads = wall, cpu, switches, run_wait, threads

    def read(self) -> CpuReading:
        """The counters now."""
        return CpuReading(self._wall(), self._cpu(), self._switches(), self._run_wait())

    def threads(self) -> int:
        """Threads the timed calls may use."""
        return self._threads()


def contention(before: CpuReading, after: CpuReading, threads: int) -> dict:
    """Whether the CPU was contended between two readings, and the evidence (Measurement's field names)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return {}
    switches = None if before.involuntary_switches is None or after.involuntary_switches is None else after.involuntary_switches - before.involuntary_switches
    wait_ratio = None if before.run_wait_s is None or after.run_wait_s is None else (after.run_wait_s - before.run_wait_s) / wall
    if wait_ratio is not None:
        contended: bool | None = wait_ratio >= CONTENDED_RUN_WAIT
    elif switches is not None:
        contended = switches / wall >= CONTENDED_SWITCH_RATE
    else:
        contended = None
    return {
        "contended": contended, "run_queue_wait_ratio": wait_ratio, "involuntary_switches": switches,
        "cpu_wall_ratio": (after.cpu_s - before.cpu_s) / (wall * max(1, threads)),
    }


def leaked_samples(leaked_readings: Sequence[int], first: int, last: int, rounds: int) -> int:
    """Samples among readings `first`+1 … `last` whose interval may hold launch time.

    With two readings per round (the Loop contract) only the intervals that end a round are samples;
    otherwise every flagged interval is counted (an upper bound).
    """
    flagged = [r - first for r in leaked_readings if first < r <= last]
    if last - first == 2 * rounds:
        return sum(1 for k in flagged if k % 2 == 0)
    return len(flagged)


def measure(
    fn: Callable[[], object],
    clock: Clock = time.perf_counter,
    budget: Budget = Budget(),
    *,
    setup: Callable[[], object] | None = None,
    loop: Loop | None = None,
    probe: CpuProbe | None = None,
) -> Measurement:
    """Warm up, calibrate and time `fn`; `loop` defaults to a direct loop over `clock`, `probe` to this process's counters."""
    probe = probe or CpuProbe()
    resolution = clock_resolution(clock)
    p = plan(fn, clock, budget, setup)
    # Counters are read around the timed phase only: per sample, reading /proc would cost more than a short call.
    readings_before = getattr(clock, "readings", None)
    cpu_before = probe.read()
    samples = (loop or direct_loop(clock))(fn, setup=setup, rounds=p.rounds, iterations=p.iterations)
    cpu_after = probe.read()
    leaked = None
    if readings_before is not None:
        leaked = leaked_samples(clock.leaked, readings_before, clock.readings, p.rounds)  # type: ignore[attr-defined]
    stats = Stats.from_samples(samples, p.iterations)
    # A sample shorter than ~100 clock ticks is mostly quantisation (pyperf's warning, in spirit).
    too_short = resolution > 0 and stats.min * p.iterations < 100 * resolution
    return Measurement(stats=stats, plan=p, clock_resolution_s=resolution, too_short=too_short, launch_leaked=leaked,
                       **contention(cpu_before, cpu_after, probe.threads()))


class FakeClock:
    """A clock that moves only when told to: for tests that need exact statistics."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds


#: Bounds of the spin the CUDA clock queues after each reading (seconds), and its multiple of the host gap.
SPIN_MIN_S = 20e-6
SPIN_MAX_S = 2e-3
SPIN_FIRST_S = 100e-6
SPIN_FACTOR = 2.0
#: Cycles of the spin that gives a new clock its first rate estimate, and how many recent spins' rates it keeps.
CALIBRATION_CYCLES = 1_000_000
RECENT_SPINS = 16


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

    def __init__(self, device: object = None, *, torch_module: object = None, host_clock: Clock = time.perf_counter) -> None:
        if torch_module is None:
            import torch as torch_module
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
