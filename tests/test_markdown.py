"""`compare --md`, `regress --md` and `report --md`: GitHub-flavoured pipe tables whose verdict is the text's, on real-format runs."""

from __future__ import annotations

import gzip
import re
import shutil

import pytest

from harness import analysis
from harness.analysis.markdown import cell, table
from tests.cli_runs import attnbench_in_process, refused
from tests.h200_data import H200, needs_h200
from tests.history_runs import records_of, run_folder, write_records

#: A cell boundary: a `|` no backslash escapes.
_PIPE = re.compile(r"(?<!\\)\|")


def md_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table of `text`, as rows of cells; asserts each is one: a header row, a `---` separator, the same column count in every row."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            rows = []
            for row in block:
                assert row.endswith("|") and not row.endswith("\\|"), row
                rows.append([c.strip() for c in _PIPE.split(row)[1:-1]])
            header, separator, *body = rows
            assert all(re.fullmatch(r":?-{3,}:?", c) for c in separator), block
            assert all(h for h in header) and all(len(r) == len(header) for r in rows), block
            tables.append([header, *body])
            block = []
    return tables


def verdict_of(markdown: str) -> str:
    """The word after **Verdict: in the first verdict line."""
    return re.search(r"\*\*Verdict: ([^*]+)\*\*", markdown).group(1)


def test_a_cell_with_a_pipe_or_a_line_break_keeps_the_table_s_columns():
    """A backend named `a|b` (a plugin may) and a reason over two lines stay one cell each."""
    text = table(["backend", "why"], [("a|b", "one\nline"), ("c", "x | y | z")])
    rows = md_tables(text)[0]
    assert rows[1] == ["a\\|b", "one line"] and rows[2] == ["c", "x \\| y \\| z"]
    assert cell(None) == "" and cell("back\\slash") == "back\\\\slash"


@pytest.fixture()
def slower_pair(tmp_path):
    """Two runs of the tiny suite, the second's sdpa-math 30 % slower with tight intervals, naive unchanged."""
    return (run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"),
            run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00", slower={"sdpa-math": 1.3}))


def test_compare_md_says_what_the_text_says_as_tables(slower_pair, tmp_path, capsys):
    """The same exit, the same verdict and gate sentence as the text, per-backend geometric means and the failing rows as tables."""
    base, new = slower_pair
    gate = ["--fail-above", "5%", "--out", tmp_path / "c.csv"]
    text = attnbench_in_process(["compare", base, new, *gate], capsys)
    md = attnbench_in_process(["compare", base, new, *gate, "--md"], capsys)
    assert md.code == text.code == 1, md
    last = next(line for line in text.out.splitlines() if line.startswith("FAIL: "))
    assert verdict_of(md.out) == "FAIL" and last.split(": ", 1)[1] in md.out
    assert "judged: 4 of 4 pairs both runs measured were judged (100%)" in md.out and "not judged: 0" in md.out
    geomeans, regressions, *rest = md_tables(md.out)
    assert geomeans[0][:3] == ["backend", "cases", "geomean NEW/BASE"]
    assert {r[0]: r[2] for r in geomeans[1:]} == {"naive": "1.000", "sdpa-math": "1.300"}
    assert [(r[1], r[4], r[6]) for r in regressions[1:]] == [("sdpa-math", "1.300", "slower **FAIL**")] * 2
    assert rest == [] and "### Top improvements" in md.out and "None." in md.out  # nothing got faster: said, not an empty table


def test_compare_md_of_contended_rows_is_undecided_as_the_text_is(slower_pair, tmp_path, capsys):
    """Every NEW row contended: nothing judged, UNDECIDED and exit 3 in both layouts, the not-judged count said."""
    base, new = slower_pair
    write_records(new, [{**r, "contended": True} for r in records_of(new)])
    gate = ["--fail-above", "5%", "--out", tmp_path / "c.csv"]
    text = attnbench_in_process(["compare", base, new, *gate], capsys)
    md = attnbench_in_process(["compare", base, new, *gate, "--md"], capsys)
    assert md.code == text.code == 3 and verdict_of(md.out) == "UNDECIDED" and "UNDECIDED: not one of the 4 pairs" in text.out
    assert "not judged: 4" in md.out and "judged: 0 of 4" in md.out
    # No geometric mean over nothing judged, and no pair that was not judged listed as a regression or an improvement.
    assert md_tables(md.out) == [] and md.out.count("None.") == 2 and "Geometric mean" not in md.out


def test_compare_md_lists_a_pair_that_stopped_running_and_says_when_nothing_is_gated(slower_pair, tmp_path, capsys):
    """A pair NEW no longer holds fails the gate as the text says, listed with no ratio; without --fail-above the verdict says no gate."""
    base, new = slower_pair
    kept = records_of(new)
    write_records(new, [r for r in kept if not (r["backend"] == "naive" and r["case_id"].startswith("B1-Sq16-"))])
    gated = attnbench_in_process(["compare", base, new, "--fail-above", "50%", "--out", tmp_path / "c.csv", "--md"], capsys)
    assert gated.code == 1 and verdict_of(gated.out) == "FAIL", gated
    regressions = next(t for t in md_tables(gated.out) if t[0][-1] == "verdict")
    assert [(r[1], r[3], r[4], r[6]) for r in regressions[1:]] == [("naive", "", "", "missing in NEW **FAIL**"),
                                                                   ("sdpa-math", "1.3", "1.300", "slower"), ("sdpa-math", "1.3", "1.300", "slower")]
    plain = attnbench_in_process(["compare", base, new, "--out", tmp_path / "c.csv", "--md"], capsys)
    assert plain.code == 0 and verdict_of(plain.out) == "no gate" and "no --fail-above given" in plain.out


def test_compare_refuses_json_and_md_together(slower_pair, capsys):
    """Each is the whole of stdout: asking for both is one line."""
    refused(capsys, ["compare", *slower_pair, "--json", "--md"], ["--json or --md"])


def test_regress_md_has_regress_s_verdict_and_each_group_s_tables(slower_pair, tmp_path, capsys):
    """A database of the two runs: regress --md exits as regress does, says its FAIL line, and lays the group out as compare --md."""
    db = tmp_path / "h.sqlite"
    assert attnbench_in_process(["db", "add", *slower_pair, "--db", db], capsys).code == 0
    text = attnbench_in_process(["regress", "--db", db], capsys)
    md = attnbench_in_process(["regress", "--db", db, "--md"], capsys)
    assert md.code == text.code == 1
    closing = text.out.strip().splitlines()[-1]
    assert closing == "regress: FAIL in 1 group(s): suite tiny on synthetic CPU"
    assert verdict_of(md.out) == "FAIL" and closing.split(": ", 1)[1] in md.out
    assert "### suite tiny on synthetic CPU: `run-a`" in md.out and "`run-b`" in md.out
    geomeans, regressions = md_tables(md.out)
    assert [r[0] for r in geomeans[1:]] == ["naive", "sdpa-math"] and len(regressions) == 3


def test_regress_md_of_a_lone_run_is_undecided(tmp_path, capsys):
    """One run: no table, the group's line, UNDECIDED and exit 3, as the text."""
    db = tmp_path / "h.sqlite"
    assert attnbench_in_process(["db", "add", run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"), "--db", db], capsys).code == 0
    md = attnbench_in_process(["regress", "--db", db, "--md"], capsys)
    assert md.code == 3 and verdict_of(md.out) == "UNDECIDED" and md_tables(md.out) == []
    assert "only one run of suite tiny on synthetic CPU: nothing to compare" in md.out


@needs_h200
def test_report_md_of_the_real_h200_run_names_the_report_s_winners(tmp_path, capsys):
    """The real H200 slice: every winner the report computes is a row of the winners table (or counted past its top), as tables."""
    run = tmp_path / "h200"
    run.mkdir()
    for name in ("manifest.json", "env.json", "peaks.json"):
        if (H200 / name).exists():
            shutil.copy(H200 / name, run / name)
    with gzip.open(H200 / "records.jsonl.gz", "rb") as src, open(run / "records.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    ran = attnbench_in_process(["report", run, "--md", "--out", tmp_path / "reports"], capsys)
    assert ran.code == 0 and not (tmp_path / "reports").exists(), ran  # --md writes no page
    data = analysis.load([run])
    wins = analysis.winners(data.frame, analysis.default_baseline(data.frame) or "sdpa-math")
    cases = data.frame[analysis.is_core(data.frame)]["case_id"].nunique()
    assert f"**Answered: {wins['case_id'].nunique()} of {cases} cases**" in ran.out
    tables = md_tables(ran.out)
    per_backend = next(t for t in tables if t[0][0] == "backend")
    winners = next(t for t in tables if t[0][:2] == ["case", "winner"])
    assert sum(int(r[1]) for r in per_backend[1:]) == int((~wins["only_candidate"].astype(bool)).sum())
    shown = [(r[0], r[1]) for r in winners[1:]]
    expected = [(str(w.case), f"only candidate: {w.winner}" if w.only_candidate else str(w.winner)) for w in wins.head(len(shown)).itertuples()]
    assert shown == expected and (len(shown) == len(wins) or f"the first {len(shown)} of {len(wins)}" in ran.out)
    assert "NVIDIA H200" in ran.out
