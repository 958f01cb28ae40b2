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


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def cpu_peak_supported() -> str | None:
    """None if the process' peak RSS can be reset and read here, and free heap pages handed back first, else why not."""
    if not os.path.exists(_CLEAR_REFS):
        return "peak RSS needs Linux's /proc/self/clear_refs"
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return "peak RSS needs glibc's malloc_trim (free heap pages would hide the call's allocations)"
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        _status_kib("VmHWM")
    except OSError as exc:
        return f"cannot reset peak RSS: {exc}"
    return None


def release_free_heap_pages() -> None:
    """Hand the pages of free heap memory back to the OS (glibc `malloc_trim(0)`), changing no allocator setting.

    The high-water mark only sees pages that become resident. Earlier calls leave freed blocks in
    glibc's arenas with their pages still resident (after the first large free glibc raises its
    mmap threshold, so a 4 MiB output is then served from the heap, not a fresh mapping), and the
    measured call reuses them unseen: a worker's first pairs read 0. `malloc_trim(0)` releases every
    whole free page in every arena (MADV_DONTNEED), so what the call touches is counted again.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(ctypes.c_size_t(0))


def cpu_peak(fn: Callable[[], object]) -> MemoryPeak:
    """Peak resident memory added by `fn()`, from the VmHWM high-water mark reset just before the call."""
    reason = cpu_peak_supported()
    if reason:
        return MemoryPeak(None, method=CPU_METHOD, reason=reason)
    gc.collect()
    release_free_heap_pages()
    baseline_kib = _status_kib("VmRSS")
    with open(_CLEAR_REFS, "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    result = fn()
    peak_kib = _status_kib("VmHWM")
    del result
    return MemoryPeak(max(0, peak_kib - baseline_kib) * 1024, method=CPU_METHOD)


def cuda_peak(fn: Callable[[], object], device: object = None) -> MemoryPeak:
    """Peak allocated (and reserved) CUDA memory added by `fn()` over what the inputs already held."""
    import torch

    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base_allocated = torch.cuda.memory_allocated(device)
    base_reserved = torch.cuda.memory_reserved(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base_allocated
    reserved = torch.cuda.max_memory_reserved(device) - base_reserved
    del result
    return MemoryPeak(int(peak), int(reserved), method="cuda-allocator")


def measure_peak(fn: Callable[[], object], device: str) -> MemoryPeak:
    """Peak memory of one call on the given device type (`cpu` or `cuda[:n]`)."""
    if str(device).startswith("cuda"):
        return cuda_peak(fn, device)
    return cpu_peak(fn)
