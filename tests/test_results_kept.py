"""Results are never lost (issue 46): the results database, the site and the exports refuse what would replace, overwrite or
corrupt what a user keeps, and bad stored data is one line.

One table per class of bad input. Every input runs in process through the CLI (`harness.cli.main.main`), and each asserts
that nothing outside the output it names was written (every file under the test's folder, hashed before and after), that no
stored row was lost or changed (the database's tables, read raw), and that a refusal is one `attnbench: error:` line with exit
2, a valid-but-odd input exit 0 with a sane result. The PostgreSQL concurrency table is in tests/test_history_postgres.py.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path

import pytest

from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.history_runs import run_folder
from tests.run_folders import BACKENDS, CASES, snapshot


def stored(db: Path) -> tuple[list, list]:
    """Every run and every row the SQLite database holds, read raw (no attnbench code between)."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return (conn.execute("SELECT * FROM runs ORDER BY run_uuid").fetchall(),
                conn.execute('SELECT * FROM "rows" ORDER BY run_uuid, ordinal').fetchall())
    finally:
        conn.close()


def records_of(run: Path) -> list[dict]:
    """The run folder's records, parsed."""
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def write_records(run: Path, records: list[dict]) -> None:
    """Replace the run folder's records (a hand edit)."""
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_json(path: Path, **changes) -> None:
    """Change top-level fields of a JSON document in place."""
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def changed(before: dict[str, str], after: dict[str, str], *allowed: str) -> list[str]:
    """The entries of the tree that differ, but those under `allowed` (relative paths)."""
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k) and not any(k == a or k.startswith(a + "/") for a in allowed))


def refused_untouched(tmp_path: Path, argv: list, capsys, *words: str, db: Path | None = None) -> str:
    """Run ARGV; assert a one-line refusal naming WORDS, the tree's bytes unchanged and (with `db`) every stored row kept."""
    rows_before = stored(db) if db is not None else None
    before = snapshot(tmp_path)
    err = assert_one_line_error(attnbench_in_process(argv, capsys), *words)
    assert changed(before, snapshot(tmp_path)) == []
    if db is not None:
        assert stored(db) == rows_before
    return err


def with_samples(run: Path) -> Path:
    """Give each record raw per-call samples around its median (what an export needs); the run folder."""
    write_records(run, [{**r, "sample_ms": [r["latency_ms_median"] * f for f in (0.99, 1.0, 1.01)]} for r in records_of(run)])
    return run


def database_of(tmp_path: Path, capsys, *runs: Path) -> Path:
    """A results database (SQLite) holding `runs`."""
    db = tmp_path / "team.sqlite"
    ran = attnbench_in_process(["db", "add", *runs, "--db", db], capsys)
    assert ran.code == 0, ran
    return db


# --- 1. a stored run replaced by a lesser copy --------------------------------------------------------------------------

def _drop_first_row(run):
    write_records(run, records_of(run)[1:])


def _swap_rows(run):
    r = records_of(run)
    write_records(run, [r[1], r[0], *r[2:]])


def _slower_row(run):
    r = records_of(run)
    r[2]["latency_ms_median"] *= 0.5
    write_records(run, r)


def _replace_a_row_and_append(run):
    r = records_of(run)
    write_records(run, [*r[:-1], r[0], r[-1]])  # a row inserted before the last: the stored rows are no longer its first ones


def _backends_edited(run):
    edit_json(run / "manifest.json", backends=["naive"])


def _other_env(run):
    edit_json(run / "env.json", before={"device_type": "cpu", "device_name": "another CPU", "torch": "2.y"})


def _no_records(run):
    (run / "records.jsonl").write_text("")


def _attempts_rewritten(run):
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-09T00:00:00Z", "wall_s": 9.0}])


LESSER_COPIES = {
    "the first row gone": _drop_first_row,
    "two rows swapped": _swap_rows,
    "a median halved by hand": _slower_row,
    "a row inserted before the last": _replace_a_row_and_append,
    "its manifest's backends edited": _backends_edited,
    "the same rows, another env.json": _other_env,
    "its records file emptied": _no_records,
    "an attempt the stored run never had, in place of its own": _attempts_rewritten,
}


@pytest.mark.parametrize("edit", LESSER_COPIES.values(), ids=LESSER_COPIES.keys())
def test_a_stored_run_is_not_replaced_by_a_copy_that_is_not_a_later_state_of_it(edit, tmp_path, capsys):
    """A folder of a stored run's uuid whose content is not the stored run plus appended rows: refused in one line offering
    --replace, the stored rows as they were; a new run given beside it is not added either."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0}])
    db = database_of(tmp_path, capsys, run)
    edit(run)
    other = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    refused_untouched(tmp_path, ["db", "add", other, run, "--db", db], capsys, "already holds run run-a", "not a later state",
                      "--replace", db=db)


def _resumed(run):
    r = records_of(run)
    write_records(run, [*r, {**r[0], "latency_ms_median": r[0]["latency_ms_median"] * 1.01}])
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0},
                                                {"started_utc": "2026-11-03T10:00:00Z", "wall_s": 1.0}])


def _resumed_with_nothing_left(run):
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0},
                                                {"started_utc": "2026-11-03T10:00:00Z", "wall_s": 0.2}])
    edit_json(run / "env.json", telemetry_after={"reason": "no GPU"})


LATER_STATES = {"resumed: a row and an attempt appended": (_resumed, 5, "updated run-a"),
                "resumed with nothing left to run: an attempt appended": (_resumed_with_nothing_left, 4, "updated run-a")}


@pytest.mark.parametrize("edit, rows, said", LATER_STATES.values(), ids=LATER_STATES.keys())
def test_a_later_state_of_a_stored_run_replaces_it(edit, rows, said, tmp_path, capsys):
    """What a resume leaves (rows and attempts appended, the stored ones unchanged): exit 0, the run's rows replaced, the stored
    ones kept as the first of them; nothing written but the database."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0}])
    db = database_of(tmp_path, capsys, run)
    _, old_rows = stored(db)
    edit(run)
    before = snapshot(tmp_path)
    ran = attnbench_in_process(["db", "add", run, "--db", db], capsys)
    assert ran.code == 0 and ran.out.startswith(said), ran
    assert changed(before, snapshot(tmp_path), db.name) == []
    _, new_rows = stored(db)
    assert len(new_rows) == rows and new_rows[:len(old_rows)] == old_rows


def test_replace_is_the_explicit_way_to_store_an_earlier_copy(tmp_path, capsys):
    """--replace stores the copy given, whatever it is, and says so."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    _drop_first_row(run)
    ran = attnbench_in_process(["db", "add", run, "--db", db, "--replace"], capsys)
    assert ran.code == 0 and ran.out.startswith("replaced run-a") and "--replace" in ran.out, ran
    assert len(stored(db)[1]) == 3


# --- 2. outputs written where the user did not ask ------------------------------------------------------------------------

def _user_folder(tmp, run):
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.md").write_text("my notes\n")
    return ["site", "--out", tmp / "mine"], ("exists and is not a site",)


def _inside_run(tmp, run):
    return ["site", "--out", run / "site"], ("inside the run folder",)


def _the_run_itself(tmp, run):
    return ["site", "--out", run], ("inside the run folder",)


def _a_file(tmp, run):
    (tmp / "site.tar").write_bytes(b"not a folder")
    return ["site", "--out", tmp / "site.tar"], ("not a plain folder",)


def _under_a_file(tmp, run):
    (tmp / "plain").write_text("x")
    return ["site", "--out", tmp / "plain" / "site"], ("cannot write",)


def _a_link(tmp, run):
    (tmp / "real").mkdir()
    (tmp / "linked").symlink_to(tmp / "real")
    return ["site", "--out", tmp / "linked"], ("not a plain folder",)


def _site_with_a_user_file(tmp, run):
    site = tmp / "old-site"
    site.mkdir()
    (site / "index.html").write_text("<!DOCTYPE html><html><head><title>attnbench site</title></head></html>")
    (site / "budget.xlsx").write_bytes(b"kept")
    return ["site", "--out", site], ("exists and is not a site",)


def _missing_db(tmp, run):
    return ["site", "--db", tmp / "nowhere.sqlite", "--out", tmp / "fresh"], ("no results database at",)


def _db_inside_out(tmp, run):
    site = tmp / "old-site"
    (site / "csv").mkdir(parents=True)
    (site / "index.html").write_text("<!DOCTYPE html><html><head><title>attnbench site</title></head></html>")
    os.replace(tmp / "team.sqlite", site / "csv" / "team.sqlite")  # the team's database, kept in the site it publishes
    return ["site", "--out", site, "--db", site / "csv" / "team.sqlite"], ("lies inside --out",)


def _db_add_in_run(tmp, run):
    return ["db", "add", run, "--db", run / "kept.sqlite"], ("inside the run folder",)


def _db_add_below_run(tmp, run):
    return ["db", "add", run, "--db", run / "deeper" / "kept.sqlite"], ("inside the run folder",)


def _export_in_run(tmp, run):
    return ["export", run, "--format", "flashinfer-bench", "--out", run / "sub" / "traces.jsonl"], ("inside the run folder",)


UNASKED = {"site into a user's folder": _user_folder, "site into a run folder": _inside_run, "site as a run folder": _the_run_itself,
           "site onto a file": _a_file, "site under a file": _under_a_file, "site through a symbolic link": _a_link,
           "site over an earlier site holding a user's file": _site_with_a_user_file, "site of a missing database": _missing_db,
           "site over the folder holding its database": _db_inside_out, "db add into a run folder": _db_add_in_run,
           "db add below a run folder": _db_add_below_run, "export below a run folder": _export_in_run}


@pytest.mark.parametrize("case", UNASKED.values(), ids=UNASKED.keys())
def test_nothing_is_written_where_the_user_did_not_ask(case, tmp_path, capsys):
    """Every command that writes follows one rule: never into a run folder, never over what is not its own, never through a
    link, a missing input is an error; each refused in one line with the tree and the database as they were."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    argv, words = case(tmp_path, run)
    if argv[0] == "site" and "--db" not in argv:
        argv += ["--db", db]
    named = Path(argv[argv.index("--db") + 1]) if "--db" in argv else db
    refused_untouched(tmp_path, argv, capsys, *words, db=named if named.exists() else None)


@pytest.mark.slow
def test_a_site_replaces_an_earlier_site_and_nothing_else(tmp_path, capsys):
    """An empty folder, then the site written there before: exit 0, only that folder changed, no temporary folder left."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    (tmp_path / "site").mkdir()
    for _ in range(2):
        before = snapshot(tmp_path)
        ran = attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys)
        assert ran.code == 0 and "site written" in ran.out, ran
        assert changed(before, snapshot(tmp_path), "site") == []
        assert (tmp_path / "site" / "index.html").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run-a", "site", "team.sqlite"]


# --- 3. a write that goes through a link -----------------------------------------------------------------------------------

def _export_over_a_manifest_link(tmp, run, other):
    with_samples(run)
    os.link(other / "manifest.json", tmp / "out.json")
    return ["export", run, "--format", "pytest-benchmark", "--out", tmp / "out.json", "--force"], other / "manifest.json"


def _export_over_a_user_file_link(tmp, run, other):
    (tmp / "keep").mkdir()
    (tmp / "keep" / "traces.jsonl").write_text('{"mine": true}\n')
    os.link(tmp / "keep" / "traces.jsonl", tmp / "traces.jsonl")
    return ["export", run, "--format", "flashinfer-bench", "--out", tmp / "traces.jsonl", "--force"], tmp / "keep" / "traces.jsonl"


def _compare_over_a_linked_comparison(tmp, run, other):
    (tmp / "archive").mkdir()
    (tmp / "archive" / "old.csv").write_text("case_id,backend,status_base,status_new,x\n")
    os.link(tmp / "archive" / "old.csv", tmp / "cmp.csv")
    return ["compare", run, other, "--out", tmp / "cmp.csv"], tmp / "archive" / "old.csv"


def _report_over_a_linked_page(tmp, run, other):
    ran = ["report", run, "--out", tmp / "reports"]
    from harness.cli.main import main

    assert main([str(a) for a in ran]) == 0
    (tmp / "kept.html").unlink(missing_ok=True)
    os.link(tmp / "reports" / "run-a" / "index.html", tmp / "kept.html")
    return ran, tmp / "kept.html"


LINKED = {"export --force over a hard link to another run's manifest": _export_over_a_manifest_link,
          "export --force over a hard link to a user's file": _export_over_a_user_file_link,
          "compare over a hard link to an archived comparison": _compare_over_a_linked_comparison,
          "report over a page hard-linked elsewhere": pytest.param(_report_over_a_linked_page, marks=pytest.mark.slow)}


@pytest.mark.parametrize("case", LINKED.values(), ids=LINKED.keys())
def test_an_output_never_changes_another_name_of_the_file_it_replaces(case, tmp_path, capsys):
    """An output that is a hard link to another file: written beside it and renamed over it, so the other name keeps its bytes."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    other = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    argv, other_name = case(tmp_path, run, other)
    capsys.readouterr()
    kept = other_name.read_bytes()
    before = snapshot(tmp_path)
    ran = attnbench_in_process(argv, capsys)
    assert ran.code in (0, 3), ran  # compare of two equal runs judges nothing: 3, its CSV written all the same
    assert other_name.read_bytes() == kept
    outputs = {str(Path(a).relative_to(tmp_path)) for a in argv[argv.index("--out") + 1:argv.index("--out") + 2]}
    assert changed(before, snapshot(tmp_path), *outputs) == []
    assert not [p for p in tmp_path.rglob(".*.tmp")]


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


# --- 6. names that are markup --------------------------------------------------------------------------------------------

MARKUP_NAMES = {"an unclosed fraction": r"flash$\frac{1}{$", "an unknown command": r"my$\nokernel$", "a lone superscript": "x$^$",
                "two dollars around text": "cost$ 5 and 6$"}


@pytest.mark.slow
@pytest.mark.parametrize("name", MARKUP_NAMES.values(), ids=MARKUP_NAMES.keys())
def test_a_backend_named_with_mathtext_is_drawn_as_written(name, tmp_path, capsys):
    """A plugin backend whose name matplotlib would read as mathtext: the site is written whole (exit 0), the name shown as
    written; nothing outside the site changes."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    write_records(run, [{**r, "backend": name} if r["backend"] == "sdpa-math" else r for r in records_of(run)])
    edit_json(run / "manifest.json", backends=["naive", name])
    db = database_of(tmp_path, capsys, run)
    before = snapshot(tmp_path)
    ran = attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys)
    assert ran.code == 0 and ran.err == "", ran
    assert changed(before, snapshot(tmp_path), "site") == []
    from harness.report.page import esc

    trend = next((tmp_path / "site" / "trends").glob("*.html")).read_text()
    assert esc(name) in trend and "no report:" not in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.slow
def test_a_site_that_fails_midway_leaves_the_earlier_one_whole(tmp_path, capsys, monkeypatch):
    """A failure late in a build (here: its CSVs cannot be written), after a run was added: the earlier site's bytes as they
    were (no page of the new build in it), no half-built folder left beside it."""
    import harness.history.site as site

    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    assert attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys).code == 0
    database_of(tmp_path, capsys, run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00", slower={"naive": 1.5}))
    before = snapshot(tmp_path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(site, "_csv", broken)
    with pytest.raises(Exception, match="No space left on device"):
        site.build_site(*_frames(db), tmp_path / "site")
    assert changed(before, snapshot(tmp_path)) == []


def _frames(db: Path):
    from harness.history.database import open_database

    with open_database(db, create=False) as opened:
        return opened.runs_frame(), opened.rows_frame()
