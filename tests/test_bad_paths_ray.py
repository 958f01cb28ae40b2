"""Bad user-given addresses and paths through the real CLI: a Ray address that is no Ray, a repro of a repro's lengths file,
and a lengths file that is there but cannot be read. Each is exit 2 and one line `attnbench: error: ...` naming what it is.

The Ray servers are plain TCP servers on 127.0.0.1 in a thread of the test, each closed at the test's end; the bound on
reaching an address is set to 1.5 s through ATTNBENCH_RAY_CONNECT_TIMEOUT_S so that a silent server costs seconds.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shlex
import socket
import struct
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from harness.cli.main import main
from harness.results.store import read_records
from tests.cli_runs import assert_one_line_error, attnbench_in_process, refused, write_suite

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None and not os.environ.get("CI"), reason="ray is not installed")
#: Spelled out, not imported: the file must load (and its tests fail one by one) on an attnbench without the bound.
CONNECT_TIMEOUT_ENV = "ATTNBENCH_RAY_CONNECT_TIMEOUT_S"


# -- 3: a Ray address that answers, but not as Ray ---------------------------------------------------------------------

def _silent(conn: socket.socket) -> None:
    conn.recv(4096)  # reads the preface, answers nothing: held open until the test closes the server


def _silent_unread(conn: socket.socket) -> None:
    pass  # never reads, never answers


def _http1(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\nhello")


def _redis(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"-ERR unknown command 'PRI'\r\n")


def _ssh_banner(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")


def _close(conn: socket.socket) -> None:
    conn.close()


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST, not FIN
    conn.close()


@contextmanager
def _server(handle: Callable[[socket.socket], None] | None) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that runs `handle` on each connection, until the block ends; its HOST:PORT (None: a closed port)."""
    if handle is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"127.0.0.1:{port}"
        return
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop, conns = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():  # bounded by the test: the block's end sets stop
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            conns.append(conn)
            conn.settimeout(10)
            try:
                handle(conn)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in conns:
            conn.close()
        listener.close()


@pytest.mark.ray
@needs_ray
@pytest.mark.timeout(30)
@pytest.mark.parametrize("handle, reason", [
    (_silent, "sent nothing within 1.5 s"),
    (_silent_unread, "sent nothing within 1.5 s"),
    (_http1, "answers in HTTP/1"),
    (_redis, "is not gRPC"),
    (_ssh_banner, "is not gRPC"),
    (_close, "closed it without answering"),
    (_reset, "Connection reset by peer"),
    (None, "Connection refused"),
], ids=["silent", "silent-unread", "http1", "redis", "ssh-banner", "close", "reset", "refused"])
def test_an_address_that_is_no_ray_is_one_line_in_seconds(tmp_path, capsys, monkeypatch, handle, reason):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1.5")
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    with _server(handle) as address:
        ran = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path, "--executor", "ray", "--ray-address", address, "--quiet"],
                                   capsys)
    err = assert_one_line_error(ran)
    assert address in err and reason in err, err
    assert not (tmp_path / "one").exists()


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_bad_connect_bound_is_one_line(tmp_path, capsys, monkeypatch, value):
    pytest.importorskip("ray")
    from harness.run import ray_nodes

    assert ray_nodes.CONNECT_TIMEOUT_S == 30.0 and ray_nodes.CONNECT_TIMEOUT_ENV == CONNECT_TIMEOUT_ENV  # the documented default
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, value)
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    refused(capsys, ["run", "--suite", suite, "--out", tmp_path, "--executor", "ray", "--ray-address", "127.0.0.1:9", "--quiet"],
            [f"{CONNECT_TIMEOUT_ENV}={value!r}: expected a positive number of seconds"])


# -- 5: a repro of a repro of a row whose lengths come from a user's file -----------------------------------------------

def _batch_suite(folder: Path, batch: str, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    grid = [f"batch = [{batch!r}]".replace("'", '"'), 'layout = ["packed"]', "H = [2]", "d_k = [16]"]
    return write_suite(folder / "mine.toml", ["naive"], grid=grid)


def _only_row(run_dir: Path) -> dict:
    (row,) = read_records(run_dir / "records.jsonl").records
    return row


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("batch, files, repros", [
    ("4xfile:lengths.txt", {"lengths.txt": "5 3\n12 1\n"}, 2),
    ("2x8 + 3x1@file:data/kv.txt", {"data/kv.txt": "# a cache histogram\n40 2\n64\n"}, 2),
    ("3x4@file:lengths.txt", {"lengths.txt": "16\n24\n"}, 3),
], ids=["histogram", "subfolder-kv", "three-deep"])
def test_a_repro_of_a_repro_rerecords_the_pair(tmp_path, capsys, monkeypatch, batch, files, repros):
    user = tmp_path / "user"
    user.mkdir()
    suite = _batch_suite(user, batch, files)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path / "runs"), "--run-id", "r0", "--device", "cpu", "--quiet"]) == 0
    first = _only_row(tmp_path / "runs" / "r0")
    row = first
    for depth in range(1, repros + 1):
        words = shlex.split(row["repro"])
        args = words[words.index("harness") + 1:]
        code = main([*args, "--out", str(tmp_path / "runs"), "--run-id", f"r{depth}", "--quiet"])
        assert code == 0, capsys.readouterr().err
        row = _only_row(tmp_path / "runs" / f"r{depth}")
        assert (row["case_id"], row["backend"], row["status"]) == (first["case_id"], first["backend"], "ok")


# -- 8: a lengths file that is there but is no readable file -------------------------------------------------------------

def _guarded(code: int) -> Callable:
    """A stand-in for os.stat that refuses (`code`) any path named guarded.txt: root reads everything, so a refusal is faked."""
    real = os.stat

    def stat(path, *args, **kwargs):
        if os.fspath(path).endswith("guarded.txt"):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real(path, *args, **kwargs)
    return stat


def _make(tmp: Path, kind: str) -> str:
    """Make the bad path `kind` in `tmp`; the name the suite gives."""
    if kind == "two-link-loop":
        os.symlink("b.txt", tmp / "a.txt")
        os.symlink("a.txt", tmp / "b.txt")
        return "a.txt"
    if kind == "loop-in-folder":
        os.symlink("loopdir", tmp / "loopdir")
        return "loopdir/lengths.txt"
    if kind == "dangling-link":
        os.symlink("gone.txt", tmp / "link.txt")
        return "link.txt"
    if kind == "file-as-folder":
        (tmp / "plain.txt").write_text("8\n")
        return "plain.txt/lengths.txt"
    if kind == "long-part":
        return "L" * 300 + ".txt"
    if kind == "long-path":
        return "d/" * 2100 + "x.txt"
    if kind == "folder":
        (tmp / "hist.d").mkdir()
        return "hist.d"
    if kind == "fifo":
        os.mkfifo(tmp / "pipe.txt")
        return "pipe.txt"
    return "guarded.txt"  # the refusals


@pytest.mark.parametrize("kind, says", [
    ("two-link-loop", "is a loop of symbolic links"),
    ("loop-in-folder", "is a loop of symbolic links"),
    ("dangling-link", "is a symbolic link to gone.txt, which does not exist"),
    ("file-as-folder", "a part of its path is a file, not a folder"),
    ("long-part", "has a name too long"),
    ("long-path", "has a name too long"),
    ("folder", "is a folder, not a lengths file"),
    ("fifo", "is a FIFO (named pipe), not a lengths file"),
    ("eacces", "permission denied"),
    ("eperm", "permission denied"),
])
def test_a_lengths_file_that_cannot_be_read_says_what_it_is(tmp_path, capsys, monkeypatch, kind, says):
    name = _make(tmp_path, kind)
    suite = _batch_suite(tmp_path, f"4xfile:{name}", {})
    if kind in ("eacces", "eperm"):
        monkeypatch.setattr(os, "stat", _guarded(errno.EACCES if kind == "eacces" else errno.EPERM))
    err = refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "runs"), "--device", "cpu", "--quiet"])
    assert says in err, err
    if "does not exist" not in says:
        assert "does not exist" not in err, err
    assert not (tmp_path / "runs").exists()
