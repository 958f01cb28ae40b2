"""gpu-check's timer gate against the box's measured fixed overhead, and its schedule, on the H200's real numbers.

The numbers are from /work/shared/data/h200-2026-11-29: probe3 (decode 16.5 µs between events over
a 12.7 µs kernel, cuDNN 410.7 over 405.5 µs: a fixed ~4 µs a sample) and gpu-check-run1.txt (the
seconds each backend's child took; flex reached last with 82 s left, and timed out).
"""

import os

import pytest

from harness.checks import gpu as gc
from harness.cli.gpu_check import format_table
from harness.cli.main import main
from harness.checks.gpu_plan import MIN_CHILD_S, estimate_s, plan_schedule
from harness.measure.cuda_clock import CudaEventClock, FixedOverhead, measure_fixed_overhead
from harness.results.record import Record, Status
from harness.suite.cases import parse_case_id
from tests.gpu_timeline import Timeline

US = 1e-3  # one microsecond in milliseconds, the rows' unit


def pair(ms, kernel_ms, overhead_us, spread_us=0.05, name="sdpa", case="c"):
    """A single-kernel CUDA row as a gpu-check child reports it, times in microseconds where named so."""
    return gc.Row(name, case, Status.OK, True, ms, None, kernel_ms=kernel_ms, kernels=1.0,
                  overhead_ms=None if overhead_us is None else overhead_us * US, overhead_spread_ms=spread_us * US)


@pytest.mark.parametrize("ms,kernel_ms,overhead_us,off", [
    (16.5 * US, 12.7 * US, 4.0, False),  # probe3's decode: healthy, 1.30x its kernel time only by the fixed overhead
    (16.5 * US, 12.7 * US, 0.5, True),   # the same reading on a box whose overhead is 0.5 µs: 3.3 µs are unexplained
    (410.7 * US, 405.5 * US, 4.0, False),  # probe3's cuDNN
    (35 * 1.12 * US, 35 * US, 4.0, False),  # gpu-check's ~35 µs kernels read 1.10–1.15 on the H200
    ((35 * 1.10 + 4.0) * US, 35 * US, 4.0, True),  # 10 % off beyond the overhead
    ((35 * 0.90 + 4.0) * US, 35 * US, 4.0, True),  # 10 % under: a timer that misses kernel time is as wrong
])
def test_a_single_kernel_pair_is_judged_against_its_kernel_time_plus_the_measured_overhead(ms, kernel_ms, overhead_us, off):
    row = pair(ms, kernel_ms, overhead_us)
    assert row.timer_off is off and row.failed is off


def test_a_residual_within_the_overheads_own_interval_is_not_called_off():
    # 16.5 µs over 12.7 µs with 3.0 µs measured: 0.8 µs left, over 3 % (0.38 µs) but inside a ±1 µs overhead.
    assert not pair(16.5 * US, 12.7 * US, 3.0, spread_us=1.0).timer_off
    assert pair(16.5 * US, 12.7 * US, 3.0, spread_us=0.1).timer_off


def test_a_pair_without_a_measured_overhead_is_not_passed_and_the_table_says_why():
    row = pair(16.5 * US, 12.7 * US, None)
    assert row.failed
    assert "timer not judged on c: its child measured no fixed overhead" in format_table([row])


def test_the_table_shows_the_overhead_corrected_ratio_and_names_the_overhead_of_an_off_pair():
    healthy = pair(16.5 * US, 12.7 * US, 4.0, name="sdpa")
    off = pair(16.5 * US, 12.7 * US, 0.5, name="sdpa-cudnn")
    table = format_table([healthy, off]).splitlines()
    assert table[0].split()[-3:] == ["ratio", "net", "note"]
    assert table[1].split()[8:10] == ["1.299", "0.984"]  # (16.5 − 4.0) / 12.7
    assert table[2].split()[9] == "1.260" and "after the 0.5 µs fixed overhead (more than 3% off)" in table[2]


def test_a_childs_rows_carry_the_overhead_it_printed():
    from harness.results.record import Record

    case = gc.check_cases("cuda")[6]
    record = Record(case=case, backend="sdpa", latency_ms_median=0.0165)
    overhead = FixedOverhead(between_s=5.1e-6, kernel_s=1.0e-6, spread_s=0.2e-6, samples=40)
    (row,) = gc.rows_of("sdpa", [record.to_dict(), {"fixed_overhead": overhead.to_dict()}])
    assert row.case == case.id and row.ms == 0.0165
    assert row.overhead_ms == pytest.approx(4.1e-3) and row.overhead_spread_ms == pytest.approx(0.2e-3)
    # A child whose overhead measurement failed keeps its records; their timers go unjudged.
    (row,) = gc.rows_of("sdpa", [record.to_dict(), {gc.OVERHEAD_ERROR: "RuntimeError: no profiler"}])
    assert row.overhead_ms is None and row.ms == 0.0165


def test_the_fixed_overhead_is_the_empty_kernels_time_between_readings_less_its_own_kernel_time():
    # A box where every kernel costs 4 µs of device time before its work (what the H200's events saw),
    # timed behind 30 µs of Python, after a 50 µs flush: the clock keeps the Python out, not the 4 µs.
    tl = Timeline(1.37e9, launch_s=4e-6)
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    flushes = []

    def flush():
        flushes.append(tl.kernels)
        tl.call(20e-6, 50e-6)

    profiled = []

    def kernel_time_s(step):
        profiled.append(step)
        return 0.8e-6  # what the profiler reports of the one-element kernel: its work, not the launch

    def empty_step():
        tl.call(30e-6, 0.8e-6)

    overhead = measure_fixed_overhead(empty_step, clock, kernel_time_s, setup=flush)
    assert overhead.between_s == pytest.approx(4.8e-6, rel=1e-6)
    assert overhead.seconds == pytest.approx(4.0e-6, rel=1e-6)
    assert overhead.spread_s == pytest.approx(0.0, abs=1e-12) and overhead.samples >= 30
    assert profiled == [empty_step]
    assert len(flushes) > overhead.samples  # a flush before every sample, warm-up included
    assert FixedOverhead.from_dict(overhead.to_dict()) == overhead


def test_the_box_overhead_runs_the_pairs_clock_and_profiler_on_a_real_step():
    # On the CPU the number means nothing (the profiler's cost per operator is in it); what is held here
    # is that the real clock, flush and profiler are wired: samples taken, an operator profiled.
    overhead = gc.measure_box_overhead("cpu")
    assert overhead.samples >= 30 and overhead.kernel_s > 0 and overhead.between_s > 0


#: gpu-check-run1.txt: each backend's child, in seconds, in registry order (flex: timed out at 82 s).
RUN1 = [("naive", "naive", 14), ("sdpa", "sdpa", 21), ("sdpa-math", "sdpa", 14), ("sdpa-flash", "sdpa", 12),
        ("sdpa-efficient", "sdpa", 13), ("sdpa-cudnn", "sdpa", 14), ("projections", "projections", 8),
        ("xformers", "xformers", 15), ("flash-attn2", "flash-attn", 6), ("flash-attn3", "flash-attn", 6),
        ("flash-attn4", "flash-attn", 7), ("mla", "mla", 8), ("mha-layer", "layer", 8), ("naive-compiled", "compiled", 45),
        ("flex", "flex", 82)]


def simulate(schedule, took):
    """Run a schedule with children that take `took[name]` seconds or are killed at their timeout: name → (timeout, finished)."""
    elapsed, out = 0.0, {}
    for index, slot in enumerate(schedule.slots):
        timeout = schedule.timeout_s(index, elapsed)
        out[slot.name] = (timeout, took[slot.name] <= timeout)
        elapsed += min(took[slot.name], timeout)
    return out, elapsed


def test_on_the_h200s_numbers_flex_runs_first_with_time_for_its_compiles_and_every_backend_gets_a_verdict():
    flex_s = estimate_s("flex", gc.cases_for("flex", "cuda"))  # 3 cases, two compiles each (run1: 82 s held fewer than 8)
    assert 30 < flex_s < 50
    estimates = [(n, f, flex_s if n == "flex" else s) for n, f, s in RUN1]
    schedule = plan_schedule(estimates, gc.TOTAL_BUDGET_S)
    assert not schedule.skipped
    assert [s.name for s in schedule.slots][:2] == ["naive-compiled", "flex"]
    # naive-compiled takes run1's 45 s for its fewer cases, flex half again its estimate, the rest their run1 seconds.
    took = {n: s for n, _, s in RUN1} | {"flex": 1.5 * flex_s}
    verdicts, elapsed = simulate(schedule, took)
    assert all(finished for _, finished in verdicts.values()), verdicts
    assert verdicts["flex"][0] >= 1.5 * flex_s and elapsed <= gc.TOTAL_BUDGET_S


def test_the_cost_models_estimates_for_the_h200s_backends_fit_the_budget():
    from harness.backends.registry import load_registry

    registry = load_registry()  # every registered backend (RUN1's 15 and those added since), as plan_gpu_check counts them
    estimates = [(n, registry.get(n).family, estimate_s(registry.get(n).family, [c for c in gc.cases_for(registry.get(n).family, "cuda")
                                                                              if gc.declared_refusal(registry.get(n), c) is None]))
                 for n in registry.names()]
    schedule = plan_schedule(estimates, gc.TOTAL_BUDGET_S)
    assert not schedule.skipped and sum(s.reserve_s for s in schedule.slots) <= gc.TOTAL_BUDGET_S
    # The full grid would not: two compiles for each of flex's 8 cases.
    assert estimate_s("flex", gc.check_cases("cuda")) > 75


def test_a_hanging_backend_cannot_take_the_time_promised_to_those_after_it():
    schedule = plan_schedule([("hangs", "sdpa", 14), ("a", "sdpa", 14), ("b", "sdpa", 14)], 60.0)
    verdicts, _ = simulate(schedule, {"hangs": 1e9, "a": 14, "b": 14})
    assert verdicts["hangs"] == (32.0, False) and verdicts["a"][1] and verdicts["b"][1]


def test_backends_the_budget_cannot_hold_are_left_out_largest_first_with_why():
    schedule = plan_schedule([("naive", "naive", 14), ("flex", "flex", 40), ("sdpa", "sdpa", 14)], 40.0)
    assert [s.name for s in schedule.slots] == ["naive", "sdpa"]
    ((name, reason),) = schedule.skipped
    assert name == "flex" and "needs ~40 s, the others hold 28 of the 40 s budget" in reason and "--backends flex" in reason


def test_gpu_check_runs_compilers_first_bounds_each_child_and_reports_what_it_skipped(capsys, monkeypatch):
    now = [0.0]
    ran = []

    def child(name, device, timeout_s):
        ran.append((name, round(timeout_s, 1)))
        now[0] += min(50.0, timeout_s)  # each child takes 50 s, or is killed at its timeout
        return [gc.Row(name, "c", Status.OK, True, 1.0, None, overhead_ms=0.004 if name == "naive" else 0.0042, overhead_spread_ms=5e-5)]

    monkeypatch.setattr(gc, "_child", child)
    monkeypatch.setattr(gc.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gc, "TOTAL_BUDGET_S", 100.0)
    flex_s = estimate_s("flex", gc.cases_for("flex", "cpu"))
    reserve = {s.name: s.reserve_s for s in gc.plan_gpu_check("cpu", ["naive", "sdpa", "flex"]).schedule.slots}
    assert main(["gpu-check", "--cpu", "--backends", "naive,sdpa,flex"]) == 0
    # flex first, with what the others' reserves leave; naive what flex's 50 s and sdpa's reserve leave; sdpa the rest.
    naive_s = round(100.0 - 50.0 - reserve["sdpa"], 1)
    assert ran == [("flex", round(100.0 - reserve["naive"] - reserve["sdpa"], 1)), ("naive", naive_s), ("sdpa", round(100.0 - 50.0 - naive_s, 1))]
    assert flex_s <= ran[0][1]
    out = capsys.readouterr().out
    assert f"flex: each case compiles, so run first, on 3 of the {len(gc.check_cases('cpu'))} cases" in out
    assert f"naive: 1 ok, 0 unsupported in {naive_s:.0f} s; fixed overhead 4.00 ± 0.05 µs a sample" in out
    assert "fixed overhead a sample between events, as the children measured it: 4.00–4.20 µs" in out
    monkeypatch.setattr(gc, "TOTAL_BUDGET_S", 40.0)
    ran.clear()
    assert main(["gpu-check", "--cpu", "--backends", "naive,sdpa,flex"]) == 1
    assert [name for name, _ in ran] == ["naive", "sdpa"]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("flex") and "skipped" in lines[-1] and "--backends flex" in lines[-1]
    assert MIN_CHILD_S <= 14.0


def test_rows_keeps_every_pair_of_each_backend_that_ended_even_when_the_check_is_stopped_partway(tmp_path, monkeypatch):
    import csv

    def child(name, device, timeout_s):
        if name == "sdpa":
            raise KeyboardInterrupt  # the user stops gpu-check while sdpa's child runs
        return [pair(16.5 * US, 12.7 * US, 4.0, name=name, case="fwd"),
                gc.Row(name, "fp8", Status.UNSUPPORTED, None, None, "no FP8 kernel"),
                pair(16.5 * US, 12.7 * US, 0.5, name=name, case="off")]

    monkeypatch.setattr(gc, "_child", child)
    rows = tmp_path / "rows.csv"
    assert main(["gpu-check", "--cpu", "--backends", "naive,sdpa", "--rows", str(rows)]) == 130
    with rows.open(newline="") as f:
        written = list(csv.DictReader(f))
    assert [(r["backend"], r["case"], r["status"]) for r in written] == [("naive", "fwd", "ok"), ("naive", "fp8", "unsupported"),
                                                                        ("naive", "off", "ok")]
    fwd, fp8, off = written
    assert float(fwd["net"]) == pytest.approx((16.5 - 4.0) / 12.7) and fwd["failed"] == "False" and fwd["overhead_us"] == "4.0"
    assert fp8["reason"] == "no FP8 kernel" and fp8["ms"] == "" and fp8["failed"] == "False"
    assert off["failed"] == "True"


def test_rows_to_a_folder_that_does_not_exist_is_refused_in_one_line_before_any_child_runs(tmp_path, capsys, monkeypatch):
    from tests.cli_runs import refused

    monkeypatch.setattr(gc, "_child", lambda *a: pytest.fail("a child ran before --rows was found unwritable"))
    refused(capsys, ["gpu-check", "--cpu", "--backends", "naive", "--rows", str(tmp_path / "no" / "rows.csv")],
            ["--rows", "rows.csv", "cannot write it"])


def test_a_gpu_check_child_sets_the_cublas_workspace_before_its_first_pair_so_the_deterministic_twin_can_run(monkeypatch):
    """The H200 run of 2026-12-04: without it every backend refused the deterministic packed backward, asking for the variable."""
    from harness.execution import execute as execute_module

    seen = []
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(gc, "require_cuda", lambda: None)
    monkeypatch.setattr(gc, "emit", lambda obj: None)
    monkeypatch.setattr(execute_module, "execute", lambda case, *a, **k: seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
                        or Record(case=case, backend="naive", status=Status.UNSUPPORTED, reason="stand-in"))
    assert any(c.deterministic for c in gc.cases_for("eager", "cuda"))
    assert gc.backend_job(["naive", "--device", "cuda"]) == 0
    assert seen and set(seen) == {":4096:8"}


def test_only_a_process_that_will_run_a_deterministic_cuda_case_changes_cublas_workspaces(monkeypatch):
    from harness.backends.determinism import cublas_workspace_for

    plain = [c for c in gc.cases_for("eager", "cuda") if not c.deterministic]
    assert cublas_workspace_for(plain + [c for c in gc.cases_for("eager", "cpu") if c.deterministic]) == {}
    assert cublas_workspace_for(gc.cases_for("eager", "cuda")) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own setting stands
    monkeypatch.setattr(gc, "require_cuda", lambda: None)
    monkeypatch.setattr(gc, "run_backend", lambda *a, **k: [])
    assert gc.backend_job(["naive", "--device", "cuda"]) == 0
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_the_grid_reaches_fp8_paged_mla_the_score_variants_and_the_packed_deterministic_backward():
    from harness.backends.registry import load_registry
    from suites.train import SUITE as TRAIN

    registry = load_registry()
    cases = gc.check_cases("cuda")
    reached = {name: cases[index] for name, (index, _) in gc.PATHS.items()}
    assert reached["fp8 q/k/v"].dtype == "fp8_e4m3" and reached["fp8 kv cache decode"].kv_dtype == "fp8_e4m3"
    assert reached["paged mla decode"].mla and reached["paged mla decode"].layout == "paged"
    assert reached["sinks + window"].sinks and reached["sinks + window"].window
    assert reached["softcap"].softcap and reached["alibi"].alibi
    packed, det = reached["packed backward"], reached["deterministic packed backward"]
    assert packed.layout == det.layout == "packed" and packed.mode == det.mode == "bwd" and det.deterministic and not packed.deterministic
    assert packed in TRAIN.cases and det in TRAIN.cases  # the train suite's own shapes, not look-alikes
    assert len({c.id for c in cases}) == len(cases)
    for name, (index, backends) in gc.PATHS.items():
        case = cases[index]
        assert parse_case_id(case.id, "cuda") == case or case.ragged  # a dense case's id rebuilds it exactly
        for backend in backends:
            assert backend in registry.names(), (name, backend)
            assert registry.get(backend).supports(case) is None, (name, backend, registry.get(backend).supports(case))
    # The CPU grid (--cpu) has the same paths, small.
    assert len(gc.check_cases("cpu")) == len(cases)


def test_the_plan_counts_only_the_cases_a_backend_does_not_refuse_by_declaration():
    from harness.backends.registry import load_registry

    registry = load_registry()
    plan = gc.plan_gpu_check("cpu", ["eager-fp8", "naive"])
    reserve = {slot.name: slot.reserve_s for slot in plan.schedule.slots}
    served = [c for c in gc.check_cases("cpu") if gc.declared_refusal(registry.get("eager-fp8"), c) is None]
    assert [c.dtype for c in served] == ["fp8_e4m3"]  # eager-fp8 computes in FP8 only: one case of sixteen
    assert reserve["eager-fp8"] == max(MIN_CHILD_S, estimate_s("eager", served)) < reserve["naive"]
