"""Nothing a user types hangs: what cannot finish is refused in one line before the work starts, and only
regular files are read (opening a FIFO for reading blocks until a writer comes, which may be never).

Each row must end within its timeout with exit 2 and one line naming the limit or the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_runs import refused
from tests.run_folders import make_run, tiny_suite

CASE_ID = "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32"


def _toml(tmp: Path, text: str) -> Path:
    path = tmp / "big.toml"
    path.write_text(text)
    return path


def grid_of_ten_million(tmp: Path) -> list[str]:
    """A few long lists whose product is 10^7 cases."""
    ints = lambda n, start=1: json.dumps(list(range(start, start + n)))  # noqa: E731
    return ["run", "--suite", str(_toml(tmp, f"[[grid]]\nB = {ints(10)}\nS = {ints(100, 16)}\nH = {ints(100)}\nd_k = {ints(100, 8)}\n")),
            "--out", str(tmp / "out"), "--quiet"]


def grids_summing_past_the_limit(tmp: Path) -> list[str]:
    """Many small grids, each fine alone: 2,000 of 100 cases each."""
    one = "[[grid]]\nB = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nS = 16\nH = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nd_k = 8\n"
    return ["check", "--suite", str(_toml(tmp, one * 2000))]


def suite_file_of_many_megabytes(tmp: Path) -> list[str]:
    return ["run", "--suite", str(_toml(tmp, "[[grid]]\nB = [" + "1, " * 2_000_000 + "1]\nS = 16\nH = 1\nd_k = 8\n")), "--quiet"]


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _fifo_in_run(name: str, command: str):
    def setup(tmp: Path) -> list[str]:
        run = make_run(tmp / "r1")
        _fifo(run / name)
        if command == "report":
            return ["report", str(run), "--out", str(tmp / "reports")]
        if command == "recommend":
            return ["recommend", str(run), "--seq", "16"]
        if command == "compare":
            return ["compare", str(make_run(tmp / "base")), str(run), "--out", str(tmp / "cmp.csv")]
        return ["run", "--resume", str(run), "--quiet"]
    setup.__name__ = f"{command}_with_{name}_a_fifo"
    return setup


def suite_file_a_fifo(tmp: Path) -> list[str]:
    return ["run", "--suite", str(_fifo(tmp / "suite.toml")), "--out", str(tmp / "out"), "--quiet"]


def _flag(name: str, argv: list[str]):
    def setup(tmp: Path) -> list[str]:
        return [a.replace("SUITE", str(tiny_suite(tmp / "tiny.toml"))).replace("OUT", str(tmp / "out")) for a in argv]
    setup.__name__ = name
    return setup


def resume_with_a_trillion_workers(tmp: Path) -> list[str]:
    return ["run", "--resume", str(make_run(tmp / "r1")), "--workers", str(10**12), "--quiet"]


CASES = [
    (grid_of_ten_million, ["10,000,000 cases", "100,000"]),
    (grids_summing_past_the_limit, ["grid #1001", "100,000"]),
    (suite_file_of_many_megabytes, ["big.toml", "bytes"]),
    (suite_file_a_fifo, ["suite.toml", "FIFO"]),
    *[(_fifo_in_run(name, command), [name, "FIFO"])
      for name, commands in (("records.jsonl", ("report", "compare", "recommend", "resume")), ("env.json", ("report", "compare", "resume")),
                             ("peaks.json", ("report", "recommend")), ("manifest.json", ("report", "resume")))
      for command in commands],
    (_flag("workers_a_billion", ["run", "--suite", "SUITE", "--out", "OUT", "--workers", str(10**9), "--quiet"]), ["--workers", "per CPU"]),
    (resume_with_a_trillion_workers, ["--workers 1000000000000"]),
    (_flag("profile_a_billion_steps", ["profile", CASE_ID, "--backend", "naive", "--device", "cpu", "--steps", str(10**9)]), ["--steps", "10,000"]),
    (_flag("profile_steps_just_past", ["profile", CASE_ID, "--backend", "naive", "--device", "cpu", "--steps", "10001"]), ["--steps", "10,000"]),
    (_flag("stability_a_million_processes", ["stability", CASE_ID, "--backend", "naive", "--device", "cpu", "--processes", str(10**6)]),
     ["--processes", "1,000"]),
    (_flag("stability_processes_just_past", ["stability", CASE_ID, "--backend", "naive", "--device", "cpu", "--processes", "1001"]),
     ["--processes", "1,000"]),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("setup, words", CASES, ids=[c[0].__name__ for c in CASES])
def test_what_cannot_finish_is_refused_first(tmp_path, capsys, setup, words):
    refused(capsys, setup(tmp_path), words)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # refused before any run folder was made
