"""Analysis on synthetic rows with known answers: crossover, power-law fits, roofline arithmetic, winners, recommend, compare."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness import analysis

from harness.analysis import roofline
from harness.backends.pytorch.projections import ProjectionsBackend, projection_flops
from harness.suite.cases import Case
from harness.cli.main import main
from harness.analysis.compare import compare_frames, parse_threshold
from harness.errors import UserError
from harness.run.rundir import write_peaks
from harness.attention import theory
from harness.execution.execute import PairRunner, execute
from harness.results.record import Record, Status
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, winner_records, write_run


# -- crossover -------------------------------------------------------------------------------------
def test_crossing_of_two_power_laws_is_exact():
    # t_proj = S/700, t_core = S²/700² → they meet at S = 700; log-log interpolation is exact for power laws.
    S = [64, 128, 256, 512, 1024, 2048]
    crossing = analysis.find_crossing(S, [s * s / 700**2 for s in S], [s / 700 for s in S])
    assert crossing.s_star == pytest.approx(700, rel=1e-9)
    assert crossing.bound is None and crossing.crossings == 1
    assert crossing.text() == "700" and crossing.over(512) == "1.37"


def test_never_crossing_gives_a_bound_not_a_number():
    S = [64, 128, 256, 512]
    below = analysis.find_crossing(S, [0.1 * s for s in S], [s for s in S])
    assert below.s_star is None and below.bound == ">" and below.limit == 512
    assert below.text() == "> 512" and below.over(256) == "> 2.00"
    above = analysis.find_crossing(S, [10.0 * s for s in S], [s for s in S])
    assert above.s_star is None and above.bound == "<" and above.limit == 64 and above.text() == "< 64"


def test_noisy_crossing_reports_the_last_upward_one_and_says_so():
    S = [100, 200, 400, 800]
    ratio = [0.5, 2.0, 0.5, 2.0]  # up, down, up
    crossing = analysis.find_crossing(S, ratio, [1.0] * 4)
    assert crossing.crossings == 3
    assert crossing.s_star == pytest.approx(math.sqrt(400 * 800))  # log r symmetric about 0 → geometric mean
    assert "3 times" in crossing.note


def test_crossovers_per_backend_and_D_beside_the_model():
    records = []
    for H, s_cross_fast in ((4, 300.0), (8, 5000.0)):  # D = 256 crosses inside, D = 512 does not
        for S in (64, 128, 256, 512, 1024):
            case = Case(B=1, S_q=S, S_kv=S, H=H, H_kv=H, d_k=64, d_v=64)
            records.append(synthetic_record(case, "projections", S / 100, agree=None))
            records.append(synthetic_record(case, "fast", S * S / (100 * s_cross_fast)))
            records.append(synthetic_record(case, "wrong", S * S / 1e9, agree=False))  # disagrees: never used
    table = analysis.crossovers(frame_of(records)).set_index(["backend", "D"])
    assert set(table.index) == {("fast", 256), ("fast", 512)}
    assert table.loc[("fast", 256), "S_star"] == pytest.approx(300.0)
    assert table.loc[("fast", 256), "model_S_star"] == 512 and table.loc[("fast", 256), "rule_of_thumb_S"] == 256
    assert table.loc[("fast", 256), "S_star_over_D"] == f"{300 / 256:.2f}"
    assert math.isnan(table.loc[("fast", 512), "S_star"]) and table.loc[("fast", 512), "S_star_text"] == "> 1,024"


# -- scaling fits ----------------------------------------------------------------------------------
def test_power_law_fit_recovers_exponent_and_r2():
    S = [128, 256, 512, 1024]
    fit = analysis.fit_power_law(S, [3e-6 * s**2 for s in S])
    assert fit.exponent == pytest.approx(2.0) and fit.r2 == pytest.approx(1.0) and fit.prefactor == pytest.approx(3e-6)
    noisy = analysis.fit_power_law(S, [s * f for s, f in zip(S, (1.0, 1.3, 0.8, 1.1))])
    assert 0 < noisy.r2 < 1 and noisy.exponent == pytest.approx(1.0, abs=0.2)


def test_power_law_fit_refuses_fewer_than_three_points():
    fit = analysis.fit_power_law([128, 256], [1.0, 4.0])
    assert fit.exponent is None and fit.r2 is None and "≥ 3" in fit.note
    zeros = analysis.fit_power_law([128, 256, 512], [0.0, 4.0, 16.0])  # a zero memory reading is not a point
    assert zeros.exponent is None and "has 2" in zeros.note


def test_scaling_fits_show_quadratic_and_linear_memory():
    records = []
    for S in (128, 256, 512, 1024):
        case = Case(B=2, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64)
        records.append(synthetic_record(case, "naive", 1e-5 * S**2, mem=2 * 2 * 8 * S * S * 4))
        records.append(synthetic_record(case, "fused", 1e-5 * S**2, mem=2 * 8 * S * 64 * 4))
    fits = analysis.scaling_fits(frame_of(records)).set_index("backend")
    assert fits.loc["naive", "alpha_memory"] == pytest.approx(2.0)
    assert fits.loc["fused", "alpha_memory"] == pytest.approx(1.0)
    assert fits.loc["naive", "beta_latency"] == pytest.approx(2.0) and fits.loc["naive", "r2_latency"] == pytest.approx(1.0)
    memory = analysis.memory_vs_model(frame_of(records)).set_index(["backend", "S"])
    assert memory.loc[("naive", 256), "ratio"] == pytest.approx(1.0)  # exactly 2·B·H·S² fp32 elements
    assert memory.loc[("fused", 256), "model_bytes"] == 2 * 8 * 256 * 64 * 4
    zero = analysis.memory_vs_model(frame_of([synthetic_record(Case(B=1, S_q=64, S_kv=64, H=1, H_kv=1, d_k=8, d_v=8), "naive", 1.0, mem=0)]))
    assert zero["ratio"].isna().all()  # a zero reading is below the meter's resolution, not a ratio of 0


# -- roofline --------------------------------------------------------------------------------------
def test_roofline_arithmetic():
    # ridge = 100 TFLOP/s / 2000 GB/s = 50 FLOP/byte
    compute = roofline.roofline_row(50.0, 500.0, 100.0, 100.0, 2000.0)
    assert compute["ridge_flop_per_byte"] == pytest.approx(50.0)
    assert compute["pct_peak_flops"] == pytest.approx(50.0) and compute["pct_peak_bw"] == pytest.approx(25.0)
    assert compute["bound"] == "compute" and compute["attainable_tflops"] == pytest.approx(100.0) and not compute["impossible"]
    memory = roofline.roofline_row(10.0, 1000.0, 10.0, 100.0, 2000.0)
    assert memory["bound"] == "memory" and memory["attainable_tflops"] == pytest.approx(20.0) and memory["pct_roof"] == pytest.approx(50.0)
    impossible = roofline.roofline_row(120.0, 100.0, 100.0, 100.0, 2000.0)
    assert impossible["impossible"] and impossible["pct_peak_flops"] == pytest.approx(120.0)
    unknown = roofline.roofline_row(1.0, 1.0, 1.0, None, None)
    assert unknown["pct_peak_flops"] is None and unknown["bound"] is None and not unknown["impossible"]


def test_roofline_columns_come_from_the_rows_run_peaks():
    case = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
    ms = theory.flops(case) / 0.5e12 * 1e3  # 0.5 TFLOP/s against a 1 TFLOP/s peak
    frame = frame_of([synthetic_record(case, "a", ms)])
    row = frame.iloc[0]
    assert row["pct_peak_flops"] == pytest.approx(50.0)
    assert row["ridge_flop_per_byte"] == pytest.approx(1e12 / 100e9)
    assert row["bound"] == ("compute" if row["arithmetic_intensity"] >= 10 else "memory")


@pytest.mark.slow
def test_measured_peaks_are_positive_and_stored(tmp_path):
    path = write_peaks(tmp_path, "cpu", ["fp32"])
    peaks = json.loads(path.read_text())
    assert peaks["matmul"]["fp32"]["tflops"] > 0 and peaks["copy"]["gbps"] > 0
    matmul = peaks["matmul"]["fp32"]
    best = max((r for r in matmul["sweep"] if r.get("tflops")), key=lambda r: r["tflops"])  # the ceiling is the sweep's best
    assert (matmul["product"], matmul["flops"], matmul["tflops"]) == (best["product"], best["flops"], best["tflops"])
    assert peaks["copy"]["bytes_moved"] == 2 * peaks["copy"]["bytes"]


def test_a_low_precision_ceiling_is_never_below_the_fp32_product_it_can_be_widened_to():
    # The AVX2 machine's peaks.json: its bf16 product runs ~100x below fp32, while torch's CPU attention kernels widen
    # bf16 to fp32 and reach ~0.13 TFLOP/s: against bf16's own product every such row read as 9,000 % of peak.
    avx2 = {"matmul": {"bf16": {"tflops": 0.0014}, "fp32": {"tflops": 0.142}}}
    assert roofline.peak_tflops(avx2, "bf16") == 0.142 and roofline.ceiling_dtype(avx2, "bf16") == "fp32"
    assert roofline.peak_tflops(avx2, "fp32") == 0.142 and roofline.ceiling_dtype(avx2, "fp32") == "fp32"
    h200 = {"matmul": {"bf16": {"tflops": 700.0}, "fp32": {"tflops": 50.0}}}
    assert roofline.peak_tflops(h200, "bf16") == 700.0 and roofline.ceiling_dtype(h200, "bf16") == "bf16"
    only_fp32 = {"matmul": {"fp32": {"tflops": 50.0}}}
    assert roofline.peak_tflops(only_fp32, "bf16") is None  # an unmeasured dtype has no ceiling: fp32's would understate a GPU's
    row = roofline.roofline_row(0.13, 1.0, 100.0, roofline.peak_tflops(avx2, "bf16"), 20.0)
    assert not row["impossible"] and 90 < row["pct_peak_flops"] < 92


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks how a failed CUDA measurement is recorded")
def test_a_failed_cuda_peak_measurement_is_recorded_not_fatal(tmp_path):
    # On this CPU-only machine the CUDA child process fails; the run keeps a peaks.json that says why.
    peaks = json.loads(write_peaks(tmp_path, "cuda", ["bf16"]).read_text())
    assert peaks["matmul"] == {} and peaks["copy"] is None and "peak measurement failed" in peaks["errors"]["measure"]
    assert roofline.peak_tflops(peaks, "bf16") is None and roofline.peak_gbps(peaks) is None


# -- winners, recommend ----------------------------------------------------------------------------
#: What the synthetic whole-layer backend declares: it times another problem than the attention core.
WINNER_CAPABILITIES = {"whole-layer": {"attention_core": False}}


def test_winner_is_the_fastest_agreeing_row_with_margin_and_speedup():
    wins = analysis.winners(frame_of(winner_records(), capabilities=WINNER_CAPABILITIES), baseline="sdpa-math")
    assert list(wins["winner"]) == ["sdpa-flash", "sdpa-flash"]
    assert list(wins["runner_up"]) == ["sdpa", "sdpa"]
    assert wins["margin_pct"].iloc[0] == pytest.approx(25.0)
    assert wins["speedup_vs_baseline"].iloc[0] == pytest.approx(4.0) and not wins["within_noise"].any()
    speed = analysis.speedups(frame_of(winner_records(), capabilities=WINNER_CAPABILITIES), "sdpa-math")
    assert "cheat" not in speed.columns and "whole-layer" not in speed.columns and speed["sdpa"].iloc[0] == pytest.approx(3.2)
    cells = analysis.winner_map(frame_of(winner_records(), capabilities=WINNER_CAPABILITIES), "H_kv", "bf16")
    assert list(cells["winner"]) == ["sdpa-flash", "sdpa-flash"] and list(cells["won"]) == [1, 1]


def test_recommend_answers_from_rows_and_refuses_unmeasured_shapes(tmp_path, capsys):
    run = write_run(tmp_path / "run", winner_records(), capabilities=WINNER_CAPABILITIES)
    assert main(["recommend", str(run), "--model", "llama3-8b", "--seq", "256"]) == 0
    out = capsys.readouterr().out
    assert "sdpa-flash" in out and "the runner-up sdpa takes 1.25× the time" in out and "within noise" not in out
    assert "cheat" in out and "DISAGREES (excluded)" in out
    assert main(["recommend", str(run), "--model", "llama3-8b", "--seq", "4096"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "S was measured at 128, 256 only" in err
    assert main(["recommend", str(run), "--H", "16"]) == 2
    assert main(["recommend", str(run), "--model", "no-such-model"]) == 2


def test_model_presets():
    assert analysis.model_shape("llama3-8b") == {"H": 32, "H_kv": 8, "d_k": 128, "window": None}
    with pytest.raises(UserError, match="known models"):
        analysis.model_shape("gpt-17")


# -- the projections backend -----------------------------------------------------------------------
def test_projection_flops_match_the_layer_model():
    B, S, H, d = 2, 128, 8, 64
    case = Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H, d_k=d, d_v=d)
    assert projection_flops(case) == 8 * B * S * (H * d) ** 2  # an MHA layer's Q, K, V and O projections: 8·B·S·D²
    gqa = Case(B=B, S_q=S, S_kv=S, H=H, H_kv=2, d_k=d, d_v=d)
    D = H * d
    assert projection_flops(gqa) == 2 * B * S * (D * D + 2 * D * 2 * d + D * D)


def test_projections_rows_are_timed_but_not_checked():
    case = Case(B=1, S_q=64, S_kv=64, H=2, H_kv=1, d_k=16, d_v=16)
    from harness.measure.timing import Budget

    record = execute(case, ProjectionsBackend(), PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.005, min_rounds=3)))
    assert record.status is Status.OK and record.agree is None
    assert "does not compute attention" in record.reason
    assert record.flops == projection_flops(case) and record.latency_ms_median > 0
    assert execute(case.replace(mode="bwd"), ProjectionsBackend()).status is Status.UNSUPPORTED


# -- compare ---------------------------------------------------------------------------------------
def _two_runs(tmp_path: Path, slowdown: float, spread: float = 0.01) -> tuple[Path, Path]:
    base, new = [], []
    for S in (128, 256):
        case = Case(B=1, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64)
        base.append(synthetic_record(case, "sdpa", 1.0, spread=spread, run_id="base"))
        new.append(synthetic_record(case, "sdpa", 1.0 * (slowdown if S == 256 else 1.0), spread=spread, run_id="new"))
    return write_run(tmp_path / "base", base), write_run(tmp_path / "new", new)


def test_compare_gates_on_a_planted_slowdown(tmp_path, capsys):
    base, new = _two_runs(tmp_path, 1.10)
    out_csv = tmp_path / "cmp.csv"
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(out_csv)]) == 1
    assert "FAIL" in capsys.readouterr().out
    table = pd.read_csv(out_csv)
    slow = table[table["case_id"].str.contains("Sq256")].iloc[0]
    assert slow["ratio"] == pytest.approx(1.10) and slow["verdict"] == "slower" and bool(slow["beyond_noise"])
    assert main(["compare", str(base), str(new), "--fail-above", "20%", "--out", str(out_csv)]) == 0
    assert main(["compare", str(base), str(base), "--fail-above", "5%", "--out", str(out_csv)]) == 0


def test_compare_ignores_a_slowdown_within_noise_and_flags_lost_rows(tmp_path):
    base, new = _two_runs(tmp_path, 1.10, spread=0.2)  # p20–p80 ranges overlap: noise
    from harness.analysis.compare import compare_runs

    result = compare_runs(base, new, 0.05)
    assert not result.failed and set(result.table["verdict"]) == {"within noise"}
    case = Case(B=1, S_q=128, S_kv=128, H=8, H_kv=8, d_k=64, d_v=64)
    b = pd.DataFrame([synthetic_record(case, "x", 1.0)])
    n = pd.DataFrame([synthetic_record(case, "x", 1.0, status="oom")])
    table, failures = compare_frames(b, n, 0.05)
    assert len(failures) == 1 and failures.iloc[0]["verdict"] == "status ok → oom"


def test_compare_counts_pairs_unchanged_in_status_without_listing_them(tmp_path, capsys):
    """A GPU-only backend unsupported in both CPU runs is no change: one count, not a line per pair."""
    cases = [Case(B=1, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64) for S in (128, 256)]
    base = write_run(tmp_path / "base", [synthetic_record(c, "x", 1.0) for c in cases] + [synthetic_record(c, "gpu-only", 1.0, status="unsupported") for c in cases])
    new = write_run(tmp_path / "new", [synthetic_record(c, "x", 1.0) for c in cases] + [synthetic_record(c, "gpu-only", 1.0, status="unsupported") for c in cases])
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "cmp.csv")]) == 0
    out = capsys.readouterr().out
    assert "gpu-only" not in out and "2 unsupported in both" in out and "2 within noise" in out
    table = pd.read_csv(tmp_path / "cmp.csv")
    assert set(table.loc[table["backend"] == "gpu-only", "verdict"]) == {"unsupported in both"}  # the CSV keeps every pair


def test_compare_refuses_different_devices_and_warns_on_versions(tmp_path, capsys):
    base, new = _two_runs(tmp_path, 1.0)
    (new / "env.json").write_text(json.dumps({"before": {"device_type": "cpu", "device_name": "other CPU", "torch": "2.x"}}))
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv")]) == 2
    assert "different devices" in capsys.readouterr().err
    (new / "env.json").write_text(json.dumps({"before": {"device_type": "cpu", "device_name": "synthetic CPU", "torch": "3.y"}}))
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv")]) == 0
    assert "warning: environments differ: torch: 2.x → 3.y" in capsys.readouterr().out


def test_threshold_parsing():
    assert parse_threshold("5%") == pytest.approx(0.05) and parse_threshold("12.5") == pytest.approx(0.125)
    with pytest.raises(UserError):
        parse_threshold("fast")


def test_loading_two_runs_keeps_the_later_row_of_a_pair_and_says_so(tmp_path):
    case = Case(B=1, S_q=128, S_kv=128, H=8, H_kv=8, d_k=64, d_v=64)
    first = write_run(tmp_path / "first", [synthetic_record(case, "sdpa", 2.0, run_id="first")], peaks=PEAKS)
    second = write_run(tmp_path / "second", [synthetic_record(case, "sdpa", 1.0, run_id="second"),
                                             synthetic_record(case, "naive", 3.0, run_id="second")], peaks=PEAKS)
    data = analysis.load([first, second])
    assert len(data.frame) == 2 and set(data.peaks) == {"first", "second"}
    assert data.frame.loc[data.frame["backend"] == "sdpa", "latency_ms_median"].item() == 1.0
    assert "1 (case, backend) pairs were measured by more than one run" in data.notes[0]


def test_rows_of_different_device_models_are_never_ranked_together(tmp_path):
    case = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
    h100 = [synthetic_record(case, "sdpa", 2.0, run_id="h100"), synthetic_record(case, "sdpa-math", 4.0, run_id="h100")]
    h200 = [synthetic_record(case, "sdpa", 1.0, run_id="h200"), synthetic_record(case, "sdpa-math", 3.0, run_id="h200")]
    a = write_run(tmp_path / "h100", h100, env={"before": {"device_type": "cuda", "device_name": "NVIDIA H100"}})
    b = write_run(tmp_path / "h200", h200, env={"before": {"device_type": "cuda", "device_name": "NVIDIA H200"}})
    data = analysis.load([a, b])
    assert not data.notes  # not "measured by more than one run": different devices, different questions
    # Grouped by the device model, not by a rewritten id: every row keeps the case_id it was recorded with.
    assert set(data.frame["case_id"]) == {case.id} and "record_case_id" not in data.frame.columns
    wins = analysis.winners(data.frame).set_index("device_model")
    assert set(wins["case_id"]) == {case.id} and set(wins.index) == {"NVIDIA H100", "NVIDIA H200"}
    assert wins.loc["NVIDIA H100", "winner_ms"] == 2.0 and wins.loc["NVIDIA H200", "winner_ms"] == 1.0
    assert set(wins["case"]) == {f"{case.id} @ NVIDIA H100", f"{case.id} @ NVIDIA H200"}  # what a table shows
    assert set(analysis.speedups(data.frame, "sdpa-math").index) == set(wins["case"])
    answers = analysis.recommend(data.frame, {"S": 256}).cases
    assert sorted((a.case_id, a.winner_ms) for a in answers) == [(f"{case.id} @ NVIDIA H100", 2.0), (f"{case.id} @ NVIDIA H200", 1.0)]
    # A Ray row names its own node's device, whatever its run's driver was.
    ray_row = synthetic_record(case, "sdpa", 1.5, run_id="ray")
    ray_row.device_name, ray_row.node = "NVIDIA A100", "10.0.0.7"
    mixed = write_run(tmp_path / "ray", [ray_row, *h100[:1]], env={"before": {"device_type": "cuda", "device_name": "driver CPU"}})
    assert set(analysis.load([mixed]).frame["device_model"]) == {"NVIDIA A100", "driver CPU"}


# -- one rule for "different": the recorded 95 % interval of the median, widened by the run-to-run variation -------------
CASE_256 = Case(B=1, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)


def timed(backend: str, ms: float, *, interval: float, spread: float = 0.10, case: Case = CASE_256, run_id: str = "synthetic") -> Record:
    """A row whose p20–p80 range is ±`spread` (wide, as a noisy CPU's) and whose 95 % interval of the median is ±`interval`."""
    record = synthetic_record(case, backend, ms, spread=spread, run_id=run_id)
    record.latency_ms_ci95_low, record.latency_ms_ci95_high = ms * (1 - interval), ms * (1 + interval)
    return record


def test_the_rule_tells_rows_apart_by_their_intervals_widened_by_the_variation():
    from harness.analysis.difference import differ, order

    fast, slow = timed("a", 1.00, interval=0.01).to_dict(), timed("b", 1.05, interval=0.01).to_dict()
    # p20–p80 overlap (0.9–1.1 against 0.945–1.155), intervals do not (0.99–1.01 against 1.0395–1.0605): they differ
    assert differ(fast, slow) and order(fast, slow) == -1 and order(slow, fast) == 1
    # a run-to-run CV of 2 % widens each by ±4 %: 1.01·1.04 = 1.0504 > 1.0395·0.96 = 0.998, so they no longer differ
    assert not differ(fast, slow, cv=0.02) and order(fast, slow, cv=0.02) == 0
    # intervals that overlap never differ, whatever the medians
    assert not differ(timed("a", 1.00, interval=0.03).to_dict(), timed("b", 1.05, interval=0.03).to_dict())
    # a row too short for an interval (under 6 samples) is never called different
    bare = timed("c", 2.0, interval=0.01).to_dict() | {"latency_ms_ci95_low": None, "latency_ms_ci95_high": None}
    assert not differ(fast, bare)


def test_winners_and_recommend_judge_noise_by_the_rule(tmp_path, capsys):
    records = [timed("sdpa", 1.00, interval=0.01), timed("naive", 1.05, interval=0.01)]
    wins = analysis.winners(frame_of(records))
    assert wins["winner"].iloc[0] == "sdpa" and not wins["within_noise"].iloc[0]  # p20–p80 overlap; the intervals do not
    assert analysis.winners(frame_of(records), cv=0.02)["within_noise"].iloc[0]
    (answer,) = analysis.recommend(frame_of(records), {"S": 256}).cases
    assert answer.winner == "sdpa" and not answer.within_noise
    (answer,) = analysis.recommend(frame_of(records), {"S": 256}, cv=0.02).cases
    assert answer.within_noise and "within noise (their 95 % intervals overlap)" in answer.lines()[0]
    assert "95 % interval 0.99–1.01" in "\n".join(answer.lines())


def _compared(tmp_path: Path, pairs: list[tuple[float, float]], interval: float = 0.01) -> tuple[Path, Path]:
    """BASE and NEW runs of backend `sdpa`, one case per (base ms, new ms) pair, S = 128, 256, …"""
    base, new = [], []
    for i, (b, n) in enumerate(pairs):
        case = Case(B=1, S_q=128 << i, S_kv=128 << i, H=8, H_kv=8, d_k=64, d_v=64)
        base.append(timed("sdpa", b, interval=interval, case=case, run_id="base"))
        new.append(timed("sdpa", n, interval=interval, case=case, run_id="new"))
    return write_run(tmp_path / "base", base), write_run(tmp_path / "new", new)


def test_compare_judges_by_the_intervals_not_the_p20_p80_ranges(tmp_path):
    from harness.analysis.compare import compare_runs

    base, new = _compared(tmp_path, [(1.0, 1.06)])  # p20–p80 overlap, intervals ±1 % do not
    result = compare_runs(base, new, 0.05)
    assert list(result.table["verdict"]) == ["slower"] and result.failed


def test_compare_widens_by_the_variation_stability_wrote(tmp_path, capsys, monkeypatch):
    from harness.checks.stability import StabilityResult

    base, new = _compared(tmp_path, [(1.0, 1.06)])
    measured = StabilityResult(CASE_256.replace(device="cpu"), "sdpa", (1.0e-3, 1.03e-3, 0.97e-3, 1.02e-3, 0.98e-3))  # CV 2.5 %
    monkeypatch.setattr("harness.checks.stability.run_stability", lambda *a, **k: measured)
    monkeypatch.setattr("harness.env.fingerprint", lambda device: {"device_type": device, "device_name": "synthetic CPU"})
    variation = tmp_path / "var" / "stability.json"
    assert main(["stability", CASE_256.id, "--backend", "sdpa", "--device", "cpu", "--out", str(variation)]) == 0
    assert f"variation: {variation}" in capsys.readouterr().out
    document = json.loads(variation.read_text())
    assert document["cv"] == pytest.approx(measured.cv) and document["device_name"] == "synthetic CPU" and len(document["medians_ms"]) == 5
    out_csv = tmp_path / "cmp.csv"
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(out_csv)]) == 1
    capsys.readouterr()
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(out_csv), "--variation", str(variation)]) == 0
    out = capsys.readouterr().out
    assert "run-to-run variation 2.55 %" in out and pd.read_csv(out_csv)["verdict"].iloc[0] == "within noise"
    # another device's variation says nothing about this one's runs
    other = json.loads(variation.read_text()) | {"device_name": "another CPU"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["compare", str(base), str(new), "--out", str(out_csv), "--variation", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "measure the variation on the same device" in err
    run = write_run(tmp_path / "rec", [timed("sdpa", 1.00, interval=0.01), timed("naive", 1.06, interval=0.01)])
    assert main(["recommend", str(run), "--seq", "256", "--variation", str(variation)]) == 0
    assert "within noise" in capsys.readouterr().out


def test_a_bad_variation_file_is_one_line_and_stability_never_writes_into_a_run(tmp_path, capsys, monkeypatch):
    base, new = _compared(tmp_path, [(1.0, 1.0)])
    (tmp_path / "wrong.json").write_text(json.dumps({"cv": 0.1}))
    for path in (tmp_path / "wrong.json", tmp_path / "missing.json", base / "records.jsonl"):
        assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv"), "--variation", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--variation" in err
    monkeypatch.setattr("harness.checks.stability.run_stability", lambda *a, **k: pytest.fail("measured before refusing the output path"))
    assert main(["stability", CASE_256.id, "--device", "cpu", "--out", str(base / "stability.json")]) == 2
    assert "inside the run folder" in capsys.readouterr().err


def test_compare_sums_up_each_backend_by_the_geometric_mean_of_its_ratios(tmp_path, capsys):
    base, new = _compared(tmp_path, [(1.0, 1.2), (2.0, 2.0), (4.0, 3.2)])  # ratios 1.2 (slower), 1.0 (same), 0.8 (faster)
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    geomean = (1.2 * 1.0 * 0.8) ** (1 / 3)  # 0.98648…
    assert f"sdpa: geometric mean {1 / geomean:.3f}x faster over 3 cases (1 faster, 1 slower, 1 not different)" in out
    from harness.analysis.compare import compare_runs

    summary = compare_runs(base, new).summary.set_index("backend").loc["sdpa"]
    assert summary["geomean_ratio"] == pytest.approx(geomean) and summary["cases"] == 3


def test_the_report_marks_a_winner_within_noise_by_the_variation_it_is_given(tmp_path, capsys):
    from harness.analysis.difference import Variation

    run = write_run(tmp_path / "run", [timed("sdpa", 1.00, interval=0.01), timed("naive", 1.06, interval=0.01)])
    variation = tmp_path / "stability.json"
    variation.write_text(json.dumps(Variation(0.03, "cpu", "synthetic CPU", CASE_256.id, "sdpa", (1.0, 1.03, 0.97)).to_dict()))
    pages = {}
    for name, extra in (("plain", []), ("widened", ["--variation", str(variation)])):
        assert main(["report", str(run), "--out", str(tmp_path / name), *extra]) == 0
        pages[name] = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("report: ")).read_text()
    assert "(within noise)" not in pages["plain"] and "no variation given" in pages["plain"]
    assert "(within noise)" in pages["widened"] and "run-to-run variation 3.00 %" in pages["widened"]
