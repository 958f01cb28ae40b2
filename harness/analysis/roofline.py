"""Where each record sits under the device's measured ceilings (peaks.json, harness.telemetry.peaks).

    peak FLOP/s   the fastest sample of an n×n·n×n product in the dtype (2·n³ FLOPs); for bf16/fp16 the fp32
                  product's where that ran faster (the work can always be widened: `ceiling_dtype`)
    peak bytes/s  the fastest sample of dst.copy_(src), bytes read plus written (2·nbytes)
    ridge point   peak FLOP/s ÷ peak bytes/s (FLOP/byte): a case with a higher arithmetic
                  intensity is compute-bound, below it memory-bound.

The analysis derives these columns from records + peaks; records are never rewritten.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.results.documents import PEAKS, Peaks, read_optional

#: A percentage of a measured peak above this is impossible (the peak, or the FLOP count, is wrong).
IMPOSSIBLE_PCT = 100.0


def read_peaks(run_dir: Path | str) -> dict[str, Any] | None:
    """The peaks stored with a run, or None when the run has none (older runs)."""
    peaks = read_optional(Path(run_dir) / PEAKS, Peaks)
    return None if peaks is None else peaks.to_dict()


#: The dtype a low-precision matmul can always be widened to: its work runs at least at that dtype's rate (torch's
#: CPU attention kernels widen bf16 to fp32). On a CPU without native bf16 the bf16 product itself runs ~100x below
#: fp32, and against it as the ceiling every widening kernel's bf16 row read as impossible.
WIDENS_TO = {"bf16": "fp32", "fp16": "fp32"}


def measured_tflops(peaks: dict[str, Any] | None, dtype: str | None) -> float | None:
    """The measured matmul peak of one dtype in TFLOP/s, or None when it was not measured."""
    entry = ((peaks or {}).get("matmul") or {}).get(dtype) if dtype else None
    return float(entry["tflops"]) if entry and entry.get("tflops") else None


def ceiling_dtype(peaks: dict[str, Any] | None, dtype: str) -> str | None:
    """The dtype whose measured peak is `dtype`'s ceiling: its own, or the one it widens to where that ran faster; None unmeasured."""
    own, wider = measured_tflops(peaks, dtype), measured_tflops(peaks, WIDENS_TO.get(dtype))
    if own is None:
        return None
    return WIDENS_TO[dtype] if wider is not None and wider > own else dtype


def peak_tflops(peaks: dict[str, Any] | None, dtype: str) -> float | None:
    """The matmul ceiling for a dtype in TFLOP/s (`ceiling_dtype`'s measured peak), or None when the dtype was not measured."""
    source = ceiling_dtype(peaks, dtype)
    return None if source is None else measured_tflops(peaks, source)


def peak_gbps(peaks: dict[str, Any] | None) -> float | None:
    """The measured copy ceiling in GB/s (read + written), or None."""
    entry = (peaks or {}).get("copy")
    return float(entry["gbps"]) if entry and entry.get("gbps") else None


def ridge_point(tflops: float | None, gbps: float | None) -> float | None:
    """FLOP per byte at which the compute ceiling meets the bandwidth ceiling."""
    if not tflops or not gbps:
        return None
    return tflops * 1e12 / (gbps * 1e9)


def roofline_row(tflops: float | None, gbps: float | None, intensity: float | None, peak_tf: float | None, peak_bw: float | None) -> dict[str, Any]:
    """The roofline columns of one measured row: % of each peak, the bound, % of the attainable roof, and whether it is impossible."""
    def pct(value: float | None, peak: float | None) -> float | None:
        if value is None or peak is None or not math.isfinite(value) or peak <= 0:
            return None
        return 100.0 * value / peak

    pct_flops, pct_bw = pct(tflops, peak_tf), pct(gbps, peak_bw)
    ridge = ridge_point(peak_tf, peak_bw)
    bound = None
    attainable = None
    if ridge is not None and intensity is not None and math.isfinite(intensity):
        bound = "compute" if intensity >= ridge else "memory"
        attainable = min(peak_tf, intensity * peak_bw / 1e3)
    impossible = any(p is not None and p > IMPOSSIBLE_PCT for p in (pct_flops, pct_bw))
    return {
        "peak_tflops": peak_tf, "peak_gbps": peak_bw, "ridge_flop_per_byte": ridge,
        "pct_peak_flops": pct_flops, "pct_peak_bw": pct_bw, "bound": bound,
        "attainable_tflops": attainable, "pct_roof": pct(tflops, attainable), "impossible": impossible,
    }
