"""Test-only backends that fail for real: out of memory, a segfault, a hang, a sticky CUDA error, unsupported.

Each one computes correct attention (the naive kernel) on every case except those with
S_q == FAIL_S (32 unless ATTNBENCH_TEST_FAIL_S says otherwise), where it fails its own way, so one
suite mixes failing pairs among normal ones. Workers load them with
`ATTNBENCH_BACKENDS=tests.failing_backends:add_all`. Every prepare() appends `<pair key> <pid>` to
the file named by ATTNBENCH_TEST_LOG (if set), so tests can count how often each pair really ran.
"""

from __future__ import annotations

import os
import signal
import time
import weakref

import torch

from harness.backends.base import Backend, Prepared
from harness.attention.eager import naive_attention
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.results.record import pair_key

#: Weak references to the big tensors the OOM backend held when it raised (tests check they are freed).
HELD: list[weakref.ref] = []


def fail_s() -> int:
    """The S_q on which the failing backends fail."""
    return int(os.environ.get("ATTNBENCH_TEST_FAIL_S", "32"))


def _log_execution(case: Case, name: str) -> None:
    path = os.environ.get("ATTNBENCH_TEST_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{pair_key(case, name)} {os.getpid()}\n".encode())
        finally:
            os.close(fd)


def _rendezvous() -> None:
    """With ATTNBENCH_TEST_RENDEZVOUS=N, wait (at most 30 s) until N distinct processes have logged a pair."""
    wanted, path = int(os.environ.get("ATTNBENCH_TEST_RENDEZVOUS", "0")), os.environ.get("ATTNBENCH_TEST_LOG")
    deadline = time.monotonic() + 30
    while wanted and path and time.monotonic() < deadline:
        with open(path) as f:
            if len({line.split()[-1] for line in f if line.strip()}) >= wanted:
                return
        time.sleep(0.05)


class _Failing(Backend):
    """Naive attention, except on the failing case, where `fail` runs."""

    family = "test-failing"
    devices = ("cpu",)

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Log the execution, fail on the failing case, else return naive attention."""
        _log_execution(case, self.name)
        if case.S_q == fail_s():
            self.fail(case, inputs)
        q, k, v = inputs.q, inputs.k, inputs.v
        mask = visible_mask(case, device=q.device)
        return Prepared(fn=lambda: naive_attention(q, k, v, mask), leaves=(q, k, v))

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Fail the way this backend does."""


class SlowBackend(_Failing):
    """Never fails; prepare takes ATTNBENCH_TEST_PREPARE_S seconds (default 0.3), so a run lasts long enough to be killed."""

    name = "t-slow"

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Wait for the other workers (if asked), sleep, then serve the case."""
        prepared = super().prepare(case, inputs)
        _rendezvous()
        time.sleep(float(os.environ.get("ATTNBENCH_TEST_PREPARE_S", "0.3")))
        return prepared

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Never fails."""


class OomRaiseBackend(_Failing):
    """Raises torch.OutOfMemoryError while holding a big tensor (which the harness must free)."""

    name = "t-oom"

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Allocate 256 MiB, then raise torch's out-of-memory error with it still referenced from this frame."""
        big = torch.ones(64 * 2**20, dtype=torch.float32)
        HELD.append(weakref.ref(big))
        raise torch.OutOfMemoryError(f"simulated: tried to allocate {big.numel() * 4} more bytes")


class AllocBackend(_Failing):
    """Really allocates ATTNBENCH_TEST_ALLOC_BYTES (default 3 GiB) and touches it: past a worker memory limit."""

    name = "t-alloc"

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Allocate and fill the big tensor."""
        big = torch.ones(int(os.environ.get("ATTNBENCH_TEST_ALLOC_BYTES", str(3 * 2**30))), dtype=torch.uint8)
        big.add_(1)


class SegfaultBackend(_Failing):
    """Kills its own process with SIGSEGV."""

    name = "t-segv"

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """SIGSEGV, for real."""
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)  # the signal is delivered asynchronously; never return meanwhile


class HangBackend(_Failing):
    """Sleeps far past any test's time limit."""

    name = "t-hang"

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Sleep an hour."""
        time.sleep(3600)


class StickyBackend(_Failing):
    """Raises the error torch raises after an illegal memory access on CUDA (the message only: no GPU here)."""

    name = "t-sticky"

    def fail(self, case: Case, inputs: AttentionInputs) -> None:
        """Raise the error a real illegal memory access gives (torch ≥ 2.8 raises torch.AcceleratorError, a RuntimeError)."""
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported")


class UnsupportedBackend(_Failing):
    """Cannot serve the failing case, and says why."""

    name = "t-unsup"

    def supports(self, case: Case) -> str | None:
        """Unsupported on the failing case."""
        if case.S_q == fail_s():
            return f"t-unsup serves no sequence of length {fail_s()}"
        return super().supports(case)


class SupportsRaisesBackend(_Failing):
    """Its supports() itself raises on the failing case (a buggy probe must become an error row)."""

    name = "t-probe"

    def supports(self, case: Case) -> str | None:
        """Raise on the failing case."""
        if case.S_q == fail_s():
            raise KeyError("probe bug")
        return super().supports(case)


ALL = (SlowBackend, OomRaiseBackend, AllocBackend, SegfaultBackend, HangBackend, StickyBackend, UnsupportedBackend, SupportsRaisesBackend)


def add_all(registry) -> None:
    """Add every failing backend to `registry` (the ATTNBENCH_BACKENDS hook)."""
    for cls in ALL:
        registry.add(cls())


def raise_on_load(registry) -> None:
    """A plugin hook that fails while loading."""
    raise RuntimeError("this plugin is broken on purpose")
