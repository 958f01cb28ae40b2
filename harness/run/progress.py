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
    """The whole lines of a growing records file, and the pair keys they record, each read from only the bytes appended since its last look.

    A records line carries up to a thousand raw samples, so reading the file again five times a second
    (or on every worker's end) would re-read tens of MB. The count the progress bar polls only counts
    newlines: a line is parsed into its key only when `recorded_keys` is asked (a worker ended abnormally),
    never while the bar polls beside a worker's timed samples. A last line still being written is not
    counted until its newline lands; a file that shrank (cut back to its whole lines, or replaced) is read
    again from its start. A line that is not a whole record adds no key (the run's closing read names it).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        #: Bytes up to and including the last newline counted, and the newlines in them.
        self.offset = 0
        self.lines = 0
        #: Bytes whose lines have been parsed into keys, and the pairs those lines record.
        self.keys_offset = 0
        self.keys: set[str] = set()

    def _whole_lines_after(self, offset: int) -> tuple[bytes, int] | None:
        """The whole lines appended after `offset` and the file's size (None when it cannot be read, as before it exists)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(min(offset, size))
                new = f.read(max(size - offset, 0))
        except OSError:
            return None
        return new[: new.rfind(b"\n") + 1], size

    def count(self) -> int:
        """Whole lines in the file now (0 while it does not exist)."""
        read = self._whole_lines_after(self.offset)
        if read is None:
            return self.lines
        if read[1] < self.offset:  # shrank: counted again from the start
            self.offset = self.lines = 0
            return self.count()
        self.lines += read[0].count(b"\n")
        self.offset += len(read[0])
        return self.lines

    def recorded_keys(self) -> set[str]:
        """The pair keys of every whole record in the file now."""
        read = self._whole_lines_after(self.keys_offset)
        if read is None:
            return self.keys
        if read[1] < self.keys_offset:
            self.keys_offset, self.keys = 0, set()
            return self.recorded_keys()
        for line in read[0].splitlines():
            try:
                self.keys.add(Record.from_dict(json.loads(line)).pair_key)
            except (ValueError, TypeError, RecursionError, UserError):
                continue
        self.keys_offset += len(read[0])
        return self.keys
