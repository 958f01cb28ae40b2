"""A real PostgreSQL server for the results-database tests: initdb in a temporary folder, a Unix socket only, trust auth.

`postgres_server()` starts one (as the `postgres` user when this process is root, since postgres refuses to run as root)
and yields a base URL without a database name; `fresh_database(base)` creates an empty database on it and gives its URL.
Skips (never mocks) when the binaries or psycopg are missing.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

#: Where Debian puts the server's binaries (PATH is tried as well).
BIN_DIRS = [Path(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)] if Path("/usr/lib/postgresql").is_dir() else []
_names = itertools.count()


def _binary(name: str) -> str | None:
    """The path of a PostgreSQL binary, or None."""
    for folder in BIN_DIRS:
        if (folder / name).is_file():
            return str(folder / name)
    return shutil.which(name)


def _as_server_user(argv: list[str]) -> list[str]:
    """ARGV run as `postgres` when this process is root (postgres will not run as root), else as is."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a throwaway PostgreSQL server on a Unix socket; yield `postgresql+psycopg://postgres@/{db}?host=SOCKDIR` (format `db`)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg 3 is not installed: the PostgreSQL results-database tests need it")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("the PostgreSQL server binaries (initdb, pg_ctl) are not on this machine")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot start postgres as its own user")
    root = Path(tempfile.mkdtemp(prefix="attnbench-pg-"))
    data, sock = root / "data", root / "sock"
    data.mkdir()
    sock.mkdir()
    if os.geteuid() == 0:
        try:
            shutil.chown(root, "postgres")
            shutil.chown(data, "postgres")
            shutil.chown(sock, "postgres")
        except (LookupError, PermissionError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"cannot hand a data folder to the postgres user: {exc}")
    os.chmod(root, 0o755)
    try:
        init = subprocess.run(_as_server_user([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
                              capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            pytest.skip(f"initdb failed: {init.stderr.strip()[-300:]}")
        options = f"-k {sock} -c listen_addresses='' -c fsync=off"
        start = subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "-t", "60", "start"]),
                               capture_output=True, text=True, timeout=120)
        if start.returncode != 0:
            log = (root / "log").read_text(errors="replace")[-300:] if (root / "log").exists() else ""
            pytest.skip(f"the PostgreSQL server did not start: {start.stderr.strip()[-300:]} {log}")
        try:
            yield f"postgresql+psycopg://postgres@/{{db}}?host={sock}"
        finally:
            subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]), capture_output=True, timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(base: str) -> str:
    """Create an empty database on the server at `base` (as `postgres_server` yields it); its URL."""
    import psycopg

    name = f"attnbench_{os.getpid()}_{next(_names)}"
    host = base.split("host=", 1)[1]
    with psycopg.connect(dbname="postgres", user="postgres", host=host, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.format(db=name)


@pytest.fixture(scope="session")
def postgres_base() -> Iterator[str]:
    """A PostgreSQL server for the whole session (skips when none can be started), as a URL template."""
    with postgres_server() as base:
        yield base
