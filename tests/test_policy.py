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


def test_validate_names_the_share_and_each_miss_on_another_run(tmp_path, capsys):
    """Run B: naive fastest in one case (a miss by the rule), sdpa-math 0.5 % faster inside ±1 % (a hit within noise), and sdpa-math
    faster where sdpa's row has no interval (a miss: noise unknown, never a hit by assumption). 10 of 12 judged."""
    cases = {c.id: c for c in grid_cases()}
    one, two, three = sorted(cases)[:3]
    base = {cid: c.S_kv / 64 * 0.1 for cid, c in cases.items()}
    ms = {(one, "naive"): base[one] * 0.5, (two, "sdpa-math"): base[two] * 0.995, (three, "sdpa-math"): base[three] * 0.9}
    a = grid_run(tmp_path / "run-a")
    b = grid_run(tmp_path / "run-b", ms=ms, no_interval=((three, "sdpa"),))
    ran = attnbench_in_process(["policy", a, "--validate", b], capsys)
    assert ran.code == 0, ran.err
    assert ("validation (run-b against the policy of run-a): the policy chose the fastest trusted row or one within the rule's noise "
            "of it in 10 of 12 judged cases (83.3 %): 9 the fastest, 1 within noise, 2 misses") in ran.out
    misses = [line for line in ran.out.splitlines() if line.startswith("  miss: ")]
    assert len(misses) == 2
    assert any(line.startswith(f"  miss: {one}: chose sdpa") and "fastest naive" in line and "slower by the rule" in line for line in misses)
    assert any(line.startswith(f"  miss: {three}: chose sdpa") and "noise unknown" in line for line in misses)


@pytest.mark.slow  # several runs loaded, one command each (seconds in all)
def test_leave_one_run_out_is_the_default_with_several_runs(tmp_path, capsys):
    """Three runs, --validate without RUN_B: each run judged by the policy of the other two, all cases counted together."""
    runs = [grid_run(tmp_path / f"run-{x}") for x in "abc"]
    ran = attnbench_in_process(["policy", *runs, "--validate"], capsys)
    assert ran.code == 0, ran.err
    assert ("validation (run-a against the policy of run-b, run-c; run-b against the policy of run-a, run-c; run-c against the policy "
            "of run-a, run-b): the policy chose the fastest trusted row or one within the rule's noise of it in 36 of 36 judged cases") in ran.out


@pytest.mark.slow  # several runs loaded, one command each (seconds in all)
def test_validate_refuses_another_device_a_run_it_was_built_from_and_a_lone_run(tmp_path, capsys):
    """A run of another device, a run the policy was built from, leave-one-run-out of one run: one line each, exit 2."""
    a = grid_run(tmp_path / "run-a")
    other = grid_run(tmp_path / "run-h100", device="NVIDIA H100")
    assert_one_line_error(attnbench_in_process(["policy", a, "--validate", other], capsys), "run-h100 ran on 'NVIDIA H100'",
                          "'synthetic CPU'", "same device")
    assert_one_line_error(attnbench_in_process(["policy", a, "--validate", a], capsys), "one the policy was built from")
    assert_one_line_error(attnbench_in_process(["policy", a, "--validate"], capsys), "two runs or more")
    assert_one_line_error(attnbench_in_process(["policy", a, "--validate", tmp_path / "nowhere"], capsys), "nowhere is not a run folder")


@pytest.mark.slow  # several runs loaded, one command each (seconds in all)
def test_a_policy_of_the_database_reads_its_current_runs(tmp_path, capsys):
    """`policy --db`: built from the database's runs as they are now; a run added later (sdpa-math now fastest at S 512) changes it."""
    from tests.history_runs import database_of

    faster_math = {(c.id, "sdpa-math"): c.S_kv / 64 * 0.1 * 0.5 for c in grid_cases() if c.S_kv == 512}
    first = grid_run(tmp_path / "run-a", created="2026-11-01T10:00:00+00:00")
    later = grid_run(tmp_path / "run-b", ms=faster_math, created="2026-11-02T10:00:00+00:00")
    db = database_of(tmp_path, capsys, first)
    at_512 = dict(GQA_CAUSAL_128, S_q=512, S_kv=512)
    out = tmp_path / "policy.json"
    assert attnbench_in_process(["policy", "--db", db, "--out", out], capsys).code == 0
    before = json.loads(out.read_text())
    assert before["source"] == {"db": str(db), "runs": ["run-a"]} and reader.choose(before, **at_512) == "sdpa"
    assert attnbench_in_process(["db", "add", later, "--db", db], capsys).code == 0
    assert attnbench_in_process(["policy", "--db", db, "--out", out], capsys).code == 0
    after = json.loads(out.read_text())
    assert after["source"]["runs"] == ["run-a", "run-b"] and reader.choose(after, **at_512) == "sdpa-math"
    assert bucket(after, **at_512)["evidence"]["run_ids"] == ["run-b"]
    assert reader.choose(after, **GQA_CAUSAL_128) == "sdpa"
    # A run named by id from the database, and one it does not hold.
    assert attnbench_in_process(["policy", "run-a", "--db", db, "--validate", "run-b"], capsys).code == 0
    assert_one_line_error(attnbench_in_process(["policy", "run-z", "--db", db, "--out", out], capsys), "holds no run 'run-z'")


def test_the_report_shows_the_policy_of_its_runs(tmp_path):
    """The report's policy section: a table per device, each bucket with its choice, margin and evidence, and the gaps."""
    from harness import analysis
    from harness.report.policy import policy_section

    section = policy_section(analysis.load([grid_run(tmp_path / "run-a")]))
    assert section.anchor == "policy"
    table = next(block for block in section.blocks if hasattr(block, "frame")).frame
    row = table[table["bucket"] == reader.bucket_key(**GQA_CAUSAL_128)].iloc[0]
    assert row["choice"] == "sdpa" and row["margin"].startswith("50.0 % over sdpa-math: real in 1 of 1 cases")
    assert row["evidence"] == "3 rows of 1 cases, runs run-a, commit abc1234" and row["SDPA kernel order"] == "MATH"
    gap = table[table["bucket"] == reader.bucket_key(**dict(GQA_CAUSAL_128, S_q=256, S_kv=256))].iloc[0]
    assert gap["choice"] == "no answer (gap)" and "never measured: measure this" in gap["evidence"]


@pytest.mark.slow
def test_the_site_shows_the_policy_of_the_database_runs_and_follows_new_runs(tmp_path, capsys):
    """The site's device page holds the policy of the database's runs; after a run is added, the site built again shows the new choice."""
    from tests.history_runs import database_of

    at_512 = reader.bucket_key(**dict(GQA_CAUSAL_128, S_q=512, S_kv=512))
    faster_math = {(c.id, "sdpa-math"): c.S_kv / 64 * 0.1 * 0.5 for c in grid_cases() if c.S_kv == 512}
    db = database_of(tmp_path, capsys, grid_run(tmp_path / "run-a", created="2026-11-01T10:00:00+00:00"))

    def policy_row() -> str:
        ran = attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys)
        assert ran.code == 0, ran.err
        page = (tmp_path / "site" / "trends" / "synthetic-CPU.html").read_text()
        assert '<section id="policy"><h2>Policy</h2>' in page
        return page.split(f"<td>{at_512}</td>", 1)[1].split("</tr>", 1)[0]

    assert policy_row().startswith("<td>sdpa</td>")
    later = grid_run(tmp_path / "run-b", ms=faster_math, created="2026-11-02T10:00:00+00:00")
    assert attnbench_in_process(["db", "add", later, "--db", db], capsys).code == 0
    row = policy_row()
    assert row.startswith("<td>sdpa-math</td>") and "runs run-b" in row


@pytest.mark.slow  # three commands, each loading two runs
def test_validate_allows_for_the_run_to_run_variation_it_is_given(tmp_path, capsys):
    """sdpa-math 3 % faster than sdpa in run B, ±1 % intervals: a miss by the rule; with --variation (CV 2.5 %, intervals widened by
    ±5 %) within noise, as compare --variation judges it. A variation of another device is refused."""
    from harness.analysis.difference import Variation

    case = "B1-Sq128-Skv128-H8-Hkv2-dk32-fp32-causal"
    a = grid_run(tmp_path / "run-a")
    b = grid_run(tmp_path / "run-b", ms={(case, "sdpa-math"): 0.2 * 0.97})
    medians = (1.0, 1.03, 0.97, 1.02, 0.98)
    variation = tmp_path / "stability.json"
    document = Variation(0.0, "cpu", "synthetic CPU", case, "sdpa", medians).to_dict()
    import statistics

    document["cv"] = statistics.stdev(medians) / statistics.fmean(medians)
    variation.write_text(json.dumps(document))
    plain = attnbench_in_process(["policy", a, "--validate", b], capsys)
    assert "11 of 12 judged cases" in plain.out and f"miss: {case}: chose sdpa" in plain.out
    widened = attnbench_in_process(["policy", a, "--validate", b, "--variation", variation], capsys)
    assert widened.code == 0, widened.err
    assert "run-to-run variation 2.55 %" in widened.out and "12 of 12 judged cases (100.0 %): 11 the fastest, 1 within noise" in widened.out
    variation.write_text(json.dumps(dict(document, device_name="another CPU")))
    assert_one_line_error(attnbench_in_process(["policy", a, "--validate", b, "--variation", variation], capsys), "measure the variation on the same device")


def test_serving_batches_are_bucketed_by_their_kind_and_layout(tmp_path):
    """A paged decode batch, a paged mixed batch and a packed prefill batch: three buckets, each named by layout and kind, and the
    reader finds each from the batch's longest lengths and its kind."""
    from harness.suite.batch_axes import ragged_case
    from tests.synthetic_runs import synthetic_record, write_run

    heads = {"H": 8, "H_kv": 2, "d_k": 16, "causal": True}
    batches = {"paged:decode": ragged_case("8x1@512", "paged", page_size=16, **heads),
               "paged:mixed": ragged_case("2x64 + 4x1@512", "paged", page_size=16, **heads),
               "packed:prefill": ragged_case("4x64", "packed", **heads)}
    records = [synthetic_record(case, backend, ms) for case in batches.values() for backend, ms in (("flex", 1.0), ("naive", 2.0))]
    run = write_run(tmp_path / "serving", records, capabilities={"flex": {"attention_core": True}, "naive": {"attention_core": True}})
    policy = policy_of(run)
    held = policy["devices"]["synthetic CPU"]["buckets"]
    assert sorted(e["bucket"]["batch"] for e in held.values()) == sorted(batches)
    for kind, case in batches.items():
        layout, batch_kind = kind.split(":")
        shape = dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=16, S_q=case.S_q, S_kv=case.S_kv, layout=layout)
        assert reader.choose(policy, **shape, kind=batch_kind) == "flex", kind
    assert reader.choose(policy, dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=16, S_q=1, S_kv=512) is None  # dense: not measured


def test_a_backend_left_alone_by_its_rivals_flags_is_no_answer(tmp_path):
    """sdpa and naive flagged in a case, sdpa-math alone trusted: not an answer by elimination but a gap saying to re-measure;
    a backend alone because the others are unsupported stays the answer, marked 'only candidate'."""
    case = "B1-Sq128-Skv128-H8-Hkv2-dk32-fp32-causal"
    policy = policy_of(grid_run(tmp_path / "run-a", flags={(case, "sdpa"): "contended", (case, "naive"): "suspect"}))
    gap = next(g for g in policy["devices"]["synthetic CPU"]["gaps"] if g["bucket"] == reader.bucket_key(**GQA_CAUSAL_128))
    assert "only sdpa-math has a trusted row; naive, sdpa ran and agreed but every row was flagged" in gap["why"]
    assert reader.choose(policy, **GQA_CAUSAL_128) is None
    from harness.suite.cases import Case
    from tests.synthetic_runs import synthetic_record, write_run

    lone = Case(B=1, S_q=128, S_kv=128, H=8, H_kv=2, d_k=32, d_v=32, causal=True, sinks=True)
    run = write_run(tmp_path / "sinks", [synthetic_record(lone, "naive", 1.0), synthetic_record(lone, "sdpa", 0, status="unsupported")])
    entry = bucket(policy_of(run), **GQA_CAUSAL_128, sinks=True)
    assert entry["choice"] == "naive" and entry["only_candidate"] is True and entry["margin"].startswith("only candidate")
