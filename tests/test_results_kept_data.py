"""Results are never lost (issue 46), classes 4 and 5: stored data that is wrong is one line naming the run, row and field, and
sizes and limits (a records file of NUL bytes, a timeout no driver can wait, a cut last record) are handled, never a traceback
or a file read whole into memory. Each input asserts the tree's bytes and the stored rows as tests/test_results_kept.py does.
"""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path

import pytest

from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.history_runs import (changed, database_of, edit_json, records_of, refused_untouched, run_folder, stored, with_samples,
                                write_records)
from tests.run_folders import BACKENDS, CASES, snapshot


# --- 4. stored data that is wrong ------------------------------------------------------------------------------------------

#: Each damage as SQL on the first run's stored data ({a}: its uuid), and the words its refusal names (the run, the row, the field).
WRONG_ROWS = {
    "a record that is a JSON list": ("""UPDATE "rows" SET record_json = '[1, 2]' WHERE run_uuid = '{a}' AND ordinal = 1""",
                                     ("run-a", "row 2", "record_json")),
    "a record whose status is a number": (
        """UPDATE "rows" SET record_json = json_set(record_json, '$.status', 7) WHERE run_uuid = '{a}' AND ordinal = 0""",
        ("run-a", "row 1", "'status'")),
    "a 95 % bound stored as text": ("""UPDATE "rows" SET latency_ms_ci95_low = 'quick' WHERE run_uuid = '{a}' AND ordinal = 3""",
                                    ("run-a", "row 4", "latency_ms_ci95_low")),
    "an agree flag its record does not say": ("""UPDATE "rows" SET agree = NOT agree WHERE run_uuid = '{a}' AND ordinal = 2""",
                                              ("run-a", "row 3", "'agree'")),
    "an environment that is a string": ("""UPDATE runs SET env_json = '"fast box"' WHERE run_uuid = '{a}'""", ("run-a", "env_json")),
    "peaks whose matmul is a number": ("""UPDATE runs SET peaks_json = '{{"matmul": 5}}' WHERE run_uuid = '{a}'""",
                                       ("run-a", "peaks_json", "matmul")),
    "a row count stored as text": ("""UPDATE runs SET "rows" = 'many' WHERE run_uuid = '{a}'""", ("run-a", "'rows'")),
    "the runs table dropped": ("DROP TABLE runs", ("damaged", "'runs'")),
    "a column of the rows table dropped": ('ALTER TABLE "rows" DROP COLUMN gbps', ("damaged", "'gbps'")),
}
#: Every (damage, reader) pair but `db list` of a row's damage (it reads no rows).
TAMPERED = [pytest.param(damage, words, command, id=f"{name}, {command}") for name, (damage, words) in WRONG_ROWS.items()
            for command in ("regress", "site", "db list") if not (command == "db list" and '"rows" SET' in damage)]


@pytest.mark.parametrize("damage, words, command", TAMPERED)
def test_a_tampered_database_is_one_line_naming_run_row_and_field(damage, words, command, tmp_path, capsys):
    """Rows changed inside the database: every reader refuses in one line naming the run (and row) and the field; nothing written."""
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    b = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    db = database_of(tmp_path, capsys, a, b)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(damage.format(a="a" * 32))
    finally:
        conn.close()
    argv = {"regress": ["regress"], "site": ["site", "--out", tmp_path / "site"], "db list": ["db", "list"]}[command]
    refused_untouched(tmp_path, [*argv, "--db", db], capsys, str(db), *words)


def _with_pair_specs(run: Path) -> list[dict]:
    """Give the run's manifest its pairs as data (what every run since pair_specs writes); return them."""
    specs = [{"case": case.fields(), "backend": backend} for case in CASES for backend in BACKENDS]
    edit_json(run / "manifest.json", pair_specs=specs)
    return specs


def _impossible_heads(specs):
    specs[0]["case"]["H_kv"] = 3  # H=2 query heads cannot share 3 key/value heads
    return ("pair_specs[0].case",)


def _infinite_softcap(specs):
    specs[1]["case"]["softcap"] = math.inf
    return ("pair_specs[1].case.softcap",)


def _negative_scale(specs):
    specs[2]["case"]["scale"] = -0.5
    return ("pair_specs[2].case", "scale")


def _pair_of_another_case(specs):
    specs[3]["case"]["S_q"] = 48
    return ("pair_specs[3]", "field 'pairs'")


IMPOSSIBLE = {"H_kv not dividing H": _impossible_heads, "an infinite softcap": _infinite_softcap, "a negative scale": _negative_scale,
              "a pair spec of another case than its key": _pair_of_another_case}
READERS = {"db add": lambda tmp, run: ["db", "add", run, "--db", tmp / "x.sqlite"],
           "export": lambda tmp, run: ["export", run, "--format", "pytest-benchmark", "--out", tmp / "x.json"],
           "report": lambda tmp, run: ["report", run, "--out", tmp / "reports"],
           "recommend": lambda tmp, run: ["recommend", run, "--seq", "16"]}


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@pytest.mark.parametrize("edit", IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
def test_a_manifest_edited_to_a_case_that_cannot_exist_is_refused_by_every_reader(edit, reader, tmp_path, capsys):
    """A pair spec edited to an impossible case: db add, export, report and recommend refuse it as resume does, naming the field."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    specs = _with_pair_specs(run)
    words = edit(specs)
    edit_json(run / "manifest.json", pair_specs=specs)
    refused_untouched(tmp_path, reader(tmp_path, run), capsys, "manifest.json", *words)


NON_FINITE = {"an infinite scale": ("scale", 0.25, math.inf), "a softcap of minus infinity": ("softcap", 30.0, -math.inf),
              "a NaN scale": ("scale", 0.5, math.nan)}


@pytest.mark.parametrize("reader", ["db add", "report", "export"])
@pytest.mark.parametrize("name, was, value", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_a_record_whose_variant_is_not_finite_is_refused_naming_the_field(name, was, value, reader, tmp_path, capsys):
    """A record of a case with a score variant, its value made non-finite by hand: every reader names the file, line and field
    (not a case id that no longer matches)."""
    from harness.suite.cases import Case

    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    case = Case(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=16, d_v=16, **{name: was})
    records = records_of(run)
    write_records(run, [*records[:2], {**records[2], **case.fields(), "case_id": case.id, name: value}, *records[3:]])
    argv = {"db add": ["db", "add", run, "--db", tmp_path / "x.sqlite"], "report": ["report", run, "--out", tmp_path / "reports"],
            "export": ["export", run, "--format", "flashinfer-bench", "--out", tmp_path / "t.jsonl"]}[reader]
    refused_untouched(tmp_path, argv, capsys, "records.jsonl:3", f"field {name!r}", "not a finite number")


@pytest.mark.slow
def test_a_run_folder_with_its_pairs_as_data_is_read_by_every_reader(tmp_path, capsys):
    """The valid manifest the table edits: every reader takes it (the refusals above are the edit's, not the fixture's)."""
    run = with_samples(run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"))
    _with_pair_specs(run)
    for reader in READERS.values():
        ran = attnbench_in_process(reader(tmp_path, run), capsys)
        assert ran.code in (0, 1) and not ran.err.startswith("attnbench: error"), ran


def test_a_run_folder_without_env_json_is_kept_as_an_unknown_device_and_said(tmp_path, capsys):
    """No env.json: the run is added (exit 0) under a device model saying it is unknown, with a warning; never as device 'cpu'."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    (run / "env.json").unlink()
    ran = attnbench_in_process(["db", "add", run, "--db", tmp_path / "x.sqlite"], capsys)
    assert ran.code == 0 and "no env.json" in ran.err and ran.err.startswith("warning:"), ran
    runs, _ = stored(tmp_path / "x.sqlite")
    assert [r[4] for r in runs] == ["unknown device (no env.json)"]


# --- 5. sizes and limits ----------------------------------------------------------------------------------------------------

def _nul_tail(run: Path, size: int, then: bytes = b"") -> None:
    """Two whole records, then `size` NUL bytes (a sparse hole: what a crash leaves of a preallocated file), then `then`."""
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    with open(run / "records.jsonl", "wb") as f:
        f.write(b"".join(lines[:2]))
        f.truncate(f.tell() + size)
        f.seek(0, os.SEEK_END)
        f.write(then)


#: More than a record may be (store.MAX_RECORD_BYTES), and four times the memory the reading may take.
NUL_BYTES = 80 * 2**20


def _nul_cut_tail(tmp, run):
    _nul_tail(run, NUL_BYTES)
    return ["db", "add", run, "--db", tmp / "x.sqlite"], 0, ("2 rows",)


def _nul_line_then_record(tmp, run):
    record = (run / "records.jsonl").read_bytes().splitlines(keepends=True)[2]
    _nul_tail(run, NUL_BYTES, b"\n" + record)
    return ["export", run, "--format", "pytest-benchmark", "--out", tmp / "b.json"], 2, ("records.jsonl:3", "corrupt record")


def _nul_tail_exported(tmp, run):
    _nul_tail(run, NUL_BYTES)
    return ["export", run, "--format", "flashinfer-bench", "--out", tmp / "t.jsonl"], 0, ("dropped a truncated last line",)


@pytest.mark.slow
@pytest.mark.parametrize("case", [_nul_cut_tail, _nul_line_then_record, _nul_tail_exported],
                         ids=["a cut tail of NUL bytes, db add", "a line of NUL bytes before a record, export", "a cut tail of NUL bytes, export"])
def test_a_records_file_of_nul_bytes_is_streamed_not_read_whole(case, tmp_path, capsys):
    """Hundreds of MB of NUL bytes in a records file: never held in memory (peak far below the file's size), and either the
    whole records before them are kept with a warning (a cut last line) or the line is refused by number."""
    import tracemalloc

    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    argv, code, words = case(tmp_path, run)
    out = argv[argv.index("--out") + 1] if "--out" in argv else argv[argv.index("--db") + 1]
    before = snapshot(tmp_path)
    tracemalloc.start()
    try:
        ran = attnbench_in_process(argv, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < NUL_BYTES / 4, peak
    if code == 2:
        assert_one_line_error(ran, *words)
        assert changed(before, snapshot(tmp_path)) == []
    else:
        assert ran.code == 0 and all(w in ran.out + ran.err for w in words), ran
        assert changed(before, snapshot(tmp_path), str(Path(out).relative_to(tmp_path))) == []


@pytest.mark.parametrize("value", ["1e400", "-inf", "Infinity", "1e12"])
@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_a_database_timeout_no_driver_can_wait_is_one_line(value, kind, tmp_path, capsys, monkeypatch):
    """ATTNBENCH_DB_TIMEOUT_S infinite or beyond a day: one line naming the variable, nothing created or connected to."""
    monkeypatch.setenv("ATTNBENCH_DB_TIMEOUT_S", value)
    target = f"postgresql://postgres@/attnbench?host={tmp_path}" if kind == "postgresql" else str(tmp_path / "x.sqlite")
    if kind == "postgresql":
        pytest.importorskip("psycopg")
    err = refused_untouched(tmp_path, ["db", "list", "--db", target] if kind == "postgresql" else
                            ["db", "add", run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00Z"), "--db", target],
                            capsys, "ATTNBENCH_DB_TIMEOUT_S", value)
    assert err.startswith("attnbench: error: ATTNBENCH_DB_TIMEOUT_S must be a number of seconds from 0 to"), err


@pytest.mark.parametrize("fmt", ["pytest-benchmark", "flashinfer-bench"])
def test_export_says_when_it_drops_a_cut_last_record(fmt, tmp_path, capsys):
    """A records file whose last record was cut mid-write (no NUL bytes): the export says so on stderr and counts one row less."""
    run = with_samples(run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"))
    raw = (run / "records.jsonl").read_bytes()
    (run / "records.jsonl").write_bytes(raw[:-40])
    ran = attnbench_in_process(["export", run, "--format", fmt, "--out", tmp_path / "out"], capsys)
    assert ran.code == 0 and "warning:" in ran.err and "dropped a truncated last line" in ran.err, ran
