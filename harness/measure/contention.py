"""Whether other work took the CPU from a measurement: run-queue waits and involuntary switches around the timed samples.

On a shared machine a pair's median can jump by a scheduler quantum (~8 ms) while its samples stay
tight; nothing in the samples shows it. The process's own counters do: thread-seconds spent runnable
but waiting for a CPU (/proc schedstat) and involuntary context switches (getrusage).
"""

from __future__ import annotations

import glob
import resource
import sys
import time
from dataclasses import dataclass
from typing import Callable

from harness.measure.stats import NOISY_IQR

#: Seconds, as a clock returns them (the same type as `timing.Clock`).
Clock = Callable[[], float]

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


def with_gpu_processes(cpu_contended: bool | None, gpu_other_processes: int | None) -> bool | None:
    """A row's `contended`: the CPU's verdict, made True when another process was on the GPU during the samples."""
    # Another process on the device shares its SMs and memory bandwidth, as one on the cores shares the CPU.
    return True if gpu_other_processes else cpu_contended
