"""The device's own ceilings, measured: a large matrix product and a large copy.

Measured once at the start of a run and stored as `peaks.json` in the run folder, so that every
"% of peak" in a report is against what this machine did that day, not against a datasheet.
Where each record sits under them is the analysis' arithmetic (harness.analysis.roofline).

    peak FLOP/s   the fastest sample of an n×n·n×n product in the dtype (2·n³ FLOPs)
    peak bytes/s  the fastest sample of dst.copy_(src), bytes read plus written (2·nbytes)
    ridge point   peak FLOP/s ÷ peak bytes/s (FLOP/byte): a case with a higher arithmetic
                  intensity is compute-bound, below it memory-bound.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from harness.suite.cases import canonical_dtype
from harness.measure.timing import Budget, Clock, measure


#: CPU: grow the matrix from the first size until one product lasts this long (or the last size).
CPU_SIZES = (512, 1024, 2048)
CPU_TARGET_CALL_S = 0.02
#: Short on purpose: the whole CPU measurement should cost about a second per dtype at most.
CPU_BUDGET = Budget(warmup_s=0.03, measure_s=0.2, min_sample_s=0.0, min_rounds=3, max_rounds=50, precision=0.0)
CPU_COPY_BYTES = 64 * 2**20
CUDA_MATMUL_N = 8192
#: Peaks are the best sample: every sample the budget holds is a chance at it, so neither budget stops early.
CUDA_BUDGET = Budget(warmup_s=0.1, measure_s=0.3, min_sample_s=0.0, min_rounds=10, max_rounds=200, precision=0.0)
CUDA_COPY_BYTES = 2**30


def _timed(fn: Callable[[], object], clock: Clock, budget: Budget) -> dict[str, float]:
    """Median and best per-call seconds of `fn` through the harness timer."""
    stats = measure(fn, clock, budget).stats
    return {"median_s": stats.median, "best_s": stats.min, "samples": stats.n}


def _matmul_peak(torch: Any, dtype: str, device: str, clock: Clock, budget: Budget) -> dict[str, Any]:
    """TFLOP/s of an n×n product in `dtype`: the size grows on CPU until one call is long enough to time."""
    from harness.suite.inputs import torch_dtype

    tdtype = torch_dtype(dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    sizes = (CUDA_MATMUL_N,) if device == "cuda" else CPU_SIZES
    for n in sizes:
        a = torch.randn(n, n, generator=generator, device=device, dtype=torch.float32).to(tdtype)
        b = torch.randn(n, n, generator=generator, device=device, dtype=torch.float32).to(tdtype)
        if device == "cuda":
            break
        torch.matmul(a, b)  # the first call pays for thread-pool start-up and page faults
        start = time.perf_counter()
        torch.matmul(a, b)
        if time.perf_counter() - start >= CPU_TARGET_CALL_S:
            break
    timed = _timed(lambda: torch.matmul(a, b), clock, budget)
    flops = 2 * n**3
    return {
        "n": n, "flops": flops, **timed,
        "tflops": flops / timed["best_s"] / 1e12, "tflops_median": flops / timed["median_s"] / 1e12,
    }


def _copy_peak(torch: Any, device: str, nbytes: int, clock: Clock, budget: Budget) -> dict[str, Any]:
    """GB/s of a device-to-device (or RAM-to-RAM) copy, counting bytes read plus written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    timed = _timed(lambda: dst.copy_(src), clock, budget)
    moved = 2 * nbytes
    return {
        "bytes": nbytes, "bytes_moved": moved, **timed,
        "gbps": moved / timed["best_s"] / 1e9, "gbps_median": moved / timed["median_s"] / 1e9,
    }


def measure_peaks(device: str, dtypes: Iterable[str]) -> dict[str, Any]:
    """Measure the matmul ceiling per dtype and the copy ceiling on `device` (`cpu` or `cuda`), in this process."""
    import torch

    device = "cuda" if str(device).startswith("cuda") else "cpu"
    names = sorted({canonical_dtype(d) for d in dtypes}) or ["fp32"]
    if device == "cuda":
        from harness.measure.cuda_clock import CudaEventClock

        clock: Clock = CudaEventClock()
        budget, copy_bytes = CUDA_BUDGET, CUDA_COPY_BYTES
        free, _ = torch.cuda.mem_get_info()
        copy_bytes = int(min(copy_bytes, free // 4))
    else:
        clock, budget, copy_bytes = time.perf_counter, CPU_BUDGET, CPU_COPY_BYTES
    started = time.perf_counter()
    peaks: dict[str, Any] = {
        "device": device, "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "timer": "cuda-event" if device == "cuda" else "perf_counter", "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "statistic": "best sample (fastest call)",
        "matmul": {}, "copy": None, "errors": {},
    }
    if device == "cuda":
        peaks["device_name"] = torch.cuda.get_device_name()
        peaks["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    for name in names:
        try:
            peaks["matmul"][name] = _matmul_peak(torch, name, device, clock, budget)
        except Exception as exc:  # noqa: BLE001 - a ceiling we cannot measure is reported, not fatal
            peaks["errors"][f"matmul_{name}"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    try:
        peaks["copy"] = _copy_peak(torch, device, copy_bytes, clock, budget)
    except Exception as exc:  # noqa: BLE001
        peaks["errors"]["copy"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if device == "cuda":
        torch.cuda.empty_cache()
    peaks["wall_s"] = time.perf_counter() - started
    return peaks


def main(argv: Sequence[str]) -> int:
    """The `peaks` child job: `--device cuda --dtypes bf16,fp16 --out peaks.json` (what the run folder's write_peaks starts on CUDA)."""
    from harness.process.jobs import job_parser

    parser = job_parser("peaks", "measure the device's matmul and copy ceilings")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtypes", default="fp32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    peaks = measure_peaks(args.device, [d for d in args.dtypes.split(",") if d])
    text = json.dumps(peaks, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0
