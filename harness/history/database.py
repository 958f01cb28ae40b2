"""The results database: runs and their rows, in an SQLite file or a PostgreSQL database, through one SQLAlchemy Core code path.

`open_database(None)` is results/attnbench.sqlite; a path is an SQLite file; `postgresql://…` or `postgresql+psycopg://…`
is PostgreSQL (through psycopg 3). Opening creates the tables or migrates an older schema (harness.history.schema), in a
transaction. Every problem a user can cause is one line (UserError): a file that is no SQLite database or a corrupt one
(never written to: it is checked read-only before anything else touches it), a database locked by another process (after
a busy wait of ATTNBENCH_DB_TIMEOUT_S, default 10 s), an unreachable server, a --db that names neither.

SQLAlchemy (and psycopg for PostgreSQL) is the optional `db` extra, imported only here: a sweep, its report and `gpu-check`
run without it (the GPU box has none and no index to fetch it from); a database command without it says what to install.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from harness.errors import UserError
from harness.history.ingest import ROW_COLUMNS, RUN_COLUMNS, IngestedRun, content_digest

if TYPE_CHECKING:
    from harness.policy.sources import LoadedRun

#: Where `--db` points when it is not given (relative to the working folder).
DEFAULT_PATH = Path("results") / "attnbench.sqlite"
#: The environment variable overriding how long to wait for another process's lock, in seconds.
TIMEOUT_ENV = "ATTNBENCH_DB_TIMEOUT_S"
_POSTGRES_PREFIXES = ("postgresql://", "postgresql+psycopg://")
_SQLITE_MAGIC = b"SQLite format 3\x00"


#: The longest wait ATTNBENCH_DB_TIMEOUT_S may ask for (a day): the drivers take a finite number of seconds (libpq an int).
MAX_TIMEOUT_S = 86_400.0
#: The PostgreSQL advisory lock every attnbench write takes first (per database): two `db add` at once, or two first opens that
#: both find no tables, run one after the other, so the second sees what the first committed instead of a unique violation.
_WRITE_LOCK = 0x6174746E62656E63  # "attnbenc"


def busy_timeout_s() -> float:
    """How long to wait for a lock another process holds: ATTNBENCH_DB_TIMEOUT_S, or 10 s (0 to MAX_TIMEOUT_S)."""
    raw = os.environ.get(TIMEOUT_ENV, "10")
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{TIMEOUT_ENV} must be a number of seconds: got {raw!r}") from None
    if not 0 <= value <= MAX_TIMEOUT_S:  # NaN and infinity included: no driver can wait for them
        raise UserError(f"{TIMEOUT_ENV} must be a number of seconds from 0 to {MAX_TIMEOUT_S:.0f}: got {raw!r}")
    return value


def _first_line(exc: BaseException) -> str:
    """The first line of an error's message (a driver's message can run to several)."""
    message = str(getattr(exc, "orig", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


def _sqlite_problem(path: Path, exc: BaseException) -> UserError:
    """The one-line refusal for an SQLite error on `path`: locked, corrupt or not a database, or another failure."""
    message = _first_line(exc)
    if "locked" in message or "busy" in message:
        return UserError(f"{path} is locked by another process ({message}); try again when it finishes")
    if "not a database" in message or "malformed" in message or "corrupt" in message:
        return UserError(f"{path} is not a readable SQLite database ({message}): it was left as it is; give another file")
    return UserError(f"cannot use the results database {path}: {message}")


def check_sqlite_file(path: Path) -> None:
    """Refuse, without writing a byte, a file that is not an SQLite database or is corrupt (checked read-only: header, then quick_check)."""
    if path.stat().st_size == 0:
        return  # SQLite's own view: an empty file is an empty database
    with open(path, "rb") as handle:
        head = handle.read(len(_SQLITE_MAGIC))
    if head != _SQLITE_MAGIC:
        raise UserError(f"{path} is not an SQLite database (file is not a database): it was left as it is; give another file")
    try:
        # mode=ro: a damaged file is never "repaired", truncated or journaled by this check
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_s())
        try:
            result = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _sqlite_problem(path, exc) from None
    if result != [("ok",)]:
        raise UserError(f"{path} is a corrupt SQLite database (database disk image is malformed: {str(result[0][0])[:120]}): "
                        "it was left as it is; give another file")


def _sqlite_engine(path: Path):
    """An engine on an SQLite file whose transactions really begin (BEGIN, or BEGIN IMMEDIATE for a write) and wait for locks."""
    from sqlalchemy import create_engine, event

    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": busy_timeout_s()})

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_conn, _record):  # the driver's own implicit BEGIN skips DDL: a migration would not be atomic
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn):  # IMMEDIATE takes the write lock up front, so a writer waits its busy timeout instead of failing at once
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


class Database:
    """An open results database: add runs, read them back as frames."""

    def __init__(self, engine, name: str, sqlite_path: Path | None):
        """Wrap an engine whose tables are ready; `name` is how messages name the database."""
        self.engine = engine
        self.name = name
        self.sqlite_path = sqlite_path
        #: What the last `add_run` did: "added", "updated" (same uuid, other content) or "unchanged".
        self.last_action = ""

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a driver's error into one line naming the database (locked, corrupt, unreachable)."""
        from sqlalchemy.exc import DBAPIError, OperationalError

        try:
            yield
        except (OperationalError, DBAPIError) as exc:
            if self.sqlite_path is not None:
                raise _sqlite_problem(self.sqlite_path, exc) from None
            raise UserError(f"results database {self.name}: {_first_line(exc)}") from None

    @contextmanager
    def transaction(self, write: bool = False):
        """A connection in one transaction: committed at the end, rolled back (the database as before) on any error."""
        with self._guard(), self.engine.connect().execution_options(write=write) as conn, conn.begin():
            if write and conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_WRITE_LOCK})")
            yield conn

    def prepare(self) -> None:
        """Create the tables, or migrate an older schema, in one transaction (refusing a newer one)."""
        from harness.history.schema import prepare

        with self.transaction(write=True) as conn:
            prepare(conn, self.name, foreign_tables=self.sqlite_path is not None)

    def add_run(self, ingested: IngestedRun, *, replace: bool = False) -> bool:
        """Add a run and its rows in one transaction; False when it is there with the same content, True when added or replaced.

        A run already stored is replaced only by a later state of it (`stored.later_state_problem`), or by anything with `replace`;
        otherwise UserError, the stored run left as it is."""
        from sqlalchemy import select

        from harness.history.schema import ROWS, RUNS, coerce

        digest = content_digest(ingested)
        run_uuid = ingested.run["run_uuid"]
        run = {name: coerce(name, ingested.run.get(name)) for name in RUN_COLUMNS} | {"content_sha256": digest}
        rows = [{name: coerce(name, row.get(name)) for name in ROW_COLUMNS} | {"ordinal": i} for i, row in enumerate(ingested.rows)]
        with self.transaction(write=True) as conn:
            stored = conn.execute(select(RUNS.c.content_sha256).where(RUNS.c.run_uuid == run_uuid)).first()
            if stored is not None and stored[0] == digest:
                self.last_action = "unchanged"
                return False
            if stored is not None:
                if not replace:
                    self._refuse_unless_later(conn, ingested)
                conn.execute(ROWS.delete().where(ROWS.c.run_uuid == run_uuid))
                conn.execute(RUNS.delete().where(RUNS.c.run_uuid == run_uuid))
            conn.execute(RUNS.insert(), [run])
            if rows:
                conn.execute(ROWS.insert(), rows)
        self.last_action = ("replaced" if replace else "updated") if stored is not None else "added"
        return True

    def _refuse_unless_later(self, conn, ingested: IngestedRun) -> None:
        """UserError when the database holds the run with other content that `ingested` cannot be a later state of."""
        from sqlalchemy import select

        from harness.history.schema import ROWS, RUNS

        run_uuid = ingested.run["run_uuid"]
        stored = conn.execute(select(RUNS.c.content_sha256, RUNS.c.manifest_json).where(RUNS.c.run_uuid == run_uuid)).first()
        if stored is None or stored[0] == content_digest(ingested):
            return
        records = conn.execute(select(ROWS.c.record_json).where(ROWS.c.run_uuid == run_uuid).order_by(ROWS.c.ordinal)).scalars().all()
        from harness.history.stored import later_state_problem

        problem = later_state_problem(stored[1], list(records), ingested)
        if problem is not None:
            raise UserError(f"{self.name} already holds run {ingested.run['run_id']} ({run_uuid[:8]}, {len(records)} rows) and "
                            f"{ingested.run['source_path']} is not a later state of it ({problem}): the stored run was left as "
                            "it is; give --replace to replace it with this copy")

    def check_add(self, ingested: IngestedRun) -> None:
        """Refuse (UserError), before anything is written, a run `add_run` would refuse without `replace`."""
        with self.transaction() as conn:
            self._refuse_unless_later(conn, ingested)

    def runs_frame(self):
        """Every run: RUN_COLUMNS + content_sha256, oldest first (by created_utc); each checked (harness.history.stored)."""
        import pandas as pd
        from sqlalchemy import select

        from harness.history.schema import RUNS
        from harness.history.stored import check_run

        columns = [*RUN_COLUMNS, "content_sha256"]
        with self.transaction() as conn:
            result = conn.execute(select(*(RUNS.c[n] for n in columns)).order_by(RUNS.c.created_utc, RUNS.c.run_uuid)).all()
        for r in result:
            check_run(dict(r._mapping), self.name)
        return pd.DataFrame([tuple(r) for r in result], columns=columns)

    def rows_per_node(self) -> dict[str, dict[str, int]]:
        """Per run (its uuid): how many rows each Ray node gave; runs whose rows name no node (local runs) are absent."""
        import json

        from sqlalchemy import select

        from harness.history.schema import ROWS

        # record_json is written with compact separators (harness.history.ingest): only rows that name a node match.
        query = select(ROWS.c.run_uuid, ROWS.c.record_json).where(ROWS.c.record_json.like('%"node":"%'))
        counts: dict[str, dict[str, int]] = {}
        with self.transaction() as conn:
            for run_uuid, text in conn.execute(query):
                node = json.loads(text).get("node")
                if isinstance(node, str):
                    per_node = counts.setdefault(run_uuid, {})
                    per_node[node] = per_node.get(node, 0) + 1
        return counts

    def rows_frame(self, run_uuids: Sequence[str] | None = None):
        """The rows (ROW_COLUMNS) of the given runs (None: every run), each run's in its records file's order; each row checked
        against its own record (harness.history.stored)."""
        import pandas as pd
        from sqlalchemy import select

        from harness.history.schema import ROWS, RUNS
        from harness.history.stored import check_row

        query = select(*(ROWS.c[n] for n in ROW_COLUMNS), ROWS.c.ordinal).order_by(ROWS.c.run_uuid, ROWS.c.ordinal)
        if run_uuids is not None:
            query = query.where(ROWS.c.run_uuid.in_(list(run_uuids)))
        with self.transaction() as conn:
            result = conn.execute(query).all()
            run_ids = dict(conn.execute(select(RUNS.c.run_uuid, RUNS.c.run_id)).all())
        records = [check_row(dict(r._mapping), run_ids.get(r.run_uuid), r.ordinal + 1 if isinstance(r.ordinal, int) else r.ordinal, self.name)
                   for r in result]
        frame = pd.DataFrame([tuple(r)[:len(ROW_COLUMNS)] for r in result], columns=list(ROW_COLUMNS))
        return with_every_flag(frame, records)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> "Database":
        """Use as a context manager: closed at the end."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the database."""
        self.close()


def _postgres(url: str) -> Database:
    """Open a PostgreSQL database through psycopg 3; one line when the URL is malformed or the server unreachable."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    timeout = max(1, int(round(busy_timeout_s())))  # outside the try: its own one line, not a URL's
    try:
        parsed = make_url(url)
        name = parsed.render_as_string(hide_password=True)
        engine = create_engine(parsed, connect_args={"connect_timeout": timeout}, pool_pre_ping=True)
    except (ArgumentError, ValueError) as exc:
        raise UserError(f"--db {url.split('@')[-1]!r} is not a usable PostgreSQL URL: {_first_line(exc)}") from None
    db = Database(engine, name, None)
    try:
        with db.engine.connect():
            pass
    except Exception as exc:  # every driver failure to connect: refused, bad host, no such database, bad password
        engine.dispose()
        raise UserError(f"cannot reach the PostgreSQL database {name}: {_first_line(exc)}") from None
    db.prepare()
    return db


#: What the results database needs installed (pyproject's `db` extra), as the refusal names it.
SQLALCHEMY_REQUIREMENT = "sqlalchemy>=2.0"
PSYCOPG_REQUIREMENT = "psycopg[binary]>=3.1"


def require_drivers(postgres: bool) -> None:
    """Refuse in one line, naming what to pip install, when SQLAlchemy 2 (or, for PostgreSQL, psycopg 3) does not import."""
    wanted, found = [], ""
    try:
        import sqlalchemy

        if int(sqlalchemy.__version__.split(".")[0]) < 2:
            wanted.append(SQLALCHEMY_REQUIREMENT)
            found = f" (SQLAlchemy {sqlalchemy.__version__} is too old)"
    except ImportError:
        wanted.append(SQLALCHEMY_REQUIREMENT)
    if postgres:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            wanted.append(PSYCOPG_REQUIREMENT)
    if wanted:
        kind = "a postgresql:// results database" if postgres else "the results database"
        raise UserError(f"{kind} needs {' and '.join(wanted)}, which is not installed here{found}: pip install "
                        + " ".join(f"'{w}'" for w in wanted) + " (attnbench's `db` extra); runs and reports need neither")


def open_database(target: str | Path | None, *, create: bool = True) -> Database:
    """Open (creating or migrating) the results database `target` names: None → results/attnbench.sqlite, a path, or a PostgreSQL URL."""
    text = str(DEFAULT_PATH if target is None else target)
    require_drivers(postgres=text.startswith(_POSTGRES_PREFIXES))
    if text.startswith(_POSTGRES_PREFIXES):
        return _postgres(text)
    if "://" in text:
        raise UserError(f"--db {text!r}: give an SQLite file or a postgresql:// URL (other database schemes are not supported)")
    path = Path(text)
    if path.is_dir():
        raise UserError(f"--db {path} is a folder: give an SQLite file (e.g. {DEFAULT_PATH}) or a postgresql:// URL")
    if path.exists():
        if not path.is_file():
            raise UserError(f"--db {path} is not a regular file: give an SQLite file or a postgresql:// URL")
        check_sqlite_file(path)
    elif not create:
        raise UserError(f"no results database at {path}: add runs with attnbench db add RUN")
    if create:  # a database is written to: never in a run folder, the one rule every writer follows
        from harness.results.outputs import refuse_in_run_folder
        from harness.results.store import resolved

        refuse_in_run_folder(path, resolved(path, "--db").parent, "a results database", "--db")
    if not path.exists() and not path.parent.is_dir():
        if path.parent.exists():
            raise UserError(f"--db {path}: {path.parent} is not a folder")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create --db {path}: {exc.strerror or exc}") from None
    db = Database(_sqlite_engine(path), str(path), path)
    try:
        db.prepare()
    except BaseException:
        db.close()
        raise
    return db


def with_every_flag(frame, records: Sequence[dict] | None = None):
    """`frame` with a column for each untrusted flag the record vocabulary names, read from each row's whole record where the
    table has none (a flag added after the schema, such as kernel_mismatch): a trend or a gate never trusts a row it flags."""
    import json

    from harness.results.vocabulary import UNTRUSTED_FLAGS

    for name in UNTRUSTED_FLAGS:
        if name not in frame.columns:
            if records is not None:  # each row's record, already parsed (and checked) by the caller
                frame[name] = [record.get(name) for record in records]
            else:
                frame[name] = [json.loads(text).get(name) if isinstance(text, str) else None for text in frame["record_json"]]
    return frame


def policy_runs(target: str | Path | None, run_ids: Sequence[str] = ()) -> tuple[list[LoadedRun], str]:
    """For `attnbench policy --db`: the runs of the results database (those named by run id or uuid prefix; none named: every run), oldest first, and its name."""
    import pandas as pd

    from harness.policy.sources import runs_from_stored

    with open_database(target, create=False) as db:
        stored = db.runs_frame()
        name = db.name
        chosen = stored
        if run_ids:
            picked = []
            for wanted in run_ids:
                match = stored[(stored["run_id"] == wanted) | stored["run_uuid"].str.startswith(wanted)]
                if match.empty:
                    held = ", ".join(stored["run_id"].astype(str)) or "none"
                    raise UserError(f"{name} holds no run {wanted!r} (it holds: {held})")
                picked.append(match)
            chosen = pd.concat(picked).drop_duplicates("run_uuid")
        if chosen.empty:
            raise UserError(f"{name} holds no runs: add runs with attnbench db add RUN")
        rows = db.rows_frame(list(chosen["run_uuid"]))
    return runs_from_stored(chosen, rows), name
