"""`attnbench policy`: measured runs → a backend policy per device and shape bucket, with its evidence; gaps listed, never guessed."""

from __future__ import annotations

import json
import math

import pytest

from harness.policy import reader
from harness.policy.build import build_policy
from harness.policy.sources import load_folders
from harness.results.vocabulary import UNTRUSTED_FLAGS
from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.h200_data import h200_records, needs_h200
from tests.policy_runs import grid_cases, grid_run, h200_copy

GQA_CAUSAL_128 = dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=32, S_q=128, S_kv=128)


def policy_of(*runs) -> dict:
    return build_policy(load_folders(runs))


def bucket(policy: dict, device: str = "synthetic CPU", **shape) -> dict:
    return policy["devices"][device]["buckets"][reader.bucket_key(**shape)]


def test_each_bucket_ranks_its_backends_with_margin_rule_and_evidence(tmp_path):
    """sdpa 1×, sdpa-math 1.5×, naive 3×, tight intervals: sdpa chosen, 50 % over sdpa-math, real by the rule, with its rows and runs."""
    policy = policy_of(grid_run(tmp_path / "run-a"))
    assert policy["schema_version"] == reader.SCHEMA_VERSION == 1
    entry = bucket(policy, **GQA_CAUSAL_128)
    assert entry["bucket"] == {"dtype": "fp32", "mode": "fwd", "causal": True, "variant": "plain", "d_k": 32, "group": 4, "batch": "dense",
                               "S_q_log2": 7, "S_kv_log2": 7}
    assert [r["backend"] for r in entry["ranking"]] == ["sdpa", "sdpa-math", "naive"]
    assert (entry["choice"], entry["runner_up"], entry["margin_real"]) == ("sdpa", "sdpa-math", True)
    assert math.isclose(entry["margin_pct"], 50.0, rel_tol=1e-6)
    # sdpa-math is the one SDPA kernel measured: its order is that kernel alone, in the form sdpa_kernel(..., set_priority=True) takes.
    assert entry["sdpa_kernel_order"] == ["MATH"] and entry["sdpa_kernel_call"] == "sdpa_kernel([SDPBackend.MATH], set_priority=True)"
    evidence = entry["evidence"]
    assert evidence["run_ids"] == ["run-a"] and evidence["commits"] == ["abc1234"] and evidence["libraries"] == {"torch": ["2.13.0"]}
    assert {(r["case"], r["backend"]) for r in evidence["rows"]} == {("B1-Sq128-Skv128-H8-Hkv2-dk32-fp32-causal", b) for b in ("sdpa", "sdpa-math", "naive")}
    assert len(policy["devices"]["synthetic CPU"]["buckets"]) == len(grid_cases())  # one case per bucket in this grid


@pytest.mark.parametrize("flag", list(UNTRUSTED_FLAGS))
def test_an_untrusted_row_never_decides(tmp_path, flag):
    """The fastest row flagged (contended, suspect, throttled, kernel_mismatch): the next backend is chosen, the row named as left out."""
    case = "B1-Sq128-Skv128-H8-Hkv2-dk32-fp32-causal"
    entry = bucket(policy_of(grid_run(tmp_path / "run-a", flags={(case, "sdpa"): flag})), **GQA_CAUSAL_128)
    assert entry["choice"] == "sdpa-math" and "sdpa" not in [r["backend"] for r in entry["ranking"]]
    assert entry["left_out"]["rows"] == 1 and entry["left_out"]["pairs"] == [[case, "sdpa"]] and entry["left_out"]["by_flag"][flag] == 1
    assert all(r["backend"] != "sdpa" for r in entry["evidence"]["rows"])


def test_a_disagreeing_or_failed_row_never_decides_and_a_bucket_without_answer_is_a_gap(tmp_path):
    """Every row of one case flagged: no answer, a gap saying why; the reader returns None there, never a guess."""
    case = "B1-Sq128-Skv128-H8-Hkv2-dk32-fp32-causal"
    run = grid_run(tmp_path / "run-a", flags={(case, b): "contended" for b in ("sdpa", "sdpa-math", "naive")})
    policy = policy_of(run)
    key = reader.bucket_key(**GQA_CAUSAL_128)
    assert key not in policy["devices"]["synthetic CPU"]["buckets"]
    gap = next(g for g in policy["devices"]["synthetic CPU"]["gaps"] if g["bucket"] == key)
    assert "contended" in gap["why"] and gap["cases"] == [case]
    assert reader.choose(policy, **GQA_CAUSAL_128) is None


def test_a_step_never_measured_is_a_gap_and_interpolated_only_when_asked(tmp_path):
    """S 128 and 512 measured, 256 not: listed as 'measure this'; --interpolate fills it from agreeing neighbours and says so."""
    run = grid_run(tmp_path / "run-a")
    at_256 = dict(GQA_CAUSAL_128, S_q=256, S_kv=300)
    plain = policy_of(run)
    gaps = {g["bucket"]: g for g in plain["devices"]["synthetic CPU"]["gaps"]}
    assert "never measured: measure this" in gaps[reader.bucket_key(**at_256)]["why"]
    assert reader.choose(plain, **at_256) is None
    filled = build_policy(load_folders([run]), interpolate=True)
    entry = bucket(filled, **at_256)
    assert entry["interpolated"] is True and entry["choice"] == "sdpa" and entry["evidence"]["rows"] == []
    assert reader.choose(filled, **at_256) == "sdpa"


def test_a_margin_inside_the_noise_is_not_called_real(tmp_path):
    """sdpa-math 2 % slower than sdpa with ±10 % intervals: sdpa still ranks first, but the margin is 'within noise', not real."""
    ms = {(c.id, "sdpa-math"): c.S_kv / 64 * 0.1 * 1.02 for c in grid_cases()}
    entry = bucket(policy_of(grid_run(tmp_path / "run-a", ms=ms, spread=0.1)), **GQA_CAUSAL_128)
    assert entry["choice"] == "sdpa" and entry["margin_real"] is False and entry["margin"].startswith("within noise")


def test_a_head_dim_never_measured_has_no_answer(tmp_path):
    """The reader answers from evidence only: d_k 64 was never measured, so None; another device, None."""
    policy = policy_of(grid_run(tmp_path / "run-a"))
    assert reader.choose(policy, **GQA_CAUSAL_128) == "sdpa"
    assert reader.choose(policy, **dict(GQA_CAUSAL_128, d_k=64)) is None
    assert reader.choose(policy, device="NVIDIA H100", **GQA_CAUSAL_128) is None
    assert reader.choose(policy, **dict(GQA_CAUSAL_128, sinks=True)) is None  # a variant is another problem


@needs_h200
def test_the_h200_slice_gives_the_fastest_trusted_backend_per_bucket_with_unknown_noise(tmp_path):
    """The real H200 run: each bucket's choice is its case's fastest ok, agreeing, unflagged core row (found here from the records
    themselves); the records carry no 95 % interval, so no margin is called real: 'unknown noise'."""
    policy = policy_of(h200_copy(tmp_path / "gpu-slice"))
    held = policy["devices"]["NVIDIA H200"]
    trusted = [r for r in h200_records() if r["status"] == "ok" and r["agree"] is True and r["backend"] != "projections"
               and not any(r.get(flag) is True for flag in UNTRUSTED_FLAGS)]
    cases = {r["case_id"] for r in trusted}
    assert len(held["buckets"]) == len(cases) == 12 and held["gaps"] == []
    for case in cases:
        rows = [r for r in trusted if r["case_id"] == case]
        fastest = min(rows, key=lambda r: r["latency_ms_median"])
        shape = {k: fastest[k] for k in ("dtype", "mode", "causal", "H", "H_kv", "d_k", "S_q", "S_kv")}
        entry = held["buckets"][reader.bucket_key(**shape)]
        assert entry["choice"] == fastest["backend"], case
        assert entry["margin_real"] is None and entry["margin"].startswith("unknown noise"), entry["margin"]
        kernels = [r["backend"] for r in sorted(rows, key=lambda r: r["latency_ms_median"]) if r["backend"].startswith("sdpa-")]
        assert entry["sdpa_kernel_order"] == [k.removeprefix("sdpa-").upper().replace("CUDNN", "CUDNN_ATTENTION").replace(
            "FLASH", "FLASH_ATTENTION").replace("EFFICIENT", "EFFICIENT_ATTENTION") for k in kernels]
        assert entry["evidence"]["libraries"]["torch"] == ["2.11.0+cu130"] and entry["evidence"]["run_ids"] == ["gpu-slice"]


def test_policy_command_writes_strict_json_and_refuses_bad_input(tmp_path, capsys):
    """`policy RUN --out FILE` writes the policy; no run, a file as a run, no --out, an --out over a user's file: one line, exit 2."""
    run = grid_run(tmp_path / "run-a")
    out = tmp_path / "policy.json"
    ran = attnbench_in_process(["policy", run, "--out", out], capsys)
    assert ran.code == 0, ran.err
    assert "synthetic CPU: 12 buckets answered (12 by a margin the rule calls real), 4 gaps, from runs run-a" in ran.out
    policy = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert reader.choose(policy, **GQA_CAUSAL_128) == "sdpa"
    again = attnbench_in_process(["policy", run, "--out", out], capsys)  # an earlier policy is replaced
    assert again.code == 0, again.err
    assert_one_line_error(attnbench_in_process(["policy", "--out", out], capsys), "give at least one run folder")
    assert_one_line_error(attnbench_in_process(["policy", out, "--out", tmp_path / "p2.json"], capsys), "is not a run folder")
    assert_one_line_error(attnbench_in_process(["policy", run], capsys), "--out FILE")
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "notes"}')
    assert_one_line_error(attnbench_in_process(["policy", run, "--out", mine], capsys), "not a policy attnbench wrote")
    assert mine.read_text() == '{"my": "notes"}'
