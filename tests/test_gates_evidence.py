"""A gate passes only on enough evidence: `compare`/`regress` `--min-judged`, runs that share no case, and throttled rows.

`regress` exited 0 with 2 of 18 rows judged; `compare` of two runs that share no case printed "FAIL: 18 rows slower";
a GPU row whose clock sagged still decided winners and gates.
"""

from __future__ import annotations

import pytest

from harness import analysis
from harness.analysis.compare import MinJudged, compare_runs, parse_min_judged
from harness.cli.main import main
from harness.errors import UserError
from harness.suite.cases import Case
from harness.telemetry.gpu_state import THROTTLED_SHARE, GpuReading, summarize
from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.history_runs import run_folder
from tests.synthetic_runs import frame_of, synthetic_record, write_run

CASES = [Case(B=1, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64) for S in (128, 256, 512, 1024, 2048)]
H200_MAX_MHZ = 1980


def _rows(run_id: str, ms: float, *, contended_from: int = 99, cases=CASES):
    """One sdpa row per case at `ms`; the rows from index `contended_from` on are contended."""
    rows = []
    for i, case in enumerate(cases):
        row = synthetic_record(case, "sdpa", ms, run_id=run_id)
        row.contended = i >= contended_from
        rows.append(row)
    return rows


def test_a_gate_on_one_judged_pair_of_five_is_undecided_with_the_share(tmp_path, capsys):
    # One quiet pair, four contended in NEW: nothing slower among the one judged. It passed (exit 0) before.
    base = write_run(tmp_path / "base", _rows("base", 1.0))
    new = write_run(tmp_path / "new", _rows("new", 1.0, contended_from=1))
    out = ["--out", str(tmp_path / "c.csv")]
    assert main(["compare", str(base), str(new), "--fail-above", "5%", *out]) == 3
    text = capsys.readouterr().out
    assert "UNDECIDED: only 1 of 5 pairs both runs measured were judged (20%), under --min-judged 50%" in text
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--min-judged", "1", *out]) == 0
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--min-judged", "20%", *out]) == 0
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--min-judged", "21%", *out]) == 3


def test_a_judged_regression_still_fails_whatever_the_share(tmp_path, capsys):
    base = write_run(tmp_path / "base", _rows("base", 1.0))
    new = write_run(tmp_path / "new", [_rows("new", 1.5)[0], *_rows("new", 1.0, contended_from=1)[1:]])
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(tmp_path / "c.csv")]) == 1
    assert "FAIL: 1 of the 1 judged rows slower" in capsys.readouterr().out


def test_runs_that_share_no_case_are_undecided_not_a_list_of_slower_rows(tmp_path, capsys):
    other = [Case(B=2, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64) for S in (128, 256)]
    base = write_run(tmp_path / "base", _rows("base", 1.0))
    new = write_run(tmp_path / "new", _rows("new", 1.0, cases=other))
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(tmp_path / "c.csv")]) == 3
    out = capsys.readouterr().out
    assert "UNDECIDED: base and new share no case (base: 5 cases, new: 2): nothing to compare" in out and "FAIL" not in out
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "c.csv")]) == 3  # no gate asked: still nothing compared
    result = compare_runs(base, new, 0.05)
    assert result.disjoint and not result.failed and result.undecided


@pytest.mark.parametrize("text", ["-1", "abc", "150%", "1.5", "%"])
def test_a_bad_min_judged_is_one_line(tmp_path, capsys, text):
    base = write_run(tmp_path / "base", _rows("base", 1.0))
    ran = attnbench_in_process(["compare", base, base, "--fail-above", "5%", "--min-judged", text, "--out", tmp_path / "c.csv"], capsys)
    assert_one_line_error(ran, "--min-judged takes a count like 10 or a share from 0% to 100%")


def test_min_judged_parses_a_count_or_a_share():
    assert parse_min_judged("10") == MinJudged(count=10) and parse_min_judged(" 50% ") == MinJudged(share=0.5)
    assert MinJudged(share=0.5).required(18) == 9 and MinJudged(share=0.5).required(5) == 3 and MinJudged(count=4).required(18) == 4
    with pytest.raises(UserError):
        parse_min_judged("2.5")


def test_regress_refuses_to_pass_on_a_small_share_of_judged_rows(tmp_path, capsys):
    # make_run's tiny suite: 4 pairs; in the newer run three are contended, one is judged and not slower. It exited 0.
    db = str(tmp_path / "db.sqlite")
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    b = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    lines = (b / "records.jsonl").read_text().splitlines()
    import json

    rows = [json.loads(line) for line in lines]
    for row in rows[1:]:
        row["contended"] = True
    (b / "records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert attnbench_in_process(["db", "add", a, b, "--db", db], capsys).code == 0
    ran = attnbench_in_process(["regress", "--db", db], capsys)
    assert ran.code == 3, ran
    assert "regress: UNDECIDED in 1 group(s) (--min-judged 50%): suite tiny on synthetic CPU (1 of 4 pairs both runs measured were judged (25%))" in ran.out
    assert attnbench_in_process(["regress", "--db", db, "--min-judged", "1"], capsys).code == 0


# -- throttled rows ---------------------------------------------------------------------------------------------------

def test_a_clock_below_the_sustained_one_in_a_tenth_of_the_readings_marks_the_row_throttled_and_a_brief_dip_does_not():
    full, sagged = GpuReading(H200_MAX_MHZ, 3201, 50, 600.0, 0), GpuReading(1500, 3201, 50, 600.0, 0)
    brief = summarize([sagged] + [full] * 19, H200_MAX_MHZ)  # one reading in 20: a clock still ramping as the window opened
    assert brief.throttled is False and "in 1 of 20 readings" in brief.throttle_reason
    held = summarize([sagged] * 2 + [full] * 18, H200_MAX_MHZ)
    assert THROTTLED_SHARE == 0.1 and held.throttled is True and "SM clock fell to 1500 MHz" in held.throttle_reason
    power = [GpuReading(H200_MAX_MHZ, 3201, 50, 700.0, 0x4)] * 3 + [full] * 17  # SW power cap in 3 of 20 readings
    assert summarize(power, H200_MAX_MHZ).throttled is True


def _throttled(backend: str, ms: float, throttled: bool, run_id: str = "synthetic", case: Case = CASES[0]):
    row = synthetic_record(case, backend, ms, run_id=run_id)
    row.throttled = throttled
    return row


def test_a_throttled_row_decides_no_winner_and_no_gate(tmp_path, capsys):
    wins = analysis.winners(frame_of([_throttled("sdpa-cudnn", 0.4, True), _throttled("sdpa-flash", 0.5, False)]))
    (row,) = wins.to_dict("records")
    assert row["winner"] == "sdpa-flash" and row["left_out"] == 1  # the throttled, faster row won before
    gone = analysis.left_out(analysis.agreeing_rows(frame_of([_throttled("sdpa-cudnn", 0.4, True)]), flagged=True))
    assert dict(gone.counts)["throttled"] == 1 and "run --cooldown" in gone.sentence()
    base = write_run(tmp_path / "base", [_throttled("sdpa", 1.0, False, "base")])
    new = write_run(tmp_path / "new", [_throttled("sdpa", 2.0, True, "new")])
    assert main(["compare", str(base), str(new), "--fail-above", "5%", "--out", str(tmp_path / "c.csv")]) == 3
    assert "not judged: throttled in NEW" in capsys.readouterr().out
