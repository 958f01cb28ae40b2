"""Kineto's own progress lines (`USDT: … profiler_start`, `STAGE: … Completed Stage`) kept out of the harness's output.

Kineto writes them from C++ straight to the process's stderr descriptor, so `sys.stderr` never sees
them, and `KINETO_LOG_LEVEL` does not silence them (measured with torch 2.13: its `USDT` lines
appear at every level). So while the profiler runs, descriptor 2 is a pipe whose reader thread
passes every line on to the real stderr as it arrives, except those progress lines. Nothing else is
held back: a backend's warning, a C++ abort message, Kineto's own WARNING and ERROR lines all
reach stderr when they are written, so a crash mid-profile loses no diagnosis. (The reader needs
the GIL: a C++ call that held it while writing more than a pipe's buffer, 64 KiB, would wait for
the reader; Kineto's lines are a few hundred bytes per profile.)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Iterator

#: A Kineto log line of the chatter levels: `LEVEL:YYYY-MM-DD HH:MM:SS pid:tid File.cpp:line] text`.
KINETO_CHATTER = re.compile(rb"^(USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\]")

_STDERR_FD = 2
#: How long to wait, after the profiler stops, for the reader to pass on what is left in the pipe.
_DRAIN_TIMEOUT_S = 10.0


def without_kineto_chatter(data: bytes) -> bytes:
    """`data` (whole lines) with Kineto's progress lines removed."""
    return b"".join(line for line in data.splitlines(keepends=True) if not KINETO_CHATTER.match(line))


def _forward(read_fd: int, out_fd: int) -> None:
    """Copy lines from `read_fd` to `out_fd` until end of file, dropping Kineto's progress lines."""
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        kept = without_kineto_chatter(b"".join(line + b"\n" for line in lines))
        if kept:
            os.write(out_fd, kept)
    if pending:
        os.write(out_fd, without_kineto_chatter(pending))
    os.close(read_fd)


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Run the block with Kineto's progress lines filtered out of stderr (descriptor 2); all else passes through."""
    sys.stderr.flush()
    saved = os.dup(_STDERR_FD)
    read_fd, write_fd = os.pipe()
    reader = threading.Thread(target=_forward, args=(read_fd, saved), name="kineto-log-filter", daemon=True)
    reader.start()
    os.dup2(write_fd, _STDERR_FD)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, _STDERR_FD)  # closes the pipe's last write end: the reader sees its end and stops
        reader.join(_DRAIN_TIMEOUT_S)
        if not reader.is_alive():  # a reader still writing keeps its descriptor: closing it could write elsewhere
            os.close(saved)
