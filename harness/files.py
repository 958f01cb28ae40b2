"""Files read safely: only regular files, never a FIFO that blocks, never more than a limit, JSON that names where it broke.

Every reader of a file a user or an earlier run supplies (a run folder's documents and records, a suite's lengths
files, a variation log) opens it here: `open_regular` opens it non-blocking and checks the descriptor, so a FIFO is
refused rather than waited on, and nothing can swap the file between the check and the read.
"""

from __future__ import annotations

import json
import os
import stat
import contextlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from harness.errors import UserError

#: A run folder's documents are kilobytes (a Ray cluster's env.json a few hundred); more is not one of them.
MAX_DOCUMENT_BYTES = 64 * 2**20

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def read_regular(path: Path | str, what: str = "regular file", limit: int | None = None) -> bytes:
    """The bytes of a regular file (symbolic links followed); UserError naming it for anything else or a failed read.

    The file is opened non-blocking and checked on its descriptor, so a FIFO is refused rather than
    waited on, and nothing can swap the file between the check and the read.
    """
    with open_regular(path, what, limit) as f:
        try:
            return f.read()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def open_regular(path: Path | str, what: str = "regular file", limit: int | None = None) -> Iterator[BinaryIO]:
    """A regular file open for reading in binary, checked as `read_regular` checks it: for a reader that streams it instead."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except OSError as exc:
        kind = _kind_of(path)  # a socket cannot be opened at all (ENXIO): say what it is, not just the errno
        raise UserError(f"{path} is {kind}, not a {what}" if kind else f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path} is {_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}, not a {what}")
        if limit is not None and info.st_size > limit:
            raise UserError(f"{path} is {info.st_size} bytes, more than the {limit} bytes such a file can be")
        f = os.fdopen(os.dup(fd), "rb")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    with f:
        yield f


#: The longest line a records file may hold: a record with a million raw samples is a few tens of MB. A longer one is no record
#: (a crash can leave gigabytes of NUL bytes in a preallocated file), and is never held in memory whole.
MAX_RECORD_BYTES = 64 * 2**20
#: How much of a streamed file is read at a time.
_CHUNK_BYTES = 2**20


def lines_of(f: BinaryIO, limit: int) -> Iterator[tuple[bytes | str, int, bool]]:
    """Each line of the binary file `f` without its newline, its length in bytes with it, and whether it ended with a newline
    (only the last may not). A line that can be no record (longer than `limit`, or holding a NUL byte, which JSON never does)
    comes as the reason, in words, read through but never held whole."""
    pending, size, junk = bytearray(), 0, ""
    while chunk := f.read(_CHUNK_BYTES):
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            size += len(piece) + (end >= 0)
            if not junk:
                if b"\0" in piece:
                    junk = "it holds NUL bytes, as a crash can leave a preallocated file"
                elif len(pending) + len(piece) > limit:
                    junk = f"a line of more than {limit} bytes"
            if junk:
                pending = bytearray()
            else:
                pending += piece
            if end < 0:
                break
            yield (junk or bytes(pending)), size, True
            pending, size, junk, start = bytearray(), 0, "", end + 1
    if size:
        yield (junk or bytes(pending)), size, False


def _kind_of(path: Path) -> str | None:
    """What `path` is when it is not a regular file (a socket, a FIFO, …), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def parse_json(raw: bytes, where: Path | str) -> Any:
    """One JSON document; UserError naming `where` when it is not UTF-8 JSON or is nested deeper than the parser goes."""
    try:
        return json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError included
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{where}: not valid JSON (nested too deep)") from None
