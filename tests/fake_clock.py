"""A clock for tests: it moves only when told to, so that statistics come out exact."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when told to: for tests that need exact statistics."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds
