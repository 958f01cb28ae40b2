"""A one-line progress bar with an ETA, drawn only on a terminal."""

from __future__ import annotations

import time
from typing import TextIO


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
