"""The words a record's columns take, and the thresholds its flags are defined by: the schema's vocabulary.

The measuring side (harness.measure, .execution, .telemetry, .profiling) writes these words and the
reading side (harness.analysis, harness.report) reads them; both import them from here, so a report
never reaches into the code that measures to learn what a column means.
"""

from __future__ import annotations

import re
from enum import Enum

class Status(str, Enum):
    """How a pair ended: the only status words a record, `attnbench check` or `gpu-check` uses."""

    OK = "ok"
    UNSUPPORTED = "unsupported"
    OOM = "oom"
    ERROR = "error"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    #: Not run at all (gpu-check's budget was spent before this backend's turn).
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


#: What set a measurement's number of samples (`Record.stopped_by`; an external loop's is its `Plan.stop`).
STOP_PRECISION, STOP_BUDGET, STOP_MIN_ROUNDS, STOP_MAX_ROUNDS = "precision", "budget", "min_rounds", "max_rounds"
#: One call costs more than the whole budget: the row has `Budget.fewest_rounds` samples, fewer than `min_rounds`.
STOP_CALL_EXCEEDS_BUDGET = "call_exceeds_budget"
#: The pair's first call cost FIRST_CALL_ONLY_FACTOR times its whole budget (warm-up and samples) or more, and the
#: budget asks for one sample at the fewest: that call is the row's one sample, with no warm-up call before it.
STOP_FIRST_CALL = "first_call"

#: The phases whose seconds a record carries (`time_<phase>_s`): where a sweep's wall time goes.
PHASE_NAMES = ("inputs", "prepare", "check", "warmup", "timed", "memory", "energy", "profile")

#: A drift at least this large (in %) flags the row (`drifted`): more than the ±1 % a median is promised to.
DRIFT_FLAG_PCT = 1.0
#: A sample shorter than this many ticks may be off by more than 1 % from quantisation alone (`too_short`; pyperf's warning, in spirit).
MIN_SAMPLE_TICKS = 100

#: Categories every profiled operator or kernel falls into, in the order tables and record columns list them.
CATEGORIES = ("matmul", "softmax", "elementwise", "copy/expand", "fused attention", "other")


def column_name(category: str) -> str:
    """The record column of a category's time per step: `profile_ms_copy_expand` for "copy/expand"."""
    return "profile_ms_" + re.sub(r"[^0-9a-z]+", "_", category.lower()).strip("_")


#: nvidia-ml-py's nvmlClocksThrottleReason* (alias nvmlClocksEventReason*) bits, named for a reader (`gpu_throttle_reasons`).
THROTTLE_BITS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
    0x100: "display clock setting",
    0x200: "board limit",
    0x400: "reliability",
}
#: The bits that mean the GPU gave up performance it had (all but idle and the clock settings someone chose).
SLOWDOWN_BITS = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x200 | 0x400


def throttle_words(mask: int) -> str:
    """The names of a mask's bits ("none" for 0), unknown bits in hex."""
    if mask == 0:
        return "none"
    named = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_BITS)
    return ", ".join(named + ([hex(unknown)] if unknown else []))


#: The row flags that keep a measured row from deciding any answer, each with why, as a user reads it
#: (harness.analysis.trust leaves such rows out; the run's summary line and the pytest route count them).
UNTRUSTED_FLAGS = {
    "contended": "another process took the CPU or the GPU during its samples",
    "suspect": "its samples spread too widely: an IQR at least 25 % of the median",
    "throttled": "the GPU's SM clock was below its sustained clock, or a slowdown reason was set, in at least a tenth of "
                 "the readings during its samples (harness.telemetry.gpu_state.THROTTLED_SHARE)",
    "kernel_mismatch": "the profiler did not show the kernel its backend claims for the case (an FP8 row that ran a bf16 GEMM): "
                       "it measured another path",
}
