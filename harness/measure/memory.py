"""Peak memory of one call, measured (never modelled), on CUDA and on the CPU."""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import dataclass
from typing import Callable

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"
_M_MMAP_THRESHOLD = -3


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


def cpu_peak_supported() -> str | None:
    """None if the process' peak RSS can be reset and read here, else why not."""
    if not os.path.exists(_CLEAR_REFS):
        return "peak RSS needs Linux's /proc/self/clear_refs"
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        _status_kib("VmHWM")
    except OSError as exc:
        return f"cannot reset peak RSS: {exc}"
    return None


def _return_large_frees_to_os() -> None:
    """Serve large allocations by mmap so that freed tensors leave the RSS at once.

    Without this, glibc raises its mmap threshold after the first large free and later
    tensors reuse already-resident heap pages, so the high-water mark would undercount.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
    except OSError:
        pass


def cpu_peak(fn: Callable[[], object]) -> MemoryPeak:
    """Peak resident memory added by `fn()`, from the VmHWM high-water mark reset just before the call."""
    reason = cpu_peak_supported()
    if reason:
        return MemoryPeak(None, method="rss-hwm", reason=reason)
    _return_large_frees_to_os()
    gc.collect()
    baseline_kib = _status_kib("VmRSS")
    with open(_CLEAR_REFS, "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    result = fn()
    peak_kib = _status_kib("VmHWM")
    del result
    return MemoryPeak(max(0, peak_kib - baseline_kib) * 1024, method="rss-hwm")


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
