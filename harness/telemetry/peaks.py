"""The device's own ceilings, measured: a large matrix product and a large copy.

Measured once at the start of a run and stored as `peaks.json` in the run folder, so that every
"% of peak" in a report is against what this machine did that day, not against a datasheet.
Where each record sits under them is the analysis' arithmetic (harness.analysis.roofline).

    peak FLOP/s   GPU: the fastest sample of an 8192² product in the dtype (2·n³ FLOPs), with the SM clock it ran at;
                  CPU: the fastest of a sweep of products (squares and the suite's own, both operand layouts:
                  harness.telemetry.products), since one size is not what a CPU's caches allow
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

from harness.measure.timing import Budget, Clock, measure
from harness.suite.cases import canonical_dtype
from harness.telemetry import products
from harness.telemetry.peaks_reuse import machine


CUDA_MATMUL_N = 8192
#: Peaks are the best sample: every sample the budget holds is a chance at it, so neither budget stops early.
CUDA_BUDGET = Budget(warmup_s=0.1, measure_s=0.3, min_sample_s=0.0, min_rounds=10, max_rounds=200, precision=0.0)
CPU_BUDGET = Budget(warmup_s=0.03, measure_s=0.2, min_sample_s=0.0, min_rounds=3, max_rounds=50, precision=0.0)
CPU_COPY_BYTES = 64 * 2**20
CUDA_COPY_BYTES = 2**30


def _timed(fn: Callable[[], object], clock: Clock, budget: Budget, sampler: Any = None) -> dict[str, Any]:
    """Median and best per-call seconds of `fn` through the harness timer, whether it was contended, and (GPU) the clocks it ran at."""
    timed = measure(fn, clock, budget, around=sampler.around if sampler is not None else None)
    out: dict[str, Any] = {"median_s": timed.stats.median, "best_s": timed.stats.min, "samples": timed.stats.n, "contended": timed.contended}
    summary = getattr(sampler, "summary", None)
    if summary is not None:  # the SM and memory clocks over the timed samples: a GPU row's share is read at its own clock against these
        out.update(sm_clock_mhz=summary.sm_clock_mhz_median, mem_clock_mhz=summary.mem_clock_mhz_median)
    return out


def _cuda_matmul_peak(torch: Any, dtype: str, clock: Clock, sampler: Any, device: str = "cuda") -> dict[str, Any]:
    """TFLOP/s of one 8192² product in `dtype` on the GPU (FP8: through `_scaled_mm`, as the FP8 kernels run it), with its clocks.

    `device`: cuda (a test runs the same calls on the CPU)."""
    from harness.attention.fp8 import scaled_mm_product
    from harness.suite.inputs import FP8_FORMATS
    from harness.suite.inputs import torch_dtype

    generator = torch.Generator(device=device).manual_seed(0)
    n = CUDA_MATMUL_N
    extra: dict[str, Any] = {}
    if dtype in FP8_FORMATS:  # torch.matmul has no float8 kernel on CUDA
        call = scaled_mm_product(n, n, n, dtype, device, generator)
        extra["op"] = "torch._scaled_mm" + (" (e5m2 · e4m3: CUDA refuses two e5m2 operands)" if dtype == "fp8_e5m2" else "")
    else:
        tdtype = torch_dtype(dtype)
        a = torch.randn(n, n, generator=generator, device=device, dtype=torch.float32).to(tdtype)
        b = torch.randn(n, n, generator=generator, device=device, dtype=torch.float32).to(tdtype)
        call = lambda: torch.matmul(a, b)  # noqa: E731
    timed = _timed(call, clock, CUDA_BUDGET, sampler)
    flops = 2 * n**3
    return {"n": n, "product": f"{n}×{n}·{n}×{n}", "flops": flops, **extra, **timed,
            "tflops": flops / timed["best_s"] / 1e12, "tflops_median": flops / timed["median_s"] / 1e12}


def _cpu_matmul_peak(torch: Any, dtype: str, cases: Sequence[Any]) -> dict[str, Any]:
    """The best of `harness.telemetry.products`' sweep in `dtype`: square products and the cases' own, each layout; the sweep kept."""
    rows = products.sweep(torch, dtype, products.square_products() + products.case_products(cases))
    best = products.best_of(rows)
    if best is None:
        raise RuntimeError(f"no product could be timed within {products.DTYPE_BOUND_S:g} s: {rows[0].get('skipped') if rows else 'none tried'}")
    return {**{k: best[k] for k in ("product", "source", "flops", "best_s", "median_s", "samples", "tflops", "tflops_median", "contended")},
            "sweep": rows}


def _copy_peak(torch: Any, device: str, nbytes: int, clock: Clock, budget: Budget, sampler: Any = None) -> dict[str, Any]:
    """GB/s of a device-to-device (or RAM-to-RAM) copy, counting bytes read plus written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    timed = _timed(lambda: dst.copy_(src), clock, budget, sampler)
    moved = 2 * nbytes
    return {
        "bytes": nbytes, "bytes_moved": moved, **timed,
        "gbps": moved / timed["best_s"] / 1e9, "gbps_median": moved / timed["median_s"] / 1e9,
    }


def measure_peaks(device: str, dtypes: Iterable[str], cases: Sequence[Any] = (), threads: int | None = None) -> dict[str, Any]:
    """Measure the matmul ceiling per dtype and the copy ceiling on `device` (`cpu` or `cuda`), in this process.

    On the CPU the matmul ceiling is the best of a sweep that includes `cases`' own products, timed with
    `threads` intra-op threads (the run's `--threads`; torch's default when None), restored afterwards.
    """
    import torch

    device = "cuda" if str(device).startswith("cuda") else "cpu"
    names = sorted({canonical_dtype(d) for d in dtypes}) or ["fp32"]
    before_threads = torch.get_num_threads()
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    sampler = None
    if device == "cuda":
        from harness.measure.cuda_clock import CudaEventClock
        from harness.telemetry.gpu_state import StateSampler, open_telemetry

        clock: Clock = CudaEventClock()
        budget, copy_bytes = CUDA_BUDGET, CUDA_COPY_BYTES
        free, _ = torch.cuda.mem_get_info()
        copy_bytes = int(min(copy_bytes, free // 4))
        telemetry = open_telemetry("cuda")
        sampler = StateSampler(telemetry) if telemetry.gpu is not None else None
    else:
        clock, budget, copy_bytes = time.perf_counter, CPU_BUDGET, CPU_COPY_BYTES
    started = time.perf_counter()
    peaks: dict[str, Any] = {
        "device": device, "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "timer": "cuda-event" if device == "cuda" else "perf_counter", "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "statistic": "best sample (fastest call)",
        "matmul": {}, "copy": None, "errors": {},
        # What `run --peaks` checks before a later run takes these ceilings (harness.telemetry.peaks_reuse).
        "machine": machine(device),
    }
    if device == "cuda":
        peaks["device_name"] = torch.cuda.get_device_name()
        peaks["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        if sampler is None:
            peaks["clocks_unknown"] = telemetry.reason
    try:
        for name in names:
            try:
                peaks["matmul"][name] = (_cuda_matmul_peak(torch, name, clock, sampler) if device == "cuda"
                                         else _cpu_matmul_peak(torch, name, cases))
            except Exception as exc:  # noqa: BLE001 - a ceiling we cannot measure is reported, not fatal
                peaks["errors"][f"matmul_{name}"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        try:
            peaks["copy"] = _copy_peak(torch, device, copy_bytes, clock, budget, sampler)
        except Exception as exc:  # noqa: BLE001
            peaks["errors"]["copy"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    finally:
        torch.set_num_threads(before_threads)
        if device == "cuda":
            telemetry.close()
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
