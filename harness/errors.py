"""Errors a user can cause, as opposed to bugs (the CLI prints them in one line and exits 2), and how a pair's exception is
classified: out of memory, a sticky CUDA error that ends the worker, or a plain error, in one line."""

from __future__ import annotations

import difflib
import sys
import traceback
from typing import Iterable

#: The most close names an unknown name's refusal suggests.
MAX_SUGGESTIONS = 3


class UserError(ValueError):
    """A problem with what the user asked for; its message is one line that names it."""

    @classmethod
    def unknown(cls, kind: str, name: object, known: Iterable[str], listing: str) -> UserError:
        """`unknown KIND 'name' (did you mean 'x'?): LISTING`, suggesting the known names closest to `name` (difflib), if any is close.

        The one refusal of a mistyped backend, suite or model name; matched without case, since `SDPA` means `sdpa`.
        """
        by_lower = {str(k).lower(): str(k) for k in known}
        typed = str(name).strip().lower()
        close = [typed] if typed in by_lower else difflib.get_close_matches(typed, list(by_lower), n=MAX_SUGGESTIONS)
        named = [repr(by_lower[c]) for c in close]
        hint = f" (did you mean {', '.join(named[:-1])} or {named[-1]}?)" if len(named) > 1 else (f" (did you mean {named[0]}?)" if named else "")
        return cls(f"unknown {kind} {name!r}{hint}: {listing}")


class Unsupported(Exception):
    """A backend cannot serve a case; the message is the reason, in words a user understands."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, at most 300 characters of message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def is_oom(exc: BaseException) -> bool:
    """True for torch's and the allocator's out-of-memory errors (CUDA and CPU)."""
    torch = sys.modules.get("torch")  # an exception of torch's needs torch imported: this module never imports it
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
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
