"""Progress of a run: a one-line bar with an ETA on a terminal, a line every few seconds elsewhere (a CI log), and the
cheap tail of records.jsonl both are fed from."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, TextIO

from harness.errors import UserError
from harness.results.record import Record

#: Seconds between two progress lines when the stream is not a terminal: a CI log shows the sweep alive and where it is
#: without a line per pair (a `quick` sweep records ~1,000 rows; a bar redrawn in place would be one unreadable line there).
LINE_INTERVAL_S = 5.0


class Progress:
    """Pairs done of a run's total: a bar redrawn in place on a terminal, else a line every LINE_INTERVAL_S with the last pair."""

    def __init__(self, total: int, already: int, stream: TextIO | None, *, label: str = "", offset: int = 0,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = LINE_INTERVAL_S) -> None:
        #: `offset`: lines of the records file before this count's first (a re-measure phase counts only its own rows).
        self.total, self.already, self.stream, self.label, self.offset = total, already, stream, label, offset
        self.finished = False
        self.clock, self.interval_s = clock, interval_s
        self.started = clock()
        self.last = -1
        self.last_line_at: float | None = None
        isatty = getattr(stream, "isatty", None)
        self.bar = bool(isatty and isatty())

    def _eta(self, done: int) -> float | None:
        elapsed = self.clock() - self.started
        new = done - self.already
        rate = new / elapsed if elapsed > 0 and new > 0 else 0
        return (self.total - done) / rate if rate else None

    def update(self, done: int, final: bool = False, last_pair: Callable[[], str | None] | None = None) -> None:
        """Redraw the bar when the count changes (and once more at the end); off a terminal, print a line every interval_s.

        `last_pair`: the key of the pair recorded last, asked only when a line is printed (it reads a record)."""
        if self.stream is None or self.finished:
            return
        done -= self.offset
        self.finished = final
        if self.bar:
            self._draw_bar(done, final)
            return
        now = self.clock()
        due = self.last_line_at is None or now - self.last_line_at >= self.interval_s
        if not (final or (due and done != self.last)):
            return
        self.last, self.last_line_at = done, now
        eta = self._eta(done)
        elapsed = now - self.started
        words = [f"{self.label}{done}/{self.total} pairs", f"{_clock_text(elapsed)} elapsed"]
        if not final:
            words.append(f"ETA {_clock_text(eta)}" if eta is not None else "ETA --:--")
        last = last_pair() if last_pair is not None else None
        if last:
            words.append(f"last: {last}")
        self.stream.write("progress: " + ", ".join(words) + "\n")
        self.stream.flush()

    def _draw_bar(self, done: int, final: bool) -> None:
        if done == self.last and not final:
            return
        self.last = done
        eta = self._eta(done)
        width = 30
        filled = int(width * done / max(1, self.total))
        eta_text = f"ETA {_clock_text(eta)}" if eta is not None else "ETA --:--"
        self.stream.write(f"\r{self.label}[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {eta_text} ")  # type: ignore[union-attr]
        if final:
            self.stream.write("\n")  # type: ignore[union-attr]
        self.stream.flush()  # type: ignore[union-attr]


def _clock_text(seconds: float) -> str:
    """`m:ss` of a number of seconds."""
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


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
        #: The last whole line counted, kept unparsed (`last_key` parses it when a progress line names it).
        self.last_line = b""
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
        if read[0]:
            body = read[0][:-1]
            self.last_line = body[body.rfind(b"\n") + 1:]
        return self.lines

    def last_key(self) -> str | None:
        """The pair key of the last whole line counted (parsed only now), or None."""
        if not self.last_line:
            return None
        try:
            data = json.loads(self.last_line)
            return f"{data['case_id']}-{data['backend']}"
        except (ValueError, TypeError, KeyError, RecursionError):
            return None

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
