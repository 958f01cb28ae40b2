"""The report's GPU state and energy section: throttled rows and why to distrust them, energy against S, winners by energy and by time."""

from __future__ import annotations

import pandas as pd
import pytest

from harness import analysis
from harness.report import build_report
from harness.suite.cases import Case
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, write_run

NO_GPU = "no NVIDIA GPU: a CPU row has no GPU clocks, power or throttle reasons to read"  # what the executor writes (gpu_state.NO_GPU)
CUDA_ENV = {"before": {"device_type": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0+cu130"}}


def _gpu_row(S: int, backend: str, ms: float, mj: float | None, *, throttled: bool = False):
    case = Case(B=1, S_q=S, S_kv=S, H=32, H_kv=8, d_k=128, d_v=128, dtype="bf16", device="cuda")
    row = synthetic_record(case, backend, ms)
    row.gpu_state_readings, row.gpu_sustained_sm_clock_mhz, row.gpu_mem_clock_mhz_median = 7, 1980.0, 3201.0
    row.gpu_sm_clock_mhz_min = row.gpu_sm_clock_mhz_median = 1980.0
    row.gpu_temperature_c_max, row.gpu_power_w_mean, row.gpu_throttle_reasons, row.throttled = 52.0, 610.0, 0, throttled
    if throttled:
        row.gpu_sm_clock_mhz_min, row.gpu_throttle_reasons = 1635.0, 0x4
        row.throttle_reason = "NVML reported SW power cap (0x4); SM clock fell to 1635 MHz, below the sustained 1980 MHz"
    if mj is None:
        row.energy_reason = "the energy counter moved 2 times in 0.98 s (fewer than 5): too coarse a counter for a figure per call"
    else:
        row.energy_mj_per_call, row.energy_counter, row.energy_window_s, row.energy_calls = mj, "nvml-total-energy", 0.31, int(0.31e3 / ms)
        row.avg_power_w, row.gflop_per_joule = mj / ms, row.flops / (mj / 1e3) / 1e9
    return row


def _gpu_rows():
    # cuDNN is faster at both S; at 16384 flash costs less energy per call (a lower-power kernel running longer).
    return [_gpu_row(4096, "sdpa-cudnn", 0.41, 250.0), _gpu_row(4096, "sdpa-flash", 0.47, 290.0),
            _gpu_row(16384, "sdpa-cudnn", 5.9, 3900.0), _gpu_row(16384, "sdpa-flash", 6.3, 3700.0),
            _gpu_row(16384, "sdpa-efficient", 9.0, None, throttled=True)]


def _section(html: str) -> str:
    return html.split('<section id="state">')[1].split("</section>")[0]


def test_winners_by_energy_pick_the_most_frugal_agreeing_backend():
    frame = frame_of(_gpu_rows())
    by_energy = analysis.winners(frame, metric="energy_mj_per_call").set_index("S")
    assert by_energy.loc[4096, "winner"] == "sdpa-cudnn" and by_energy.loc[16384, "winner"] == "sdpa-flash"
    assert by_energy.loc[16384, "winner_energy_mj_per_call"] == 3700.0 and by_energy.loc[16384, "candidates"] == 2  # no figure: not ranked
    assert by_energy["within_noise"].isna().all()
    assert analysis.winners(frame).set_index("S").loc[16384, "winner"] == "sdpa-cudnn"  # by time, unchanged


@pytest.mark.slow
def test_the_section_lists_throttled_rows_to_distrust_and_energy_winners_beside_time_winners(tmp_path):
    page = build_report([write_run(tmp_path / "results" / "gpu", _gpu_rows(), peaks=PEAKS, env=CUDA_ENV)], out_root=tmp_path / "reports")
    html = page.read_text()
    section = _section(html)
    assert "Distrust this row of 5" in section and "SW power cap (0x4); SM clock fell to 1635 MHz" in section
    assert "1 of 5 measured rows ran on a throttled GPU" in html.split('<section id="choose">')[0]  # the overview says it too
    assert "Energy per call against S" in section and "nvml-total-energy" in section
    assert "too coarse a counter for a figure per call" in section  # the row without a figure says why
    winners = pd.read_csv(page.parent / "energy_winners.csv").set_index("case_id")
    assert winners[["winner_time", "winner_energy", "same"]].values.tolist() == [["sdpa-cudnn", "sdpa-cudnn", True], ["sdpa-cudnn", "sdpa-flash", False]]
    state = pd.read_csv(page.parent / "gpu_state.csv")
    assert len(state) == 5 and state["throttled"].sum() == 1


def test_a_cpu_run_says_in_one_sentence_why_it_has_no_gpu_telemetry_or_energy(tmp_path):
    row = synthetic_record(Case(B=1, S_q=128, S_kv=128, H=8, H_kv=8, d_k=64, d_v=64), "sdpa-math", 1.0)
    row.gpu_state_reason, row.energy_reason = NO_GPU, "no RAPL energy counters on this machine"
    page = build_report([write_run(tmp_path / "results" / "cpu", [row], peaks=PEAKS)], out_root=tmp_path / "reports")
    section = _section(page.read_text())
    assert f"No GPU telemetry in this run: {NO_GPU}." in section
    assert "No energy per call in this run: no RAPL energy counters on this machine." in section
    assert 'class="bad' not in section and not (page.parent / "energy.csv").exists()
