"""`attnbench check --json` says what the text form says, as data, with the same exit status; `backends`' columns line up."""

from __future__ import annotations

import json
import re

import pytest

from harness.backends.registry import load_registry
from tests.cli_runs import attnbench_in_process

WRONG = "tests.wrong_backends:add_all"
SUITE = """
name = "tiny-json"
device = "cpu"
[[grid]]
B = [2]
S = [16]
H = [4]
H_kv = [4, 2]
d_k = [16]
dtype = ["fp32", "bf16"]
causal = [false, true]
"""

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def suite(tmp_path) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text(SUITE)
    return str(path)


def table_rows(out: str) -> list[list[str]]:
    """The text table's rows (header and summary left out), each split into its words."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["case", "backend"]) + 1
    end = next(i for i, line in enumerate(lines) if re.match(r"^\d+ pairs:", line))
    return [line.split() for line in lines[start:end]]


@pytest.mark.parametrize("backends, code", [("naive,sdpa", 0), ("naive,wrong-gqa", 1)])
def test_check_json_holds_every_pair_of_the_text_form_and_exits_as_it_does(capsys, monkeypatch, suite, backends, code):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", WRONG)
    text = attnbench_in_process(["check", "--suite", suite, "--backends", backends], capsys)
    ran = attnbench_in_process(["check", "--suite", suite, "--backends", backends, "--json"], capsys)
    assert (text.code, ran.code) == (code, code), (text.out, ran.err)
    pairs = json.loads(ran.out)  # the whole of stdout is the document: the summary and notes went to stderr
    rows = table_rows(text.out)
    assert len(pairs) == len(rows) == 8 * 2
    shown = {"agree": "yes", "disagree": "NO"}
    assert [(p["case_id"], p["backend"], shown.get(p["verdict"], p["verdict"])) for p in pairs] == [(r[0], r[1], r[4]) for r in rows]
    for pair in pairs:
        assert {"case_id", "backend", "dtype", "mode", "status", "agree", "max_abs_err", "err_bound", "reason"} <= set(pair)
        assert pair["dtype"] in pair["case_id"] and pair["mode"] == "fwd" and pair["status"] == "ok"
        assert pair["agree"] is (pair["max_abs_err"] <= pair["err_bound"])
    failed = {p["case_id"] for p in pairs if p["failed"]}
    assert failed == set(re.findall(r"^FAILED (\S+) \[wrong-gqa\]", ran.err, flags=re.M))
    assert failed == ({p["case_id"] for p in pairs if "-Hkv2-" in p["case_id"] and p["backend"] == "wrong-gqa"} if code else set())
    assert f"{len(pairs)} pairs:" in ran.err


def test_check_json_sends_the_not_checked_backends_to_stderr(capsys, suite):
    ran = attnbench_in_process(["check", "--suite", suite, "--backends", "naive,sdpa-efficient", "--json", "--dtype", "fp32"], capsys)
    assert ran.code == 0
    assert {p["backend"] for p in json.loads(ran.out)} == {"naive"}
    assert "sdpa-efficient: unavailable, not checked" in ran.err


def test_backends_columns_line_up_whatever_the_longest_family(capsys):
    ran = attnbench_in_process(["backends"], capsys)
    assert ran.code == 0
    lines = ran.out.splitlines()
    rows = load_registry().describe()
    assert len(lines) == len(rows) and max(len(r.family) for r in rows) > 8  # flash-attn, flashinfer: past the old 8 columns
    family_at = {line.index(row.family, len(row.name)) for line, row in zip(lines, rows)}
    state_at = {re.search(r"(?<![\w-])(unavailable:|available)", line[len(row.name):]).start() + len(row.name)
                for line, row in zip(lines, rows)}
    assert len(family_at) == 1 and len(state_at) == 1, ran.out
