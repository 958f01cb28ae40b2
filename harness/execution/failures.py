"""How a pair's exception is classified: out of memory, a sticky CUDA error that ends the worker, or a plain error."""

from __future__ import annotations

import traceback

import torch

from harness.errors import one_line
from harness.results.record import Record, Status


def is_oom(exc: BaseException) -> bool:
    """True for torch's and the allocator's out-of-memory errors (CUDA and CPU)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower())


#: Messages of CUDA errors after which the process's CUDA context is unusable for good (cudaErrorIllegalAddress & co).
STICKY_CUDA_ERRORS = (
    "illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
    "illegal instruction", "an illegal address",
)
#: How the reason of a pair that hit a sticky CUDA error begins; the worker exits after writing it.
STICKY_PREFIX = "sticky CUDA error (this process's CUDA context is lost; worker restarted): "


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """True for an error after which no later CUDA call in this process can succeed (the worker must exit)."""
    text = str(exc).lower()
    return "cuda" in text and any(marker in text for marker in STICKY_CUDA_ERRORS)


def described(exc: BaseException) -> str:
    """The exception on one line with the file and line it was raised at."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{one_line(exc)} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"


def poisons_process(record: Record) -> bool:
    """True when the record's pair left the process unusable, so the worker must exit after writing it."""
    return record.status is Status.CRASHED and (record.reason or "").startswith(STICKY_PREFIX)
