"""What the process that drives a run (the local supervisor, the Ray driver) does the same whoever runs the pairs.

It writes the rows of pairs nobody measured (a worker or task that died or overran, a plugin that
failed to load, a pair no worker reached) and turns SIGTERM into the interrupt a Ctrl-C would be, so
that a run stopped either way cleans up and says how to resume.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Iterator

from harness.backends.base import Backend
from harness.backends.registry import Registry, UnloadedPlugin
from harness.execution.outcome import case_record
from harness.results.record import Status
from harness.results.store import RunWriter
from harness.run.repro import RunRows
from harness.run.rundir import RunFolder
from harness.suite.cases import Case


def backend_for(name: str, folder: RunFolder, registry: Registry) -> Backend:
    """The backend a row of `folder` names: the registry's, or a stand-in carrying the load error of a broken plugin."""
    broken = folder.broken
    return UnloadedPlugin(name, broken[name]) if name in broken else registry.get(name)


class FailureRows:
    """Appends the row of a pair that ended without a measurement, stamped like every row of the run."""

    def __init__(self, writer: RunWriter, folder: RunFolder, pairs: dict[str, tuple[Case, str]], registry: Registry) -> None:
        self.writer, self.folder, self.pairs, self.registry = writer, folder, pairs, registry
        self.rows = RunRows(folder.manifest, folder.path, pairs)

    def write(self, key: str, worker: str, status: str, reason: str, where: dict[str, Any] | None = None) -> None:
        """Append pair `key`'s row with `status` and `reason`; `where` sets the columns naming where it ran (node, device_name)."""
        case, backend = self.pairs[key]
        record = case_record(case, backend_for(backend, self.folder, self.registry), self.folder.run_id, worker)
        record.status, record.reason = Status(status), reason
        self.rows.stamp(record)
        for name, value in (where or {}).items():
            setattr(record, name, value)
        self.writer.append(record)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside: SIGTERM raises KeyboardInterrupt (as Ctrl-C does), then the handler before is put back."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
