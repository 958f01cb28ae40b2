"""PostgreSQL-only checks of the results database; the shared ones (tests/test_history_db.py) already run on PostgreSQL too.

They use a real server (tests/postgres_server.py), never a mock; the unreachable-server check needs none.
"""

from __future__ import annotations

import pytest

from harness.history.database import open_database
from harness.history.ingest import read_run
from tests.cli_runs import assert_one_line_error, attnbench_in_process
from tests.history_runs import run_folder
from tests.postgres_server import fresh_database, postgres_base  # noqa: F401  (postgres_base: the session's server, a fixture)


def test_an_unreachable_server_is_one_line(tmp_path, capsys, monkeypatch):
    """A postgresql:// URL whose server is not there (a socket folder with no server in it): one line naming the database."""
    pytest.importorskip("psycopg")
    monkeypatch.setenv("ATTNBENCH_DB_TIMEOUT_S", "1")
    url = f"postgresql://postgres@/attnbench?host={tmp_path}"
    err = assert_one_line_error(attnbench_in_process(["db", "list", "--db", url], capsys), "cannot reach the PostgreSQL database")
    assert "attnbench" in err


@pytest.mark.e2e
def test_a_plain_postgresql_url_uses_psycopg(postgres_base, tmp_path, capsys):  # noqa: F811
    """`postgresql://` (no driver named) is the same database through psycopg 3: a run added there is listed."""
    url = fresh_database(postgres_base)
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    a = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    assert attnbench_in_process(["db", "add", a, "--db", plain], capsys).code == 0
    with open_database(url) as db:
        assert db.runs_frame()["run_id"].tolist() == ["run-a"]
        assert db.engine.dialect.driver == "psycopg"


def test_a_wrong_password_or_database_is_one_line(postgres_base, capsys):  # noqa: F811
    """A database that does not exist on a reachable server: one line, nothing created."""
    url = postgres_base.format(db="no_such_database")
    assert_one_line_error(attnbench_in_process(["db", "list", "--db", url], capsys), "cannot reach the PostgreSQL database", "no_such_database")


def test_two_connections_see_one_copy(postgres_base, tmp_path):  # noqa: F811
    """Two handles on one server database adding the same run: it is stored once, the second told 'unchanged'."""
    url = fresh_database(postgres_base)
    run = read_run(run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00"))
    with open_database(url) as first, open_database(url) as second:
        assert first.add_run(run) is True
        assert second.add_run(run) is False and second.last_action == "unchanged"
        assert len(second.rows_frame()) == 4
