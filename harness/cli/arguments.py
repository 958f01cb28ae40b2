"""The command line's argument values: each parsed or refused with a one-line error naming the flag (exit 2)."""

from __future__ import annotations

import argparse

from harness.errors import UserError


def comma_list(text: str) -> list[str]:
    """A comma-separated list of names, none empty and none given twice."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    repeated = sorted({t for t in items if items.count(t) > 1})
    if repeated:  # a backend named twice would run (and be listed) twice
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given more than once in {text!r}")
    return items


def non_negative_int(text: str) -> int:
    """An integer, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def mode_list(text: str) -> list[str]:
    """A comma list of modes, each one the harness knows (an unknown one would silently select nothing)."""
    from harness.suite.cases import MODES

    modes = comma_list(text)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode {', '.join(map(repr, unknown))}: expected {', '.join(MODES)}")
    return modes


def dtype_list(text: str) -> list[str]:
    """A comma list of dtypes, each one the harness knows, in canonical spelling."""
    from harness.suite.cases import canonical_dtype

    try:
        dtypes = [canonical_dtype(d) for d in comma_list(text)]
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    repeated = sorted({d for d in dtypes if dtypes.count(d) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given more than once in {text!r}")
    return dtypes


def size_bytes(flag: str, text: str | None) -> int | None:
    """A size like 8G or 512M in bytes (None when the flag was not given); a bad one is a UserError naming `flag`."""
    if text is None:
        return None
    from harness.run.protocol import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def memory_limit(text: str | None) -> int | None:
    """--memory-limit in bytes; refused above this machine's memory and swap, which no worker can use (and RLIMIT_AS cannot even hold 10²⁰ TiB)."""
    limit = size_bytes("--memory-limit", text)
    if limit is None:
        return None
    from harness.run.protocol import machine_memory_bytes

    ceiling = machine_memory_bytes()
    if ceiling is not None and limit > ceiling:
        raise UserError(f"--memory-limit {text} is more than this machine's memory and swap ({ceiling / 2**30:.1f} GiB): it would limit nothing")
    return limit


def gpu_list(text: str | None) -> list[int] | None:
    """--gpus: 'all' (every CUDA device torch sees) or device indices like 0,1; None when not given."""
    if text is None:
        return None
    if text == "all":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--gpus all: torch sees no CUDA device")
        return list(range(torch.cuda.device_count()))
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise UserError(f"--gpus takes 'all' or a list like 0,1: got {text!r}") from None
