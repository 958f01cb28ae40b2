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


def _at_once(argvs: list[list], capsys) -> tuple[list[int], str, str]:
    """Run each ARGV through the CLI in its own thread, all released at one moment; their exit statuses and what they printed."""
    import threading

    from harness.cli.main import main

    gate = threading.Barrier(len(argvs))
    codes: list[int | None] = [None] * len(argvs)

    def one(i: int, argv: list) -> None:
        gate.wait()
        codes[i] = main([str(a) for a in argv])

    threads = [threading.Thread(target=one, args=(i, argv)) for i, argv in enumerate(argvs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    captured = capsys.readouterr()
    return codes, captured.out, captured.err


#: How many fresh databases each concurrency check races on: a race lost once in a while is found in some round.
ROUNDS = 6


@pytest.mark.postgres
@pytest.mark.parametrize("jobs", [2, 3])
def test_one_run_added_at_once_by_several_jobs_is_stored_once(jobs, postgres_base, tmp_path, capsys):  # noqa: F811
    """Several `db add` of one run at the same moment into a fresh PostgreSQL database (the tables not yet made): every job
    exits 0, one says 'added' and the others 'already in', and the run is stored once with its rows; round after round."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    for _ in range(ROUNDS):
        url = fresh_database(postgres_base)
        codes, out, err = _at_once([["db", "add", run, "--db", url]] * jobs, capsys)
        assert codes == [0] * jobs and err == "", (codes, err)
        assert out.count("added run-a") == 1 and out.count("already in") == jobs - 1, out
        with open_database(url, create=False) as db:
            assert db.runs_frame()["run_id"].tolist() == ["run-a"] and len(db.rows_frame()) == 4


@pytest.mark.postgres
def test_different_runs_added_at_once_into_a_fresh_database_are_all_kept(postgres_base, tmp_path, capsys):  # noqa: F811
    """Three jobs each adding its own run at one moment, the tables made by whichever comes first: all exit 0, all three kept."""
    runs = [run_folder(tmp_path / f"run-{c}", c, f"2026-11-0{i + 1}T10:00:00+00:00") for i, c in enumerate("abc")]
    for _ in range(ROUNDS):
        url = fresh_database(postgres_base)
        codes, out, err = _at_once([["db", "add", run, "--db", url] for run in runs], capsys)
        assert codes == [0, 0, 0] and err == "" and out.count("added run-") == 3, (codes, out, err)
        with open_database(url, create=False) as db:
            assert db.runs_frame()["run_id"].tolist() == ["run-a", "run-b", "run-c"] and len(db.rows_frame()) == 12
