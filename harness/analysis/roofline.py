"""Where each record sits under the device's measured ceilings (peaks.json, harness.telemetry.peaks).

    peak FLOP/s   the fastest sample of the run's matrix products in the dtype (GPU: one 8192² product; CPU: the best of
                  a sweep over the suite's own shapes); for bf16/fp16 the fp32 product's where that ran faster (the work
                  can always be widened: `ceiling_dtype`). A GPU row's share is also read at its own median SM clock
                  (peak × row clock ÷ the clock the peak ran at) and against the device's datasheet (analysis.datasheets).
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


def ceiling_entry(peaks: dict[str, Any] | None, dtype: str) -> dict[str, Any] | None:
    """The peaks.json entry that is `dtype`'s matmul ceiling (`ceiling_dtype`'s), or None."""
    source = ceiling_dtype(peaks, dtype)
    return ((peaks or {}).get("matmul") or {}).get(source) if source else None


def ceiling_name(peaks: dict[str, Any] | None, dtype: str, kind: str) -> str:
    """Which ceiling a row is read against, in words: 'the fp32 product 256×512·512×512ᵀ (0.194 TFLOP/s)' or 'the copy (… GB/s)'."""
    if kind == "copy":
        entry = (peaks or {}).get("copy") or {}
        return f"the copy of {entry.get('bytes', 0) / 2**20:.0f} MiB ({float(entry.get('gbps') or 0):.4g} GB/s)"
    entry, source = ceiling_entry(peaks, dtype) or {}, ceiling_dtype(peaks, dtype)
    product = entry.get("product") or (f"{entry['n']}² product" if entry.get("n") else "product")
    return f"the {source} {product} ({float(entry.get('tflops') or 0):.4g} TFLOP/s)"


def at_clock(peak: float | None, peak_clock: Any, row_clock: Any) -> float | None:
    """A ceiling scaled to the clock a row ran at: peak × row clock ÷ the ceiling's clock (None unless all three are known)."""
    try:
        peak_mhz, row_mhz = float(peak_clock), float(row_clock)
    except (TypeError, ValueError):
        return None
    if peak is None or not (math.isfinite(peak_mhz) and math.isfinite(row_mhz)) or peak_mhz <= 0 or row_mhz <= 0:
        return None
    return peak * row_mhz / peak_mhz


def roofline_row(tflops: float | None, gbps: float | None, intensity: float | None, peak_tf: float | None, peak_bw: float | None,
                 *, slowest: float | None = None, peaks: dict[str, Any] | None = None, dtype: str | None = None,
                 sm_clock_mhz: Any = None, mem_clock_mhz: Any = None, sheet: Any = None) -> dict[str, Any]:
    """The roofline columns of one measured row: % of each peak (measured, at the row's own clock, of the datasheet), the bound,
    % of the attainable roof, and whether it is impossible.

    `slowest` is the row's latency at the top of its 95 % interval over its median (≥ 1): a row is impossible only
    when even that slower figure is above the best ceiling the run measured; above a ceiling that was measured while
    the machine was contended it is `above_contended_ceiling` instead, since that ceiling bounds nothing.
    """
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
    matmul, copy = (ceiling_entry(peaks, dtype) if dtype else None) or {}, (peaks or {}).get("copy") or {}
    shrink = 1.0 / slowest if slowest and math.isfinite(slowest) and slowest >= 1.0 else 1.0
    beaten = [(kind, entry) for kind, value, peak, entry in (("matmul", tflops, peak_tf, matmul), ("copy", gbps, peak_bw, copy))
              if value is not None and peak and math.isfinite(value) and 100.0 * value * shrink / peak > IMPOSSIBLE_PCT]
    honest = [(kind, entry) for kind, entry in beaten if entry.get("contended") is not True]
    contended = [(kind, entry) for kind, entry in beaten if entry.get("contended") is True]
    flops_at_clock = at_clock(peak_tf, matmul.get("sm_clock_mhz"), sm_clock_mhz)
    bw_at_clock = at_clock(peak_bw, copy.get("mem_clock_mhz"), mem_clock_mhz)
    return {
        "peak_tflops": peak_tf, "peak_gbps": peak_bw, "ridge_flop_per_byte": ridge,
        "pct_peak_flops": pct_flops, "pct_peak_bw": pct_bw, "bound": bound,
        "attainable_tflops": attainable, "pct_roof": pct(tflops, attainable), "impossible": bool(honest),
        "impossible_ceiling": "; ".join(ceiling_name(peaks, dtype or "", kind) for kind, _ in honest) or None,
        "above_contended_ceiling": bool(contended) and not honest,
        "peak_tflops_at_clock": flops_at_clock, "pct_peak_flops_at_clock": pct(tflops, flops_at_clock),
        "pct_peak_bw_at_clock": pct(gbps, bw_at_clock),
        "datasheet_tflops": sheet.tflops_of(dtype) if sheet is not None else None,
        "pct_datasheet_flops": pct(tflops, sheet.tflops_of(dtype)) if sheet is not None else None,
        "pct_datasheet_bw": pct(gbps, sheet.gbps) if sheet is not None else None,
    }
