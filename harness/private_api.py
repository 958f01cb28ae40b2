"""What the checks of torch's and xFormers' private APIs share (the checks live beside their callers)."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def refused_signature(fn: Callable[..., Any], *args: Any) -> str | None:
    """`fn`'s signature, as text, when it cannot take `args`; None when it can, or has no signature to read (a builtin)."""
    try:
        signature = inspect.signature(fn)
    except ValueError:
        return None
    try:
        signature.bind(*args)
    except TypeError:
        return str(signature)
    return None
