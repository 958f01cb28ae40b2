"""The `published` suite: its figures are data a test checks, it is CUDA only, and its report section splits the gap.

The figures' own arithmetic is held to their sources' conventions (cuDNN's FLOPs over visible pairs, its decode bytes
Q + K + V + O), so a mistyped number or shape fails here. The section is fed rows built by the synthetic helpers: none of
the real H200 slice (tests/h200_data.py) is at a published configuration, which the last test checks rather than assumes.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from harness.compat import tomllib
from harness import analysis
from harness.analysis import published as pub
from harness.analysis.datasheets import DATASHEETS
from harness.backends.registry import load_registry
from harness.errors import UserError
from harness.execution.execute import run_pair
from harness.report.published import figure_rows, published_section
from harness.report.writer import write_report
from harness.results.record import Status
from harness.suite.catalog import load_suite, suite_on_device
from tests.h200_data import h200_records, needs_h200
from tests.synthetic_runs import frame_of, synthetic_record

FIGURES = pub.load_figures()


def _by_id(name: str) -> pub.Figure:
    return next(f for f in FIGURES if f.id == name)


def test_every_figure_has_a_source_a_date_a_known_gpu_and_builds_the_case_its_id_names():
    raw = tomllib.loads(pub.FIGURES_PATH.read_text())["figure"]
    assert len(raw) == len(FIGURES) and len({f.id for f in FIGURES}) == len(FIGURES)
    registry = load_registry()
    for figure, table in zip(FIGURES, raw):
        assert figure.source.startswith("https://") and figure.date[:4].isdigit()
        assert figure.gpu in DATASHEETS  # a device model torch names, whose datasheet the report reads
        assert figure.case.id == table["case_id"] and figure.case.device == "cuda"
        assert all(name in registry.names() for name in figure.ours), figure.id
        assert figure.time_ms > 0 and figure.note


def test_each_figures_number_is_its_time_under_the_publishers_own_count():
    """cuDNN: 4·B·H·d FLOPs per visible pair (causal S(S+1)/2), backward 2.5×; decode GB/s = (Q + K + V + O) bytes ÷ time."""
    for figure in FIGURES:
        c = figure.case
        if figure.metric == "gbps":
            elements = 2 * c.B * c.H * c.S_q * c.d_k + 2 * c.B * c.H_kv * c.S_kv * c.d_k
            implied = elements * 2 / (figure.time_ms / 1e3) / 1e9  # bf16: two bytes an element
        else:
            pairs = c.S_q * (c.S_q + 1) // 2 if c.causal else c.S_q * c.S_kv
            implied = 4 * c.B * c.H * c.d_k * pairs * (2.5 if c.mode == "bwd" else 1.0) / (figure.time_ms / 1e3) / 1e12
        assert implied == pytest.approx(figure.value, rel=2e-3), figure.id


def test_a_figure_whose_fields_build_another_case_or_that_lacks_a_source_is_refused():
    raw = tomllib.loads(pub.FIGURES_PATH.read_text())["figure"][0]
    with pytest.raises(UserError, match="not the case_id"):
        pub.figure_of(0, {**raw, "case": {**raw["case"], "H_kv": 4}})
    with pytest.raises(UserError, match="missing field 'source'"):
        pub.figure_of(0, {k: v for k, v in raw.items() if k != "source"})
    with pytest.raises(UserError, match="unmasked dense"):  # the FA count cannot stand for a causal case
        pub.figure_of(0, {**{k: v for k, v in raw.items() if k != "time_ms"}, "flops": "4·B·H·S²·d",
                          "case": {**raw["case"], "causal": True}, "case_id": raw["case_id"] + "-causal"})


def test_the_suite_runs_every_figures_case_and_on_a_cpu_answers_each_pair_unsupported_with_why():
    suite = load_suite("published")
    assert set(suite.cases) == {f.case for f in FIGURES} and suite.cuda_only
    on_cpu = suite_on_device("published", "cpu")
    assert {c.device for c in on_cpu.cases} == {"cuda"}  # never shrunk onto the CPU
    registry = load_registry()
    outcome = run_pair(on_cpu.cases[0], registry.get(on_cpu.backends[0]))
    assert outcome.status is Status.UNSUPPORTED and "no CUDA device" in outcome.reason and "CUDA GPU only" in outcome.reason


def _frame(records, model="NVIDIA H200", clocks=None, flags=None):
    """The analysis frame of `records` as if measured on `model`, with each row's median SM clock and flags."""
    frame = frame_of(records, peaks=None)
    frame["device_model"] = model
    frame["gpu_sm_clock_mhz_median"] = clocks if clocks is not None else 1980.0
    for name, values in (flags or {}).items():
        frame[name] = values
    return analysis.with_roofline(frame, {"synthetic": None})


ENV = {"synthetic": {"telemetry_before": [{"max_sm_clock_mhz": 1980}]}}


def test_the_gap_splits_into_clock_flags_and_the_rest_and_the_parts_add_up():
    figure = _by_id("cudnn-h200-fa4-bf16-fwd-s8192")
    slow, fast = figure.time_ms * 1.25, figure.time_ms * 0.9
    records = [synthetic_record(figure.case, name, ms) for name, ms in
               (("flash-attn4", slow), ("flash-attn3", slow), ("sdpa-cudnn", slow), ("sdpa-flash", fast))]
    frame = _frame(records, clocks=[1980.0, 1650.0, 1980.0, 1980.0],
                   flags={"throttled": [False, False, True, False], "contended": False, "launch_leaked": 0})
    rows, why = figure_rows(figure, frame, ENV)
    assert why is None
    by = {r["backend"]: r for r in rows}
    for row in rows:
        assert row["% of published"] == pytest.approx(100 * figure.time_ms / row["ms"])
        assert row["gap (points)"] == pytest.approx(max(0.0, 100 - row["% of published"]))
        assert (row["clock"] or 0) + row["flags"] + row["left"] == pytest.approx(row["gap (points)"])
    assert by["flash-attn4"]["clock"] == 0 and by["flash-attn4"]["flags"] == 0 and by["flash-attn4"]["left"] > 0
    # 1650 of 1980 MHz explains up to 16.7 points: all of a 20-point gap but 3.3.
    assert by["flash-attn3"]["clock"] == pytest.approx(100 * (1 - 1650 / 1980)) and by["flash-attn3"]["left"] > 0
    assert by["sdpa-cudnn"]["flags set"] == "throttled" and by["sdpa-cudnn"]["flags"] == pytest.approx(by["sdpa-cudnn"]["gap (points)"])
    assert by["sdpa-cudnn"]["left"] == 0
    assert by["sdpa-flash"]["gap (points)"] == 0 and by["sdpa-flash"]["% of published"] > 100


def test_a_row_without_a_known_clock_leaves_the_clock_share_unknown_not_zero():
    figure = _by_id("cudnn-h200-fa4-bf16-bwd-s8192")
    gap = pub.gap_of(figure, figure.time_ms * 2, {"gpu_sm_clock_mhz_median": None}, 1980.0)
    assert gap.clock_pp is None and gap.left_pp == pytest.approx(50.0) and (gap.clock_pp or 0.0) + gap.flags_pp + gap.left_pp == pytest.approx(gap.gap_pp)


def test_the_section_renders_sets_rows_beside_figures_and_says_which_figures_have_no_gpu_row(tmp_path):
    h200 = _by_id("cudnn-h200-cudnn-fp8-fwd-s8192")
    h100 = _by_id("fa3-paper-h100-fp16-fwd-s16384")
    records = [synthetic_record(h200.case, "flash-attn3", h200.time_ms * 1.1), synthetic_record(h100.case, "flash-attn3", h100.time_ms)]
    data = analysis.RunData(frame=_frame(records), env=ENV)
    section = published_section(data)
    page = write_report(tmp_path / "report", "t", [section]).read_text()
    assert h200.id in page and h100.source in page
    assert f"{100 / 1.1:.1f} %" in page  # the H200 row's share of its figure
    # The H100 figure's case ran, but on an H200: it is not set beside the figure.
    assert f"{h100.id}</b>: no row on the NVIDIA H100 80GB HBM3: this case was measured on NVIDIA H200" in page


def test_on_a_cpu_run_the_section_says_no_gpu_row_exists_with_the_pairs_reason():
    figure = _by_id("cudnn-h200-fa4-bf16-fwd-s8192")
    record = synthetic_record(figure.case, "flash-attn4", 1.0, status="unsupported")
    record = dataclasses.replace(record, reason="the case is on cuda, and this machine has no CUDA device")
    frame = frame_of([record], peaks=None)
    frame["device_model"] = "synthetic CPU"
    section = published_section(analysis.RunData(frame=frame, env={}))
    text = "".join(b for b in section.blocks if isinstance(b, str))
    assert "No GPU row exists for any of these figures" in text and "no CUDA device" in text


@needs_h200
def test_the_real_h200_rows_show_the_section_exactly_when_one_is_at_a_published_configuration():
    frame = pd.DataFrame(h200_records())
    frame["device_model"] = "NVIDIA H200"
    section = published_section(analysis.RunData(frame=frame, env={}))
    matching = {f.case.id for f in FIGURES} & set(frame["case_id"])
    assert (section is None) == (not matching)
