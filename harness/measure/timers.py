"""What a row's latency means, chosen per run (`attnbench run --timer`): device time between events, the profiler's
kernel time per call, or the replay of a captured CUDA graph.

- `events` (default): CUDA events around each call (device time between them, the host's launch time
  kept out by a spin), `time.perf_counter` on the CPU.
- `kernels`: after the event samples, as many calls under torch.profiler (at least 10, at most
  KERNEL_TIMER_MAX_STEPS), each after the same L2 flush; each sample is one call's summed kernel
  time (CUDA) or operator self time (CPU), as FlashInfer's CUPTI timing reports. Gaps between
  kernels are not in it: for µs-scale decoding kernels that is the difference.
- `graph`: the forward step captured once in a CUDA graph and each sample one replay, as production
  decoding runs (FlashAttention's decode benchmarks time it so). CUDA and forward only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from harness.errors import Unsupported
from harness.profiling.profile import profile_step
from harness.measure.cuda_clock import CudaEventClock, L2Flusher
from harness.measure.stats import Stats
from harness.measure.timing import Clock, Measurement
from harness.results.documents import TIMERS  # noqa: F401 - run --timer's choices, re-exported where the timers are
from harness.suite.cases import Case

#: Bounds on the calls `--timer kernels` profiles (the row's `samples`). Every profiled call pays the
#: profiler's overhead and its own flush, and 200 already put the median's 95 % interval between the
#: 86th and 115th order statistics; profiling all of a CUDA row's up to 1,000 samples took seconds a pair.
KERNEL_TIMER_MIN_STEPS = 10
KERNEL_TIMER_MAX_STEPS = 200
#: Captures the graph is warmed up with on a side stream before capture (allocations settle there).
GRAPH_WARMUP_CALLS = 3


class FlushBuffer:
    """The one L2 flush buffer (hundreds of MB) of whoever runs a process's pairs: made on first use, freed by close().

    A pair's first call runs inside its peak-memory window; what a process allocates once for good
    (the flush buffer, the workspace cuBLAS keeps per handle after its first matmul) is made on the
    first `flusher()`, before any window opens, so it is never charged to whichever pair happened to come first.
    """

    def __init__(self) -> None:
        self._flusher: L2Flusher | None = None

    def flusher(self) -> L2Flusher:
        """The buffer's flush, made (with cuBLAS's workspaces) on the first call."""
        if self._flusher is None:
            import torch

            flusher = L2Flusher()
            for dtype in (torch.float32, torch.bfloat16):
                square = torch.ones(64, 64, device="cuda", dtype=dtype)
                product = square @ square
                del square, product
            torch.cuda.synchronize()
            self._flusher = flusher
        return self._flusher

    def close(self) -> None:
        """Drop the buffer (the caching allocator keeps its memory for the next one); the next use makes a new one."""
        self._flusher = None

    def __enter__(self) -> FlushBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def between_sample_setup(device: str, flush: FlushBuffer) -> Callable[[], None] | None:
    """What runs before every timed sample and every profiled step: `flush`'s L2 flush on CUDA, nothing on the CPU."""
    return flush.flusher() if device.startswith("cuda") else None


def device_clock(device: str, flush: FlushBuffer | None = None) -> tuple[Clock, Callable[[], None] | None, str]:
    """The clock, the between-sample setup (L2 flush on CUDA, `flush`'s or else a buffer of its own) and the timer's name for a device."""
    if device.startswith("cuda"):
        return CudaEventClock(), between_sample_setup(device, flush or FlushBuffer()), "cuda-event"
    return time.perf_counter, None, "perf_counter"


def graph_replay(step: Callable[[], object], case: Case) -> Callable[[], object]:
    """The step captured in a CUDA graph, as a zero-argument replay; Unsupported with the reason when it cannot be."""
    if case.device != "cuda":
        raise Unsupported("--timer graph replays a CUDA graph: CUDA cases only")
    if case.mode != "fwd":
        raise Unsupported("--timer graph captures forward steps only (autograd.grad cannot be captured as the harness calls it)")
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_CALLS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            held = step()  # the graph's output buffers: kept alive for as long as the replay is
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            raise
        raise Unsupported(f"cannot be captured in a CUDA graph: {' '.join(str(exc).split())[:200]}") from None

    def replay() -> object:
        graph.replay()
        return held

    return replay


def kernel_measurement(measured: Measurement, step: Callable[[], object], device: str,
                       setup: Callable[[], None] | None) -> Measurement:
    """The event measurement with its samples replaced by the profiler's per-call kernel (or operator) times.

    Each profiled call follows `setup`, the flush the event samples had, so both timers see the same cold L2.
    No allocations are recorded: the row's peak is measured around the event samples (PeakMeter).
    """
    steps = min(max(measured.stats.n, KERNEL_TIMER_MIN_STEPS), KERNEL_TIMER_MAX_STEPS)
    summary = profile_step(step, device, steps=steps, setup=setup, memory=False)
    samples = summary.step_kernel_time_s
    if not samples or not all(s > 0 for s in samples):
        raise Unsupported("--timer kernels: the profiler recorded no kernel time for this step")
    return dataclasses.replace(measured, stats=Stats.from_samples(samples, 1), too_short=False)


def timer_name(timer: str, device: str, events_name: str) -> str:
    """The `timer` column of a row: what its latency is."""
    if timer == "kernels":
        return "cuda-kernels (profiler)" if device.startswith("cuda") else "cpu-operators (profiler)"
    if timer == "graph":
        return "cuda-graph-replay"
    return events_name
