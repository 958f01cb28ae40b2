"""The results database (`db add`, `db list`, `regress`): each shared test runs on SQLite and on a real PostgreSQL server.

The PostgreSQL side starts a throwaway server (tests/postgres_server.py) once per session and skips when its binaries
or psycopg are missing; SQLite-only checks (a corrupt file, a locked file) follow the shared ones.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import sqlite3
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.history.database import open_database
from harness.history.ingest import ROW_COLUMNS, RUN_COLUMNS, read_run
from harness.history.schema import SCHEMA_VERSION
from harness.results.record import SCHEMA_VERSION as RECORD_SCHEMA_VERSION
from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.h200_data import H200, needs_h200
from tests.history_runs import run_folder
from tests.postgres_server import fresh_database, postgres_base  # noqa: F401  (postgres_base: the session's server, a fixture)

@pytest.fixture(params=["sqlite", "postgresql"])
def db_target(request, tmp_path) -> str:
    """A fresh, empty results database: an SQLite file not yet made, or a new database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "db" / "attnbench.sqlite")
    return fresh_database(request.getfixturevalue("postgres_base"))


def two_runs(tmp_path: Path, **second) -> tuple[Path, Path]:
    """Two runs of the tiny suite on the same (synthetic) CPU, a day apart."""
    return (run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"),
            run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00", **second))


@pytest.mark.slow
def test_each_run_added_twice_is_kept_once(db_target, tmp_path, capsys):
    """Two runs, each added twice: two runs listed, and the rows are the two runs' records."""
    a, b = two_runs(tmp_path)
    first = attnbench_in_process(["db", "add", a, b, "--db", db_target], capsys)
    assert first.code == 0, first.err
    assert first.out.count("added ") == 2 and "run-a (aaaaaaaa, 4 rows, synthetic CPU)" in first.out
    again = attnbench_in_process(["db", "add", a, b, "--db", db_target], capsys)
    assert again.code == 0 and again.out.count("(unchanged)") == 2, again
    listed = attnbench_in_process(["db", "list", "--db", db_target], capsys)
    assert listed.code == 0 and len(listed.out.splitlines()) == 2, listed
    assert "2026-11-01  run-a  tiny  synthetic CPU" in listed.out and "4/4 ok" in listed.out
    as_json = attnbench_in_process(["db", "list", "--db", db_target, "--json"], capsys)
    assert [r["run_id"] for r in json.loads(as_json.out)] == ["run-a", "run-b"]
    with open_database(db_target) as db:
        runs, rows = db.runs_frame(), db.rows_frame()
        assert list(runs.columns) == [*RUN_COLUMNS, "content_sha256"] and list(rows.columns) == [*ROW_COLUMNS, "throttled", "kernel_mismatch"]
        assert len(rows) == 8 and len(db.rows_frame(["a" * 32])) == 4
        assert rows["latency_ms_median"].astype(float).tolist() == [2.0, 1.0, 2.0, 1.0] * 2


def test_a_resumed_run_replaces_its_rows(db_target, tmp_path, capsys):
    """The same uuid with other content (a run resumed after it was added): 'updated', its rows replaced, no duplicates."""
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    assert attnbench_in_process(["db", "add", a, "--db", db_target], capsys).code == 0
    lines = (a / "records.jsonl").read_text().splitlines()
    (a / "records.jsonl").write_text("\n".join(lines + [lines[0]]) + "\n")  # the resumed run measured its first pair again
    ran = attnbench_in_process(["db", "add", a, "--db", db_target], capsys)
    assert ran.code == 0 and ran.out.startswith("updated run-a (aaaaaaaa, 5 rows"), ran
    with open_database(db_target) as db:
        assert len(db.runs_frame()) == 1 and len(db.rows_frame()) == 5  # the repeated pair is kept: its ordinal tells them apart


def test_a_failed_add_leaves_the_database_as_it_was(db_target, tmp_path):
    """A row the database refuses mid-add (no case id) rolls back the run row written before it."""
    a, b = two_runs(tmp_path)
    with open_database(db_target) as db:
        db.add_run(read_run(a))
        broken = read_run(b)
        broken.rows[-1]["case_id"] = None
        with pytest.raises(UserError):
            db.add_run(broken)
        assert db.runs_frame()["run_id"].tolist() == ["run-a"] and len(db.rows_frame()) == 4


#: Version 1's tables, by hand: what the first attnbench database wrote (no runs.peaks_json, no runs.content_sha256).
_V1_TYPES = {"pairs": "INTEGER", "rows": "INTEGER", "rows_ok": "INTEGER", "samples": "INTEGER", "peak_mem_bytes": "BIGINT",
             "harness_dirty": "BOOLEAN", "agree": "BOOLEAN", "contended": "BOOLEAN", "suspect": "BOOLEAN"}


def _v1_ddl() -> list[str]:
    """CREATE TABLE statements of schema version 1 (valid SQL on SQLite and PostgreSQL alike)."""
    def kind(name: str) -> str:
        return _V1_TYPES.get(name, "DOUBLE PRECISION" if name.startswith("latency") or name in ("tflops", "gbps") else "TEXT")

    runs = ", ".join(f'"{n}" {kind(n)}' for n in RUN_COLUMNS if n != "peaks_json")
    rows = ", ".join(f'"{n}" {kind(n)}' for n in ROW_COLUMNS)
    return [f'CREATE TABLE runs ({runs}, PRIMARY KEY (run_uuid))',
            f'CREATE TABLE "rows" ({rows}, ordinal INTEGER NOT NULL, PRIMARY KEY (run_uuid, case_id, backend, ordinal))',
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", "INSERT INTO meta VALUES ('schema_version', '1')"]


def _execute(target: str, statements: list[str], params: list[dict] | None = None) -> None:
    """Run raw SQL on the database (SQLite file or PostgreSQL URL), in one transaction."""
    from sqlalchemy import create_engine, text

    engine = create_engine(target if "://" in target else f"sqlite:///{target}")
    with engine.begin() as conn:
        for i, statement in enumerate(statements):
            conn.execute(text(statement), (params or [None] * len(statements))[i] or {})
    engine.dispose()


def test_a_version_1_database_is_migrated_keeping_its_rows(db_target, tmp_path, capsys):
    """A database of schema 1 opens as schema 2: its run and rows kept, a digest filled, re-adding the same folder unchanged."""
    if "://" not in db_target:
        Path(db_target).parent.mkdir(parents=True)
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    (a / "peaks.json").unlink()  # a folder without peaks: version 1 kept everything of it
    ingested = read_run(a)
    run = {k: v for k, v in ingested.run.items() if k != "peaks_json"}
    rows = [{**row, "ordinal": i} for i, row in enumerate(ingested.rows)]
    insert_run = f"INSERT INTO runs ({', '.join(chr(34) + k + chr(34) for k in run)}) VALUES ({', '.join(':' + k for k in run)})"
    row_names = [*ROW_COLUMNS, "ordinal"]
    inserts = [f'INSERT INTO "rows" ({", ".join(chr(34) + k + chr(34) for k in row_names)}) VALUES ({", ".join(":" + k for k in row_names)})'] * len(rows)
    _execute(db_target, _v1_ddl() + [insert_run] + inserts, [None] * 4 + [run] + rows)
    with open_database(db_target) as db:
        runs = db.runs_frame()
        assert runs["run_id"].tolist() == ["run-a"] and len(db.rows_frame()) == 4
        assert runs["content_sha256"].iloc[0] and runs["peaks_json"].isna().all()
    from sqlalchemy import create_engine, text

    engine = create_engine(db_target if "://" in db_target else f"sqlite:///{db_target}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar() == str(SCHEMA_VERSION)
    engine.dispose()
    ran = attnbench_in_process(["db", "add", a, "--db", db_target], capsys)
    assert ran.code == 0 and "(unchanged)" in ran.out, ran


def test_a_newer_schema_is_refused(db_target, tmp_path, capsys):
    """A database written by a newer attnbench: one line saying to upgrade, nothing changed."""
    open_database(db_target).close()
    _execute(db_target, [f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'"])
    ran = attnbench_in_process(["db", "list", "--db", db_target], capsys)
    assert_one_line_error(ran, f"newer attnbench (schema {SCHEMA_VERSION + 1}); upgrade attnbench")


def test_regress_names_the_row_that_got_slower(db_target, tmp_path, capsys):
    """One backend's median 30 % slower with tight intervals: exit 1 and that backend's rows marked FAIL."""
    a, b = two_runs(tmp_path, slower={"sdpa-math": 1.3})
    assert attnbench_in_process(["db", "add", b, a, "--db", db_target], capsys).code == 0
    ran = attnbench_in_process(["regress", "--db", db_target, "--fail-above", "5%"], capsys)
    assert ran.code == 1, ran
    failing = [line for line in ran.out.splitlines() if line.endswith("FAIL")]
    assert len(failing) == 2 and all("sdpa-math" in line and "slower" in line for line in failing), ran.out
    assert "run-a" in ran.out and "run-b" in ran.out and "suite tiny on synthetic CPU" in ran.out


def test_regress_within_noise_passes(db_target, tmp_path, capsys):
    """The same latencies within their intervals (0.5 % apart, intervals ±1 %): exit 0."""
    a, b = two_runs(tmp_path, slower={"naive": 1.005, "sdpa-math": 0.995})
    assert attnbench_in_process(["db", "add", a, b, "--db", db_target], capsys).code == 0
    ran = attnbench_in_process(["regress", "--db", db_target], capsys)
    assert ran.code == 0 and "FAIL" not in ran.out and "within noise" in ran.out, ran


def test_regress_with_one_run_says_so(db_target, tmp_path, capsys):
    """A group of one run is said, and with nothing judged the exit is compare's 'undecided' (3)."""
    assert attnbench_in_process(["db", "add", run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"), "--db", db_target],
                                capsys).code == 0
    ran = attnbench_in_process(["regress", "--db", db_target], capsys)
    assert ran.code == 3 and "only one run of suite tiny on synthetic CPU: nothing to compare" in ran.out, ran


# --- input a user can get wrong (the database is not needed, or is SQLite) ---

def test_a_bad_folder_adds_nothing(tmp_path, capsys):
    """A folder that is not a run among good ones: one line naming it, and no database made."""
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    (tmp_path / "not-a-run").mkdir()
    target = tmp_path / "x.sqlite"
    assert_one_line_error(attnbench_in_process(["db", "add", a, tmp_path / "not-a-run", "--db", target], capsys), "not-a-run", "manifest.json")
    assert not target.exists()


def test_a_newer_record_schema_is_refused(tmp_path, capsys):
    """A run whose records carry a newer schema_version than this attnbench's: one line, nothing added."""
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    records = [json.loads(line) for line in (a / "records.jsonl").read_text().splitlines()]
    records[1]["schema_version"] = RECORD_SCHEMA_VERSION + 1
    (a / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    target = tmp_path / "x.sqlite"
    assert_one_line_error(attnbench_in_process(["db", "add", a, "--db", target], capsys), "upgrade attnbench")
    assert not target.exists()


def _real_sqlite(tmp_path: Path) -> Path:
    """A real results database holding one run."""
    target = tmp_path / "real.sqlite"
    with open_database(target) as db:
        db.add_run(read_run(run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")))
    return target


@pytest.mark.parametrize("damage", ["random", "truncated", "text"])
def test_a_corrupt_file_is_refused_untouched(damage, tmp_path, capsys):
    """Random bytes, a truncated real database, a text file: one line naming the file, its bytes unchanged."""
    if damage == "random":
        target = tmp_path / "random.sqlite"
        target.write_bytes(os.urandom(4096))
    elif damage == "text":
        target = tmp_path / "notes.txt"
        target.write_text("not a database\n")
    else:
        target = _real_sqlite(tmp_path)
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    before = target.read_bytes()
    for argv in (["db", "list", "--db", target], ["db", "add", run_folder(tmp_path / "run-z", "z", "2026-11-05T00:00:00Z"), "--db", target],
                 ["regress", "--db", target]):
        assert_one_line_error(attnbench_in_process(argv, capsys), str(target))
        assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir() if p.name.startswith(target.name)) == [target.name]  # no journal left


def test_a_locked_database_waits_then_says_so(tmp_path, capsys, monkeypatch):
    """Another process holds an exclusive lock: after ATTNBENCH_DB_TIMEOUT_S, one line saying it is locked."""
    target = _real_sqlite(tmp_path)
    b = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    monkeypatch.setenv("ATTNBENCH_DB_TIMEOUT_S", "0.5")
    holder = sqlite3.connect(target, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for argv in (["db", "add", b, "--db", target], ["db", "list", "--db", target]):
            assert_one_line_error(attnbench_in_process(argv, capsys), str(target), "is locked by another process", "try again when it finishes")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert attnbench_in_process(["db", "add", b, "--db", target], capsys).code == 0  # free again: the add goes through


@pytest.mark.parametrize("kind", ["folder", "mysql", "sqlite-url"])
def test_a_bad_db_value_is_refused(kind, tmp_path, capsys):
    """--db naming a folder, or a URL of a scheme other than PostgreSQL's: one line."""
    value = {"folder": str(tmp_path), "mysql": "mysql://u@localhost/x", "sqlite-url": "sqlite:///x.db"}[kind]
    assert_one_line_error(attnbench_in_process(["db", "list", "--db", value], capsys), "--db")


def test_listing_a_missing_database_does_not_create_it(tmp_path, capsys, monkeypatch):
    """db list and regress on no database: one line pointing at db add, and no file made (the default path as well)."""
    monkeypatch.chdir(tmp_path)
    for argv in (["db", "list"], ["regress"], ["db", "list", "--db", tmp_path / "none.sqlite"]):
        assert_one_line_error(attnbench_in_process(argv, capsys), "no results database at", "attnbench db add RUN")
    assert list(tmp_path.iterdir()) == []


@needs_h200
def test_the_real_h200_run(tmp_path, capsys):
    """The real H200 slice (records gunzipped into a copy): every record a row, its GPU as the device model."""
    copy = tmp_path / "h200"
    copy.mkdir()
    for name in ("manifest.json", "env.json", "peaks.json"):
        if (H200 / name).exists():
            shutil.copy(H200 / name, copy / name)
    with gzip.open(H200 / "records.jsonl.gz", "rb") as src, open(copy / "records.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    target = tmp_path / "h200.sqlite"
    ran = attnbench_in_process(["db", "add", copy, "--db", target], capsys)
    assert ran.code == 0 and "132 rows" in ran.out and "H200" in ran.out, ran
    with open_database(target) as db:
        rows = db.rows_frame()
        assert len(rows) == 132 and (rows["status"] == "ok").sum() == 84
        assert json.loads(rows["record_json"].iloc[0])["sample_ms"]  # the raw samples are kept whole


def test_a_flag_the_schema_has_no_column_for_is_read_from_the_stored_record():
    """kernel_mismatch came after the table: rows_frame reads it from each record, so a trend or regress never trusts such a row."""
    import json

    import pandas as pd

    from harness.history.database import with_every_flag

    frame = pd.DataFrame({"record_json": [json.dumps({"kernel_mismatch": True}), json.dumps({}), None]})
    assert with_every_flag(frame)["kernel_mismatch"].tolist() == [True, None, None]


@pytest.mark.parametrize("missing, target, words", [
    (("sqlalchemy",), "r.sqlite", ("the results database needs sqlalchemy>=2.0", "pip install 'sqlalchemy>=2.0'")),
    (("psycopg",), "postgresql://u@localhost/db", ("postgresql:// results database needs psycopg[binary]>=3.1", "'psycopg[binary]>=3.1'")),
    (("sqlalchemy", "psycopg"), "postgresql://u@localhost/db", ("needs sqlalchemy>=2.0 and psycopg[binary]>=3.1",)),
])
def test_a_database_command_without_its_driver_says_what_to_install(missing, target, words, tmp_path, capsys, monkeypatch):
    """SQLAlchemy and psycopg are the optional `db` extra (the GPU box has neither): each db command names what to pip install."""
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError, as where it is not installed
    where = target if "://" in target else str(tmp_path / target)
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    for argv in (["db", "add", run, "--db", where], ["db", "list", "--db", where], ["regress", "--db", where],
                 ["site", "--db", where, "--out", str(tmp_path / "site")]):
        assert_one_line_error(attnbench_in_process(argv, capsys), *words)
    assert not (tmp_path / "r.sqlite").exists() and not (tmp_path / "site").exists()
