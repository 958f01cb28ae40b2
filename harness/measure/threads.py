"""The CPU thread count a measurement runs with: torch's intra-op threads, set per timing process.

torch's default is the core count; on a shared machine every extra thread is one more thing other
work can preempt, so a run may pin fewer (as torch.utils.benchmark's Timer `num_threads` does). A CPU run
given no `--threads` takes one thread per core that other work left idle as it started (`choose_threads`):
with one CPU-bound process beside it on two cores it times on one thread, which that process does not
preempt; on an idle machine it keeps torch's default.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Iterable

from harness.results.run_options import check_threads


def apply_threads(n: int | None) -> int:
    """Set torch's intra-op threads to `n` when given; return the thread count now in effect."""
    import torch  # only the timing process needs torch; importing this module must stay cheap

    n = check_threads(n)
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return int(torch.get_num_threads())


#: Seconds the CPU's load is sampled for before a CPU run picks its thread count: long enough to see a busy process
#: (a scheduler tick is 1-10 ms), short beside a sweep.
LOAD_SAMPLE_S = 0.5
#: How a CPU run without `--threads` picks its thread count (recorded in the manifest's `threads_chosen`).
AUTO_RULE = ("torch's default (the core count), less the cores other work kept busy while the run started "
             "(/proc/stat over 0.5 s, rounded), at least 1")


def cpu_times(cpus: Iterable[int], stat_text: str) -> tuple[float, float] | None:
    """(busy, total) jiffies of `cpus` in /proc/stat's text, or None when it names none of them."""
    wanted, busy, total, seen = {f"cpu{n}" for n in cpus}, 0.0, 0.0, False
    for line in stat_text.splitlines():
        words = line.split()
        if not words or words[0] not in wanted:
            continue
        values = [float(v) for v in words[1:9]]  # user nice system idle iowait irq softirq steal
        idle = values[3] + (values[4] if len(values) > 4 else 0.0)
        busy, total, seen = busy + sum(values) - idle, total + sum(values), True
    return (busy, total) if seen else None


def busy_cores(sample_s: float = LOAD_SAMPLE_S, read: Callable[[], str] | None = None,
               sleep: Callable[[float], None] = time.sleep) -> tuple[int, float] | None:
    """(cores this process may run on, how many of them other work kept busy over `sample_s`), or None where /proc/stat is unreadable."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))

    def stat() -> str:
        with open("/proc/stat") as f:
            return f.read()

    read = read or stat
    try:
        before = cpu_times(cpus, read())
        sleep(sample_s)  # this process only sleeps meanwhile: what is busy is other work
        after = cpu_times(cpus, read())
    except (OSError, ValueError):
        return None
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return len(cpus), share * len(cpus)


def auto_threads(default: int, cores: int, busy: float) -> int:
    """`default` threads less the cores `busy` with other work (rounded), at least 1: a thread per idle core."""
    free = math.floor(cores - busy + 0.5)
    return max(1, min(default, free))


def threads_for_this_machine() -> tuple[int, dict]:
    """The thread count of a CPU run given no --threads on this machine now, and how it was chosen (`choose_threads`)."""
    import torch  # the supervisor of a CPU run imports it anyway, for the CPU's peaks

    return choose_threads(int(torch.get_num_threads()), busy_cores())


def choose_threads(default: int, load: tuple[int, float] | None) -> tuple[int, dict]:
    """The thread count a CPU run without `--threads` uses, and the evidence the manifest records (`threads_chosen`)."""
    if load is None:
        return default, {"threads": default, "torch_default": default, "rule": AUTO_RULE, "cores": None, "busy_cores": None,
                         "why": "/proc/stat could not be read: torch's default"}
    cores, busy = load
    threads = auto_threads(default, cores, busy)
    return threads, {"threads": threads, "torch_default": default, "rule": AUTO_RULE, "cores": cores, "busy_cores": round(busy, 2)}
