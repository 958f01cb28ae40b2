"""Ceilings that bound: the CPU's is the best of a sweep of the suite's own products, "impossible" means above the best
ceiling even at the top of a row's interval, and a GPU row's share is also read at its own clock and against the datasheet.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from harness.analysis import roofline
from harness.analysis.datasheets import DATASHEETS, datasheet_of
from harness.results.documents import Peaks
from harness.errors import UserError
from harness.suite.cases import Case
from harness.telemetry import peaks as device_peaks
from harness.telemetry import products
from tests.h200_data import H200, h200_records, needs_h200

#: A CPU run's peaks as the sweep leaves them: the one-size product the old rule took (2048², 0.187 TFLOP/s, the issue's
#: figure) and the sweep's best, a projection-shaped product that fits the caches (0.21).
SWEPT = {"matmul": {"fp32": {"product": "256×512·512×512ᵀ", "source": "projection", "tflops": 0.21, "contended": False,
                              "sweep": [{"product": "2048×2048·2048×2048", "source": "square", "tflops": 0.187},
                                        {"product": "256×512·512×512ᵀ", "source": "projection", "tflops": 0.21}]}},
         "copy": {"bytes": 2**26, "gbps": 20.0, "contended": False}}
ONE_SIZE_PEAK = 0.187


def row_at(tflops: float, peaks=SWEPT, slowest: float | None = 1.0):
    """The roofline columns of an fp32 row at `tflops` (compute-bound intensity) against `peaks`."""
    return roofline.roofline_row(tflops, 1.0, 1e4, roofline.peak_tflops(peaks, "fp32"), roofline.peak_gbps(peaks),
                                 slowest=slowest, peaks=peaks, dtype="fp32")


def test_a_row_above_the_one_size_peak_but_under_the_sweeps_best_is_not_impossible():
    healthy = row_at(ONE_SIZE_PEAK * 1.02)  # what every projections row looked like against the one-size peak
    assert not healthy["impossible"] and healthy["impossible_ceiling"] is None and healthy["pct_peak_flops"] == pytest.approx(100 * 0.19074 / 0.21, rel=1e-3)
    above = row_at(0.21 * 1.05)
    assert above["impossible"] and above["impossible_ceiling"] == "the fp32 256×512·512×512ᵀ (0.21 TFLOP/s)"


def test_impossible_is_judged_at_the_top_of_the_rows_interval():
    # 3 % above the ceiling at its median, but its 95 % interval reaches 5 % slower: it may be at the ceiling.
    assert not row_at(0.21 * 1.03, slowest=1.05)["impossible"]
    assert row_at(0.21 * 1.03, slowest=1.01)["impossible"]


def test_a_row_above_a_ceiling_measured_under_contention_says_so_instead_of_impossible():
    busy = json.loads(json.dumps(SWEPT))
    busy["matmul"]["fp32"]["contended"] = True
    row = row_at(0.3, peaks=busy)
    assert not row["impossible"] and row["above_contended_ceiling"]


def test_the_cpu_ceiling_is_the_best_of_the_sweep_and_the_sweep_holds_the_suites_products():
    case = Case(B=1, S_q=64, S_kv=64, H=4, H_kv=2, d_k=16, d_v=16)
    shapes = {(p.source, p.label) for p in products.case_products([case])}
    assert shapes == {("projection", "64×64·64×64ᵀ"), ("projection", "64×64·64×32ᵀ"), ("scores", "(4) 64×16·16×64ᵀ"),
                      ("weighted sum", "(4) 64×64·64×16")}
    rows = products.sweep(torch, "fp32", products.case_products([case]), bound_s=30.0)
    assert all(r.get("tflops", 0) > 0 and r["samples"] >= 3 for r in rows)
    assert products.best_of(rows)["tflops"] == max(r["tflops"] for r in rows)
    # A spent bound is said per product, never a silent gap.
    assert {r.get("skipped") for r in products.sweep(torch, "fp32", products.square_products(), bound_s=0.0)} == {"the sweep's 0 s bound was spent"}


def test_a_product_too_dear_for_one_call_is_skipped_with_its_cost(monkeypatch):
    monkeypatch.setattr(products, "MAX_CALL_S", 0.0)
    (row,) = products.sweep(torch, "fp32", [products.Product(64, 64, 64)], bound_s=30.0)
    assert row["skipped"].startswith("one call takes") and "tflops" not in row


def test_spread_keeps_the_smallest_and_the_largest():
    items = [products.Product(n, n, n) for n in range(1, 31)]
    kept = products.spread(items, 5)
    assert len(kept) == 5 and kept[0] is items[0] and kept[-1] is items[-1]


def test_gpu_ceilings_record_the_clocks_they_ran_at():
    class Summary:
        sm_clock_mhz_median, mem_clock_mhz_median = 1980.0, 3201.0

    class Sampler:
        summary = Summary()

        def around(self, loop):
            return loop

    timed = device_peaks._timed(lambda: sum(range(100)), time.perf_counter, device_peaks.CPU_BUDGET, Sampler())
    assert (timed["sm_clock_mhz"], timed["mem_clock_mhz"]) == (1980.0, 3201.0) and timed["best_s"] > 0
    assert "sm_clock_mhz" not in device_peaks._timed(lambda: None, time.perf_counter, device_peaks.CPU_BUDGET)


def test_peaks_documents_carry_the_ceilings_state_and_refuse_a_wrong_one():
    doc = Peaks.from_dict({**SWEPT, "device": "cpu"}, where="peaks.json")
    assert doc.matmul["fp32"]["product"] == "256×512·512×512ᵀ"
    with pytest.raises(UserError, match="contended"):
        Peaks.from_dict({"device": "cpu", "matmul": {"fp32": {"tflops": 1.0, "contended": "yes"}}}, where="peaks.json")


@needs_h200
def test_an_h200_rows_share_at_its_own_clock_is_computed_from_the_recorded_clocks():
    peaks = json.loads((H200 / "peaks.json").read_text())
    env = json.loads((H200 / "env.json").read_text())
    hot, idle = env["telemetry_after"][0]["sm_clock_mhz"], env["telemetry_before"][0]["sm_clock_mhz"]  # 1980 and 345 MHz
    peaks["matmul"]["bf16"]["sm_clock_mhz"] = hot  # the clock the peak product ran at, as a run now records it
    row = next(r for r in h200_records() if r["status"] == "ok" and r["backend"] == "sdpa-cudnn" and r["S_q"] == 4096)
    ceiling = roofline.peak_tflops(peaks, "bf16")
    assert ceiling == pytest.approx(801.41198846378)
    sheet = datasheet_of(peaks["device_name"])
    for clock in (hot, idle, 1500.0):
        columns = roofline.roofline_row(row["tflops"], row["gbps"], row["arithmetic_intensity"], ceiling, roofline.peak_gbps(peaks),
                                        peaks=peaks, dtype="bf16", sm_clock_mhz=clock, sheet=sheet)
        assert columns["peak_tflops_at_clock"] == pytest.approx(ceiling * clock / hot)
        assert columns["pct_peak_flops_at_clock"] == pytest.approx(100 * row["tflops"] / (ceiling * clock / hot))
        assert columns["pct_datasheet_flops"] == pytest.approx(100 * row["tflops"] / 989.4)
    assert columns["pct_peak_flops"] == pytest.approx(100 * row["tflops"] / ceiling)
    # The measured ceilings sit under the datasheet's: 801 of 989 TFLOP/s, a 4.25 of 4.8 TB/s copy.
    assert ceiling < DATASHEETS["NVIDIA H200"].tflops["bf16"] and roofline.peak_gbps(peaks) < DATASHEETS["NVIDIA H200"].gbps
    unknown = roofline.roofline_row(row["tflops"], None, None, ceiling, None, peaks={"matmul": {"bf16": {"tflops": ceiling}}}, dtype="bf16",
                                    sm_clock_mhz=1500.0)
    assert unknown["pct_peak_flops_at_clock"] is None  # without the peak's own clock there is nothing to scale by


def test_datasheets_match_only_their_own_board():
    assert datasheet_of("NVIDIA H200") is DATASHEETS["NVIDIA H200"] and datasheet_of("NVIDIA H200 NVL") is None
    assert datasheet_of(None) is None and datasheet_of("Intel Xeon") is None


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_the_fp8_ceiling_is_measured_with_scaled_mm_on_operands_cudas_checks_accept(fmt, monkeypatch):
    """torch.matmul has no float8 kernel on CUDA: the GPU's FP8 peak is `_scaled_mm`, as eager-fp8 and FA3's FP8 GEMMs run it,
    never two e5m2 operands (CUDA's Blas.cpp refuses them), its K and N accepted by torch's own meta checks (the CUDA rules)."""
    calls, real = [], torch._scaled_mm

    def recording(a, b, **kwargs):
        calls.append((a.shape, a.stride(), a.dtype, b.shape, b.stride(), b.dtype))
        return real(a, b, **kwargs)

    def no_matmul(*args, **kwargs):
        raise AssertionError("an FP8 ceiling through torch.matmul, which CUDA lacks")

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    monkeypatch.setattr(torch, "matmul", no_matmul)
    monkeypatch.setattr(device_peaks, "CUDA_MATMUL_N", 64)
    monkeypatch.setattr(device_peaks, "CUDA_BUDGET", device_peaks.CPU_BUDGET)
    entry = device_peaks._cuda_matmul_peak(torch, fmt, time.perf_counter, None, device="cpu")  # the CUDA path's calls, on the CPU
    assert entry["tflops"] > 0 and entry["op"].startswith("torch._scaled_mm") and calls
    monkeypatch.undo()
    one = torch.ones((), device="meta")
    for a_shape, a_stride, a_dtype, b_shape, b_stride, b_dtype in calls:
        assert (a_dtype, b_dtype) != (torch.float8_e5m2, torch.float8_e5m2)
        torch._scaled_mm(torch.empty_strided(a_shape, a_stride, dtype=a_dtype, device="meta"),
                         torch.empty_strided(b_shape, b_stride, dtype=b_dtype, device="meta"), scale_a=one, scale_b=one, out_dtype=torch.float32)
    # The CPU's sweep gives FP8 a ceiling too, through the same call.
    rows = products.sweep(torch, fmt, products.square_products()[:1])
    assert rows[0]["op"] == "_scaled_mm" and rows[0]["tflops"] > 0


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_row_reads_the_datasheets_fp8_figure(fmt):
    sheet = datasheet_of("NVIDIA H200")
    columns = roofline.roofline_row(989.4, None, None, 1500.0, None, peaks={"matmul": {fmt: {"tflops": 1500.0}}}, dtype=fmt, sheet=sheet)
    assert columns["datasheet_tflops"] == sheet.tflops["fp8"] == 1978.9
    assert columns["pct_datasheet_flops"] == pytest.approx(50.0, abs=0.01)
