"""Peak memory of one call, measured (never modelled), on CUDA and on the CPU.

On the CPU the measurement changes no allocator setting: it hands free heap pages back to the OS
before the call instead of pinning glibc's mmap threshold, so the pairs timed after it run under
the allocator every other process gets.
"""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import dataclass
from typing import Callable

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
#: Named apart from the old "rss-hwm", which read resident free heap pages as no memory at all.
CPU_METHOD = "rss-hwm-trimmed"


@dataclass(frozen=True)
class MemoryPeak:
    """Extra bytes a call needed above what was already held (`reserved` is the CUDA caching allocator's)."""

    peak_bytes: int | None
    reserved_bytes: int | None = None
    method: str = ""
    reason: str | None = None


def _status_kib(field: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in {_STATUS}")


def load_libc() -> ctypes.CDLL | None:
    """glibc, loaded for whoever holds the handle (None where there is none: musl, macOS)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def cpu_peak_problem(libc: ctypes.CDLL | None) -> str | None:
    """Why peak RSS cannot be measured with the glibc handle `libc` (None: there is none), or None when it can."""
    if not os.path.exists(_CLEAR_REFS):
        return "peak RSS needs Linux's /proc/self/clear_refs"
    if libc is None or not hasattr(libc, "malloc_trim"):
        return "peak RSS needs glibc's malloc_trim (free heap pages would hide the call's allocations)"
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        _status_kib("VmHWM")
    except OSError as exc:
        return f"cannot reset peak RSS: {exc}"
    return None


def release_free_heap_pages(libc: ctypes.CDLL | None) -> None:
    """Hand the pages of free heap memory back to the OS (glibc `malloc_trim(0)`), changing no allocator setting.

    The high-water mark only sees pages that become resident. Earlier calls leave freed blocks in
    glibc's arenas with their pages still resident (after the first large free glibc raises its
    mmap threshold, so a 4 MiB output is then served from the heap, not a fresh mapping), and the
    measured call reuses them unseen: a worker's first pairs read 0. `malloc_trim(0)` releases every
    whole free page in every arena (MADV_DONTNEED), so what the call touches is counted again.
    """
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(ctypes.c_size_t(0))


class PeakMeter:
    """The peak memory of whatever runs between `start()` and `stop()`, above what was held at `start()`.

    Around the warm-up and timed samples it gives the peak of one call (calls run one after another
    and free their temporaries) without a call of its own; around one call it is `measure_peak`.
    CPU: VmHWM reset through /proc/self/clear_refs after free heap pages are handed back; CUDA: the
    caching allocator's peak, reset at the start.
    """

    def __init__(self, device: str) -> None:
        self.device = str(device)
        self._cuda = self.device.startswith("cuda")
        self._reason: str | None = None
        self._base: tuple[int, int] = (0, 0)
        # The meter holds its own glibc handle for its life: dlopen of the loaded libc is cheap, and nothing outlives the meter.
        self._libc = None if self._cuda else load_libc()

    def start(self) -> None:
        """Collect garbage, reset the peak counters and note the baseline."""
        gc.collect()
        if self._cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = (torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device))
            return
        self._reason = cpu_peak_problem(self._libc)
        if self._reason:
            return
        release_free_heap_pages(self._libc)
        self._base = (_status_kib("VmRSS") * 1024, 0)
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")  # resets VmHWM to the current RSS

    def stop(self) -> MemoryPeak:
        """The peak since `start()`."""
        if self._cuda:
            import torch

            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - self._base[0]
            reserved = torch.cuda.max_memory_reserved(self.device) - self._base[1]
            return MemoryPeak(int(peak), int(reserved), method="cuda-allocator")
        if self._reason:
            return MemoryPeak(None, method=CPU_METHOD, reason=self._reason)
        return MemoryPeak(max(0, _status_kib("VmHWM") * 1024 - self._base[0]), method=CPU_METHOD)


def cpu_peak(fn: Callable[[], object]) -> MemoryPeak:
    """Peak resident memory added by `fn()`, from the VmHWM high-water mark reset just before the call."""
    meter = PeakMeter("cpu")
    meter.start()
    result = fn()
    peak = meter.stop()
    del result
    return peak


def cuda_peak(fn: Callable[[], object], device: object = None) -> MemoryPeak:
    """Peak allocated (and reserved) CUDA memory added by `fn()` over what the inputs already held."""
    import torch

    meter = PeakMeter(str(device) if device is not None else f"cuda:{torch.cuda.current_device()}")
    meter.start()
    result = fn()
    peak = meter.stop()
    del result
    return peak


def measure_peak(fn: Callable[[], object], device: str) -> MemoryPeak:
    """Peak memory of one call on the given device type (`cpu` or `cuda[:n]`)."""
    if str(device).startswith("cuda"):
        return cuda_peak(fn, device)
    return cpu_peak(fn)
