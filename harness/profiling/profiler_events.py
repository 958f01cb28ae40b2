"""What each torch.profiler event is, read the same way from every supported torch (2.11 on), and which step holds it.

torch 2.11's `FunctionEvent` has no `activity_type` (2.13 added it), so the kinds are told apart by
the fields both have: the device type, `is_user_annotation` (true for a `record_function` range on
the host and for the copy of it Kineto puts on the GPU timeline, which has device type CUDA and the
same name) and the name. `activity_type`, where present, only refines two cases and gives the same
answers (tests/test_profile_events.py runs both shapes).
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Sequence

#: Name of the user annotation around each profiled step (`record_function`), followed by its index.
STEP_MARKER = "attnbench::profile_step#"
#: Name of the user annotation around the setup run before each profiled step (the L2 flush on CUDA).
SETUP_MARKER = "attnbench::profile_setup"

#: What a profiler event is, as `event_kind` tells them apart.
HOST_OPERATOR, STEP, SETUP, DEVICE_WORK, DEVICE_ANNOTATION, OTHER = (
    "host operator", "step marker", "setup marker", "device work", "device annotation", "other")
#: Kineto activity types of device work: what the CUDA kernel time sums (not the GPU-side copies of annotations).
_DEVICE_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")
_NOT_OPERATORS = ("[memory]", "[OutOfMemory]")
#: CUDA runtime and driver API calls (cudaLaunchKernel, cuLaunchKernel): host events, but not operators.
_CUDA_API = re.compile(r"^cu(da)?[A-Z]")


def event_kind(e: Any) -> str:
    """What one profiler event is: a host operator, a step or setup marker on the host, device work, a device-side annotation, or other.

    A step's GPU-side copy is a device annotation, never a step: counted as one, five steps would
    hold ten markers. A CUDA runtime call (cudaLaunchKernel) is on the host but not an operator.
    """
    from torch.autograd import DeviceType

    activity = getattr(e, "activity_type", None)
    if e.is_user_annotation:
        if e.device_type != DeviceType.CPU:
            return DEVICE_ANNOTATION
        return STEP if e.name.startswith(STEP_MARKER) else SETUP if e.name == SETUP_MARKER else OTHER
    if e.device_type != DeviceType.CPU:
        # Without an activity type every other device event is work: Kineto's only other ones (CUDA_SYNC,
        # profiler ranges) are recorded only when an experimental config asks, which the harness never does.
        return DEVICE_WORK if activity is None or activity in _DEVICE_ACTIVITIES else OTHER
    if e.name in _NOT_OPERATORS or (activity != "cpu_op" if activity is not None else _CUDA_API.match(e.name)):
        return OTHER
    return HOST_OPERATOR


class Windows:
    """Sorted, disjoint time windows (µs) and the one holding a time, by binary search."""

    def __init__(self, windows: Sequence[tuple[float, float]]):
        self.spans = sorted(windows)
        self.starts = [start for start, _ in self.spans]

    def index(self, t_us: float) -> int | None:
        """The index of the window holding `t_us`, or None."""
        i = bisect.bisect_right(self.starts, t_us) - 1
        return i if i >= 0 and t_us <= self.spans[i][1] else None
