"""The results database's tables, its schema version, and the migration of an older version (SQLAlchemy Core, any backend).

Version 2 (this code): `runs` (RUN_COLUMNS + `content_sha256`, key `run_uuid`), `rows` (ROW_COLUMNS + `ordinal`, the record's
position in its run's records file, key (run_uuid, case_id, backend, ordinal), so a pair a run measured twice keeps both rows),
and `meta` (key, value) holding `schema_version`.
Version 1: the same tables without `runs.peaks_json` and `runs.content_sha256` (runs were told apart by uuid alone);
migrating adds both columns and fills each run's digest from what it stored, in one transaction, keeping every row.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import BigInteger, Boolean, Column, Float, Integer, MetaData, PrimaryKeyConstraint, Table, Text, inspect, select, text
from sqlalchemy.engine import Connection

from harness.errors import UserError
from harness.history.ingest import ROW_COLUMNS, RUN_COLUMNS, IngestedRun, content_digest

#: The version this code writes; a database of an older one is migrated on open, a newer one refused.
SCHEMA_VERSION = 2
#: The run columns version 1 lacked (added by the migration to 2).
V2_RUN_COLUMNS = ("peaks_json", "content_sha256")

_INTEGER = {"pairs", "rows", "rows_ok", "samples", "ordinal"}
_BIG = {"peak_mem_bytes"}
_FLOAT = {"latency_ms_median", "latency_ms_ci95_low", "latency_ms_ci95_high", "latency_ms_p20", "latency_ms_p80", "tflops", "gbps"}
_BOOLEAN = {"harness_dirty", "agree", "contended", "suspect"}


def _type(name: str):
    """The SQL type of a column, by its name (every other column is text)."""
    if name in _INTEGER:
        return Integer()
    if name in _BIG:
        return BigInteger()
    if name in _FLOAT:
        return Float(precision=53)  # double precision on PostgreSQL: a median keeps every digit it had
    if name in _BOOLEAN:
        return Boolean()
    return Text()


def tables(version: int = SCHEMA_VERSION) -> tuple[MetaData, Table, Table, Table]:
    """The metadata and the `runs`, `rows` and `meta` tables of schema `version` (1 or 2)."""
    metadata = MetaData()
    run_names = [*RUN_COLUMNS, "content_sha256"] if version >= 2 else [n for n in RUN_COLUMNS if n not in V2_RUN_COLUMNS]
    runs = Table("runs", metadata, *(Column(n, _type(n), primary_key=(n == "run_uuid")) for n in run_names))
    rows = Table("rows", metadata, *(Column(n, _type(n), nullable=n not in ("run_uuid", "case_id", "backend")) for n in ROW_COLUMNS),
                 Column("ordinal", Integer(), nullable=False), PrimaryKeyConstraint("run_uuid", "case_id", "backend", "ordinal"))
    meta = Table("meta", metadata, Column("key", Text(), primary_key=True), Column("value", Text()))
    return metadata, runs, rows, meta


METADATA, RUNS, ROWS, META = tables()


def coerce(name: str, value: Any) -> Any:
    """A record's value as its column's type holds it: a value of another type (an older record's) is kept as well as it fits, else None."""
    if value is None:
        return None
    if name in _BOOLEAN:
        return value if isinstance(value, bool) else None
    if name in _INTEGER or name in _BIG:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None
    if name in _FLOAT:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def stored_version(conn: Connection, where: str) -> int | None:
    """The schema version the database says it has; None for a database without attnbench's tables (UserError for a foreign one)."""
    names = set(inspect(conn).get_table_names())
    if "meta" not in names:
        if names & {"runs", "rows"}:
            raise UserError(f"{where} has tables named runs/rows but no meta table: it is not an attnbench results database")
        return None
    value = conn.execute(select(META.c.value).where(META.c.key == "schema_version")).scalar()
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UserError(f"{where} has no readable schema_version in its meta table (got {value!r}): it is not an attnbench results database") from None


def prepare(conn: Connection, where: str, foreign_tables: bool) -> int | None:
    """Create the tables in an empty database, or migrate an older one, inside the caller's transaction; the version found (None: new)."""
    found = stored_version(conn, where)
    if found is None:
        if foreign_tables and inspect(conn).get_table_names():
            raise UserError(f"{where} is an SQLite database of something else (it has tables but no attnbench meta table): give another file")
        METADATA.create_all(conn)
        conn.execute(META.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
        return None
    if found > SCHEMA_VERSION:
        raise UserError(f"{where} was written by a newer attnbench (schema {found}); upgrade attnbench")
    if found < 1:
        raise UserError(f"{where} says it has schema version {found}, which no attnbench wrote")
    check_tables(conn, where, found)
    if found == 1:
        migrate_1_to_2(conn)
    return found


def check_tables(conn: Connection, where: str, version: int) -> None:
    """Refuse (UserError) a database whose meta table says `version` but whose runs or rows table is gone or lacks a column."""
    _, *wanted = tables(version)
    inspector = inspect(conn)
    present = set(inspector.get_table_names())
    for table in wanted:
        if table.name not in present:
            raise UserError(f"{where} is damaged: its meta table says schema {version} but it has no {table.name!r} table; "
                            "it was left as it is (restore it from a backup, or give another database)")
        columns = {column["name"] for column in inspector.get_columns(table.name)}
        missing = [column.name for column in table.columns if column.name not in columns]
        if missing:
            raise UserError(f"{where} is damaged: its {table.name!r} table has no column {missing[0]!r}; it was left as it is "
                            "(restore it from a backup, or give another database)")


def migrate_1_to_2(conn: Connection) -> None:
    """Add `runs.peaks_json` and `runs.content_sha256`, and fill each run's digest from its stored documents and records."""
    preparer = conn.dialect.identifier_preparer
    for name in V2_RUN_COLUMNS:
        conn.execute(text(f"ALTER TABLE {preparer.quote('runs')} ADD COLUMN {preparer.quote(name)} TEXT"))
    uuids = conn.execute(select(RUNS.c.run_uuid)).scalars().all()
    for run_uuid in uuids:
        run = conn.execute(select(RUNS).where(RUNS.c.run_uuid == run_uuid)).mappings().one()
        records = conn.execute(select(ROWS.c.record_json).where(ROWS.c.run_uuid == run_uuid).order_by(ROWS.c.ordinal)).scalars().all()
        # The same digest a fresh ingest of a folder without peaks.json gives: re-adding such a folder says "unchanged".
        digest = content_digest(IngestedRun(dict(run), [{"record_json": r or ""} for r in records]))
        conn.execute(RUNS.update().where(RUNS.c.run_uuid == run_uuid).values(content_sha256=digest))
    conn.execute(META.update().where(META.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
