"""A test-only backend that kills its own process with SIGKILL on the failing case (as the kernel's OOM killer would).

Like the backends of tests/failing_backends.py it computes naive attention on every other case and
logs each prepare() to ATTNBENCH_TEST_LOG. Load it with `ATTNBENCH_BACKENDS=tests.ray_backends:KillBackend`.
"""

from __future__ import annotations

import os
import signal
import time

from tests.failing_backends import _Failing


class KillBackend(_Failing):
    """SIGKILLs its own worker process: nothing in the process can catch it or write a row."""

    name = "t-kill"

    def fail(self, case, inputs) -> None:
        """SIGKILL, for real."""
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # never return before the signal lands
