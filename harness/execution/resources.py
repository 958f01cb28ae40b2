"""What the pairs a runner runs share and must give back: the device's telemetry (NVML, RAPL) and the L2 flush buffer.

Owned by whoever runs the pairs (a `PairRunner` holds one for its pairs; `run_pair` alone holds one for
its pair), opened on first use and released by `close()`, so nothing of the kind lives in a module's
cache for the rest of the process, and a test starts from a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.measure.timers import FlushBuffer
from harness.telemetry.session import TelemetrySession


@dataclass
class PairResources:
    """The telemetry session and the flush buffer of a runner's pairs, each opened on first use."""

    telemetry: TelemetrySession = field(default_factory=TelemetrySession)
    flush: FlushBuffer = field(default_factory=FlushBuffer)

    def close(self) -> None:
        """Release NVML and the flush buffer; the next pair opens them afresh."""
        self.telemetry.close()
        self.flush.close()

    def __enter__(self) -> PairResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
