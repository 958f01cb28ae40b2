"""Deterministic backward as a case axis: the field, the refusals, bitwise repetition measured, and its cost."""

from __future__ import annotations

import json

import pytest
import torch

from harness.analysis.determinism import determinism_cost, plain_case_id
from harness.report.determinism import determinism_section
from harness.report.writer import Table, render_table
from harness.backends.determinism import NOT_REPEATABLE, deterministic_algorithms
from harness.backends.flashattention.adapter import flash_call
from harness.backends.pytorch.naive import NaiveBackend
from harness.backends.pytorch.sdpa import SdpaCudnnBackend
from harness.backends.xformers.adapter import XformersBackend
from harness.errors import Unsupported, UserError
from harness.results.record import Record
from harness.results.store import read_records
from harness.suite.cases import Case, parse_case_id
from harness.suite.catalog import suite_from_toml
from harness.suite.inputs import make_inputs
from tests.cli_runs import attnbench_in_process
from tests.flash_attn_sources import BACKENDS, real_signature
from tests.nondeterministic_backends import JitteryBackwardBackend, NoDeterministicBackend
from tests.synthetic_runs import frame_of, synthetic_record, write_run

PLUGIN = "tests.nondeterministic_backends:add_all"
SMALL = dict(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=16, d_v=16)


def det_case(**fields) -> Case:
    """A tiny CPU fwd_bwd case with a deterministic backward, `fields` changed."""
    return Case(**{**SMALL, "mode": "fwd_bwd", "deterministic": True, **fields})


# -- the field --


def test_the_id_carries_det_and_reads_back():
    case = det_case(causal=True)
    assert case.id == "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32-causal-fwd_bwd-det"
    assert parse_case_id(case.id) == case and not parse_case_id(plain_case_id(case.id)).deterministic


def test_a_forward_deterministic_case_is_one_line_user_error():
    with pytest.raises(UserError) as raised:
        Case(**SMALL, deterministic=True)
    assert str(raised.value) == "deterministic is a backward property; give mode bwd or fwd_bwd"
    assert det_case(mode="bwd").deterministic


def test_a_suite_file_takes_deterministic_as_an_axis(tmp_path):
    path = tmp_path / "det.toml"
    path.write_text('name = "det"\nbackends = ["naive"]\n[[grid]]\nB = 1\nS = [16]\nH = 2\nd_k = 16\nmode = "fwd_bwd"\n'
                    "deterministic = [false, true]\n")
    cases = suite_from_toml(path).cases
    assert sorted(c.deterministic for c in cases) == [False, True]


def test_an_old_record_without_the_field_reads_false(tmp_path):
    run = write_run(tmp_path / "old", [synthetic_record(det_case(deterministic=False), "naive", 1.0)])
    lines = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for line in lines:  # written before the field existed
        del line["deterministic"], line["bitwise_repeatable"]
    (run / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (record,) = read_records(run).typed()
    assert record.case.deterministic is False and record.bitwise_repeatable is None


# -- who refuses, and the flags torch gets --


def test_backends_without_a_deterministic_backward_refuse_with_their_reason():
    case = det_case(device="cuda")
    refusals = XformersBackend().refusals(case)
    assert len(refusals) == 1, refusals
    assert refusals[0].startswith("xformers has no deterministic backward (memory_efficient_attention has no deterministic switch")
    assert "cuDNN" in SdpaCudnnBackend().supports(case)
    assert NaiveBackend().supports(det_case()) is None
    assert XformersBackend().refusals(case.replace(deterministic=False)) == []


def test_a_cuda_deterministic_case_without_the_cublas_setting_says_what_to_export(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.raises(Unsupported, match="CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        with deterministic_algorithms(det_case(device="cuda")):
            pass  # pragma: no cover - refused on entry


@pytest.mark.parametrize("generation", [2, 3, 4])
@pytest.mark.parametrize("padding", [False, True])
def test_flash_attention_gets_deterministic_bound_to_its_real_signature(generation, padding):
    case = Case(**{**SMALL, "B": 2, "mode": "fwd_bwd", "deterministic": True, "padding": padding})
    call = flash_call(case, make_inputs(case), none_window=BACKENDS[generation].none_window, requires_grad=True)
    bound = real_signature(generation, call.function).bind(call.q, call.k, call.v, **call.kwargs)
    assert bound.arguments["deterministic"] is True
    plain = flash_call(case.replace(deterministic=False), make_inputs(case), none_window=BACKENDS[generation].none_window)
    assert "deterministic" not in plain.kwargs


def test_deterministic_algorithms_is_on_inside_and_restored_after():
    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(det_case()):
        assert torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(det_case(deterministic=False)):
        assert torch.are_deterministic_algorithms_enabled() == before
    assert torch.are_deterministic_algorithms_enabled() == before


# -- attnbench check, measured --


def _suite(tmp_path, deterministic: str) -> str:
    path = tmp_path / "det.toml"
    path.write_text(f'name = "det"\n[[grid]]\nB = 1\nS = [16]\nH = 2\nH_kv = [2, 1]\nd_k = 16\nmode = ["fwd_bwd", "bwd"]\n'
                    f"causal = [false, true]\ndeterministic = {deterministic}\n")
    return str(path)


def _check(capsys, monkeypatch, tmp_path, backends: str, deterministic: str) -> tuple[int, list[dict]]:
    monkeypatch.setenv("ATTNBENCH_BACKENDS", PLUGIN)
    code, out, _ = attnbench_in_process(["check", "--suite", _suite(tmp_path, deterministic), "--backends", backends, "--json"], capsys)
    return code, json.loads(out)


@pytest.mark.slow
def test_naive_and_sdpa_math_agree_and_repeat_bitwise(capsys, monkeypatch, tmp_path):
    code, pairs = _check(capsys, monkeypatch, tmp_path, "naive,sdpa-math", "true")
    assert code == 0 and len(pairs) == 16
    assert all(p["case_id"].endswith("-det") and p["agree"] is True and p["bitwise_repeatable"] is True for p in pairs), pairs


def test_a_false_claim_is_caught_by_bitwise_repetition(capsys, monkeypatch, tmp_path):
    code, pairs = _check(capsys, monkeypatch, tmp_path, JitteryBackwardBackend.name, "true")
    assert code != 0 and pairs
    assert all(p["agree"] is False and p["bitwise_repeatable"] is False and NOT_REPEATABLE in p["reason"] for p in pairs), pairs


def test_without_deterministic_the_same_noise_is_only_recorded(capsys, monkeypatch, tmp_path):
    code, pairs = _check(capsys, monkeypatch, tmp_path, JitteryBackwardBackend.name, "false")
    assert code == 0 and pairs
    assert all(p["agree"] is True and p["bitwise_repeatable"] is False for p in pairs), pairs


def test_a_backend_without_one_is_unsupported_with_its_reason(capsys, monkeypatch, tmp_path):
    code, pairs = _check(capsys, monkeypatch, tmp_path, NoDeterministicBackend.name, "true")
    assert code == 0 and pairs
    assert {p["status"] for p in pairs} == {"unsupported"}
    why = NoDeterministicBackend.feature_reasons["deterministic"]
    assert all(p["reason"] == f"{NoDeterministicBackend.name} has no deterministic backward ({why})"
               for p in pairs)


# -- the cost --


def test_determinism_cost_is_the_ratio_of_the_twins():
    det, plain = synthetic_record(det_case(), "naive", 3.0), synthetic_record(det_case(deterministic=False), "naive", 2.0)
    det.bitwise_repeatable, plain.bitwise_repeatable = True, False
    other = synthetic_record(det_case(), "sdpa-math", 1.0)  # no plain twin: left out
    costs = determinism_cost(frame_of([det, plain, other]))
    assert len(costs) == 1
    row = costs.iloc[0]
    assert (row["backend"], row["case_id"], row["plain_case_id"]) == ("naive", det.case.id, plain.case.id)
    assert row["ratio"] == pytest.approx(1.5) and row["bitwise_repeatable"] is True and row["plain_bitwise_repeatable"] is False


def test_a_record_round_trips_bitwise_repeatable():
    record = synthetic_record(det_case(), "naive", 1.0)
    record.bitwise_repeatable = True
    assert Record.from_dict(record.to_dict()).bitwise_repeatable is True


def test_the_report_section_shows_the_ratio_and_is_omitted_without_deterministic_rows():
    det, plain = synthetic_record(det_case(), "naive", 3.0), synthetic_record(det_case(deterministic=False), "naive", 2.0)
    det.bitwise_repeatable = True
    section = determinism_section(frame_of([det, plain]))
    html = "".join(render_table(b) for b in section.blocks if isinstance(b, Table))
    assert section.anchor == "determinism" and "1.5×" in html and det.case.id in html and "yes" in html
    assert determinism_section(frame_of([plain])) is None
