"""A one-line progress bar with an ETA, drawn only on a terminal, and the cheap tail of records.jsonl it is fed from."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TextIO

from harness.errors import UserError
from harness.results.record import Record


class Progress:
    """Pairs done of a run's total, redrawn in place when the count changes."""

    def __init__(self, total: int, already: int, stream: TextIO | None) -> None:
        self.total, self.already, self.stream = total, already, stream
        self.started = time.monotonic()
        self.last = -1

    def update(self, done: int, final: bool = False) -> None:
        """Redraw when the count changes (and once more at the end)."""
        if self.stream is None or (done == self.last and not final):
            return
        self.last = done
        elapsed = time.monotonic() - self.started
        new = done - self.already
        rate = new / elapsed if elapsed > 0 and new > 0 else 0
        eta = (self.total - done) / rate if rate else None
        width = 30
        filled = int(width * done / max(1, self.total))
        eta_text = f"ETA {int(eta // 60)}:{int(eta % 60):02d}" if eta is not None else "ETA --:--"
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {eta_text} ")
        if final:
            self.stream.write("\n")
        self.stream.flush()


class RecordsTail:
    """The whole lines of a growing records file and the pair keys they record, read from only the bytes appended since the last look.

    A records line carries up to a thousand raw samples, so reading the file again five times a second
    (or on every worker's end) would re-read tens of MB. A last line still being written is not counted
    until its newline lands; a file that shrank (cut back to its whole lines, or replaced) is read again
    from its start. A line that is not a whole record adds no key (the run's closing read names it).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        #: Bytes up to and including the last newline seen, the newlines in them, and the pairs those lines record.
        self.offset = 0
        self.lines = 0
        self.keys: set[str] = set()

    def count(self) -> int:
        """Whole lines in the file now (0 while it does not exist)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:
                    self.offset = self.lines = 0
                    self.keys = set()
                f.seek(self.offset)
                new = f.read(size - self.offset)
        except OSError:
            return self.lines
        whole = new.rfind(b"\n") + 1
        self.lines += new.count(b"\n", 0, whole)
        self.offset += whole
        for line in new[:whole].splitlines():
            try:
                self.keys.add(Record.from_dict(json.loads(line)).pair_key)
            except (ValueError, TypeError, RecursionError, UserError):
                continue
        return self.lines

    def recorded_keys(self) -> set[str]:
        """The pair keys of every whole record in the file now."""
        self.count()
        return self.keys
