"""Contended and suspect rows never decide an answer: winners, recommend, compare and its gate, the report's tables.

Each test builds runs whose fastest (or regressed) row is contended or suspect, the way a shared machine leaves
them (the same pair measured 6.75 ms quiet and 11–17 ms contended), and asserts the answer comes from the rows
measured quietly, and that the command says how many rows it left out and why.
"""

from __future__ import annotations

import json

import pytest

from harness import analysis
from harness.analysis.compare import NOT_JUDGED, compare_runs
from harness.cli.main import main
from harness.report import build_report
from harness.suite.cases import Case
from tests.synthetic_runs import PEAKS, frame_of, synthetic_record, write_run

CASE = Case(B=1, S_q=256, S_kv=256, H=32, H_kv=8, d_k=128, d_v=128)


def flagged(backend: str, ms: float, *, contended: bool = False, suspect: bool = False, case: Case = CASE, run_id: str = "synthetic"):
    """A synthetic agreeing row carrying the flags a shared machine sets."""
    record = synthetic_record(case, backend, ms, run_id=run_id)
    record.contended, record.suspect = contended, suspect
    return record


def shared_box_rows(case: Case = CASE, run_id: str = "synthetic"):
    """sdpa measured contended at 11.09 ms, naive suspect at 5 ms, and the quiet rows: sdpa-flash 7.0, sdpa-math 9.0."""
    return [flagged("sdpa-flash", 7.0, case=case, run_id=run_id), flagged("sdpa-math", 9.0, case=case, run_id=run_id),
            flagged("naive", 5.0, suspect=True, case=case, run_id=run_id), flagged("sdpa", 4.0, contended=True, case=case, run_id=run_id)]


def test_winners_choose_among_quiet_rows_and_count_what_they_left_out():
    wins = analysis.winners(frame_of(shared_box_rows()))
    (row,) = wins.to_dict("records")
    # The two fastest rows are flagged: on the old code sdpa (contended, 4 ms) won and naive was its runner-up.
    assert (row["winner"], row["runner_up"], row["candidates"], row["left_out"]) == ("sdpa-flash", "sdpa-math", 2, 2)
    assert row["runner_up_ratio"] == 9.0 / 7.0
    gone = analysis.left_out(analysis.agreeing_rows(frame_of(shared_box_rows()), flagged=True))
    assert gone.rows == 2 and dict(gone.counts) == {"contended": 1, "suspect": 1}
    assert "2 measured rows left out of this answer: 1 contended (another process took the CPU or the GPU" in gone.sentence()


def test_a_case_whose_every_agreeing_row_is_flagged_has_no_winner_and_fits_skip_flagged_rows():
    only_flagged = [flagged("sdpa", 4.0, contended=True), flagged("naive", 5.0, suspect=True)]
    assert analysis.winners(frame_of(only_flagged)).empty
    rows = [flagged("sdpa", 1.0 * s / 128, contended=s == 512, case=Case(B=1, S_q=s, S_kv=s, H=8, H_kv=8, d_k=64, d_v=64))
            for s in (128, 256, 512, 1024)]
    fits = analysis.scaling_fits(frame_of(rows))
    assert int(fits["n_latency"].iloc[0]) == 3 and fits["S_values"].iloc[0] == "128,256,1024"  # the contended S=512 row is no point


def test_recommend_answers_from_quiet_rows_names_what_it_left_out_and_prints_json(tmp_path, capsys):
    run = write_run(tmp_path / "run", shared_box_rows(), peaks=PEAKS)
    assert main(["recommend", str(run), "--seq", "256"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    # Not "sdpa (4 ms), 25.0% faster than the runner-up naive": both are flagged.
    assert first.startswith(f"best for {CASE.id}: sdpa-flash (7 ms); the runner-up sdpa-math takes 1.29× the time"), first
    assert "2 measured rows left out of this answer: 1 contended" in out and "1 suspect" in out
    assert "contended (left out)" in out and "suspect (left out)" in out
    assert main(["recommend", str(run), "--seq", "256", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] == "sdpa-flash" and doc["left_out"]["rows"] == 2 and doc["left_out"]["by_flag"] == {"contended": 1, "suspect": 1}
    (case,) = doc["cases"]
    assert case["winner"] == "sdpa-flash" and case["runner_up"] == "sdpa-math"
    assert {r["backend"]: r["flags"] for r in case["rows"]} == {"sdpa-flash": [], "sdpa-math": [], "naive": ["suspect"], "sdpa": ["contended"]}


def test_recommend_with_only_flagged_rows_gives_no_answer_and_exit_1(tmp_path, capsys):
    run = write_run(tmp_path / "run", [flagged("sdpa", 4.0, contended=True), flagged("naive", 5.0, suspect=True)], peaks=PEAKS)
    assert main(["recommend", str(run), "--seq", "256"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no answer: rows agreed but were contended or suspect: all 2 rows that ran and agreed")


def test_recommend_gives_one_answer_over_several_shapes_first(tmp_path, capsys):
    records = []
    for b, (flash, math_) in zip((1, 4), ((1.0, 2.0), (3.0, 3.3))):
        case = Case(B=b, S_q=256, S_kv=256, H=8, H_kv=8, d_k=64, d_v=64)
        records += [flagged("sdpa-flash", flash, case=case), flagged("sdpa-math", math_, case=case), flagged("naive", 0.5, contended=True, case=case)]
    run = write_run(tmp_path / "run", records, peaks=PEAKS)
    assert main(["recommend", str(run), "--seq", "256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Before: one answer per case, and no answer to the question asked.
    assert lines[0] == ("best over the 2 matching problems: sdpa-flash (geometric mean 1.00× the fastest time per problem; "
                        "fastest in 2 of the 2 problems another option ran too); then sdpa-math 1.48×; "
                        "faster in some problem but left out: naive (contended)")
    assert lines[1].strip().startswith("2 measured rows left out of this answer: 2 contended")
    assert lines[2] == "per case (2):" and sum(line.startswith("B") for line in lines) == 2


def test_compare_of_the_same_code_does_not_judge_or_gate_on_a_contended_row(tmp_path, capsys):
    cases = [Case(B=1, S_q=s, S_kv=s, H=8, H_kv=8, d_k=64, d_v=64) for s in (128, 256, 512)]
    base = write_run(tmp_path / "base", [flagged("sdpa", 1.0, case=c, run_id="base") for c in cases])
    # The same code again; the second pair ran beside other work: 60 % slower, contended; the third suspect.
    new = write_run(tmp_path / "new", [flagged("sdpa", 1.0, case=cases[0], run_id="new"), flagged("sdpa", 1.6, contended=True, case=cases[1], run_id="new"),
                                       flagged("sdpa", 1.3, suspect=True, case=cases[2], run_id="new")])
    result = compare_runs(base, new, threshold=0.05)
    assert not result.failed  # on the old code: FAIL on the contended row
    verdicts = dict(zip(result.table["case_id"], result.table["verdict"]))
    assert verdicts[cases[1].id] == f"{NOT_JUDGED}: contended in NEW" and verdicts[cases[2].id] == f"{NOT_JUDGED}: suspect in NEW"
    assert result.summary["cases"].tolist() == [1]  # the geometric mean is over the judged pair only
    out_csv = tmp_path / "cmp.csv"
    # One judged pair of three is under the default --min-judged (50 %): asked for one, the gate passes on it.
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--min-judged", "1", "--out", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "2 rows not judged: a side was contended, suspect or throttled" in text and "ok: no row of the 1 judged slower" in text
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--min-judged", "1", "--out", str(out_csv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] is False and doc["not_judged"] == 2 and len(doc["rows"]) == 3 and doc["csv"] == str(out_csv)


def test_a_gate_that_could_judge_no_pair_says_undecided_and_exits_3(tmp_path, capsys):
    base = write_run(tmp_path / "base", [flagged("sdpa", 1.0, contended=True, run_id="base")])
    new = write_run(tmp_path / "new", [flagged("sdpa", 2.0, contended=True, run_id="new")])
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(tmp_path / "c.csv")]) == 3
    assert "UNDECIDED: not one of the 1 pairs both runs measured could be judged" in capsys.readouterr().out
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv")]) == 0  # no gate asked: nothing to decide


def test_compare_still_gates_on_a_quiet_regression_and_sizes_its_case_column(tmp_path, capsys):
    case = Case(B=34, S_q=2048, S_kv=2048, H=8, H_kv=2, d_k=64, d_v=64, dtype="bf16")
    base = write_run(tmp_path / "base", [flagged("flashinfer-paged-long-name", 1.0, case=case, run_id="base")])
    new = write_run(tmp_path / "new", [flagged("flashinfer-paged-long-name", 1.5, case=case, run_id="new")])
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(tmp_path / "c.csv")]) == 1
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("case"))
    row = next(line for line in lines if line.startswith(case.id))
    # Every column starts where its header does, whatever the id's length (a fixed 48-character column broke here).
    assert header.index("backend") == row.index("flashinfer-paged-long-name") and header.index("verdict") == row.index("slower")


@pytest.mark.e2e
def test_the_report_leaves_flagged_rows_out_of_its_choices_and_lists_them_as_flags(tmp_path):
    run = write_run(tmp_path / "results" / "run", shared_box_rows(), peaks=PEAKS)
    page = build_report([run], out_root=tmp_path / "reports").read_text()
    assert "2 measured rows left out of every winner, recommendation, speed-up, fit and crossover on this page" in page
    # The Sample flags section no longer says "No measured row carries a flag" beside that warning.
    assert "No measured row carries a flag" not in page and "2 of 4 measured rows carry a flag" in page
    winners_csv = (tmp_path / "reports" / "run" / "winners.csv").read_text()
    assert "sdpa-flash" in winners_csv.splitlines()[1]


@pytest.mark.slow
def test_a_report_over_two_runs_uses_the_quiet_repeat_and_lists_every_runs_row(tmp_path):
    quiet = write_run(tmp_path / "results" / "quiet", [flagged("sdpa", 7.0, run_id="quiet"), flagged("naive", 9.0, run_id="quiet")], peaks=PEAKS)
    busy = write_run(tmp_path / "results" / "busy", [flagged("sdpa", 15.0, contended=True, run_id="busy")], peaks=PEAKS)
    data = analysis.load([quiet, busy])
    # The run given last is contended: its row no longer replaces the quiet one (it did: "the row of the run given last is used").
    assert data.frame.loc[data.frame["backend"] == "sdpa", "latency_ms_median"].item() == 7.0
    assert sorted(zip(data.repeated["run_id"], data.repeated["run_used"])) == [("busy", False), ("quiet", True)]
    page = build_report([quiet, busy], out_root=tmp_path / "reports").read_text()
    assert '<section id="repeats">' in page
    (csv,) = (tmp_path / "reports").glob("*/repeated_pairs.csv")
    assert {line.split(",")[2] for line in csv.read_text().splitlines()[1:]} == {"quiet", "busy"}


def test_the_serving_winners_text_states_the_rule_in_use():
    from harness.report.serving import WINNERS

    words = " ".join(str(part) for part in vars(WINNERS).values() if isinstance(part, str))
    assert "p20–p80" not in words and "95 % intervals of the median overlap" in words
