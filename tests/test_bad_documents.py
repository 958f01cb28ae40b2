"""Bad documents the harness reads beside its runs give one line naming the file (exit 2), never a hang or a traceback.

One table per kind of badness: files that are not regular files or are too large (given as `--variation`),
JSON nested past the parser's depth (a variation, an existing `stability --out` target, a manifest beside a
suite), and variation documents that are well-formed but absurd or contradict themselves, or runs whose
env.json cannot show the variation is their device's. Each table runs through the CLI in process.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from harness.analysis.difference import Variation
from harness.checks.stability import coefficient_of_variation
from tests.cli_runs import attnbench_in_process, refused
from tests.run_folders import CASES, make_run

MEDIANS = (1.0, 1.03, 0.97, 1.02, 0.98)
#: What each command needs besides `--variation FILE`, given the run folders `runs(tmp_path)` makes.
COMMANDS = {
    "compare": lambda base, new, tmp: ["compare", str(base), str(new), "--out", str(tmp / "c.csv")],
    "recommend": lambda base, new, tmp: ["recommend", str(base), "--seq", "16"],
    "report": lambda base, new, tmp: ["report", str(base), str(new), "--out", str(tmp / "reports")],
}


def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Two hand-built run folders of the tiny suite on the synthetic CPU."""
    return make_run(tmp_path / "base"), make_run(tmp_path / "new")


def variation_doc(**changes) -> dict:
    """A variation document as `stability --out` writes it for the runs' device, with `changes` applied (None: field removed)."""
    good = Variation(coefficient_of_variation(MEDIANS), "cpu", "synthetic CPU", CASES[0].id, "sdpa-math", MEDIANS).to_dict()
    good.update(changes)
    return {k: v for k, v in good.items() if v is not None}


def test_a_good_variation_document_is_taken_by_every_command(tmp_path, capsys):
    base, new = runs(tmp_path)
    path = tmp_path / "stability.json"
    path.write_text(json.dumps(variation_doc()))
    for command in COMMANDS.values():
        ran = attnbench_in_process(command(base, new, tmp_path) + ["--variation", str(path)], capsys)
        assert ran.code == 0, ran.err


# -- 1. not a regular file, or too large: refused before (or without) waiting on it ------------------------------------

def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe.json")  # no writer ever comes: an open() that waits blocks forever
    return tmp / "pipe.json"


def _socket(tmp: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp / "sock.json"))  # the socket file stays after the close, as a server that died leaves it
    return tmp / "sock.json"


def _linked_fifo(tmp: Path) -> Path:
    os.symlink(_fifo(tmp), tmp / "link.json")
    return tmp / "link.json"


def _folder(tmp: Path) -> Path:
    (tmp / "folder.json").mkdir()
    return tmp / "folder.json"


def _huge(tmp: Path) -> Path:
    # A valid variation padded past 10 MB: read whole, today it is even accepted.
    (tmp / "huge.json").write_text(json.dumps(variation_doc()) + " " * (10 * 2**20 + 1))
    return tmp / "huge.json"


NOT_REGULAR = [
    # id, makes the file in a folder, words the message must contain
    ("fifo", _fifo, ["FIFO"]),
    ("fifo-behind-a-link", _linked_fifo, ["FIFO"]),
    ("dev-zero", lambda tmp: Path("/dev/zero"), ["character device"]),
    ("dev-full", lambda tmp: Path("/dev/full"), ["character device"]),
    ("unix-socket", _socket, ["socket"]),
    ("folder", _folder, ["folder"]),
    ("over-10MB", _huge, ["bytes, more than"]),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("make, words", [c[1:] for c in NOT_REGULAR], ids=[c[0] for c in NOT_REGULAR])
def test_a_variation_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, capsys, command, make, words):
    base, new = runs(tmp_path)
    path = make(tmp_path)
    refused(capsys, COMMANDS[command](base, new, tmp_path) + ["--variation", str(path)], ["--variation", str(path), *words])


# -- 2. JSON nested deeper than the parser goes -------------------------------------------------------------------------

DEPTH = 60_000


def _mixed(depth: int) -> str:
    """Objects and lists alternating, `depth` deep."""
    return '{"a": [' * (depth // 2) + "1" + "]}" * (depth // 2)


DEEP = [
    # id, the document's text
    ("objects-and-lists", _mixed(DEPTH)),
    ("objects-only", '{"k": ' * DEPTH + "null" + "}" * DEPTH),
    ("lists-of-objects", '[{"x": ' * (DEPTH // 2) + "0" + "}]" * (DEPTH // 2)),
    ("deep-field-in-a-variation", json.dumps(variation_doc())[:-1] + ', "note": ' + _mixed(DEPTH) + "}"),
    ("deep-after-a-kind", '{"kind": "attnbench run-to-run variation", "x": ' + "[" * DEPTH + "]" * DEPTH + "}"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("text", [c[1] for c in DEEP], ids=[c[0] for c in DEEP])
def test_a_variation_nested_past_the_parser_is_one_line(tmp_path, capsys, command, text):
    base, new = runs(tmp_path)
    path = tmp_path / "deep.json"
    path.write_text(text)
    refused(capsys, COMMANDS[command](base, new, tmp_path) + ["--variation", str(path)], ["--variation", str(path), "nested too deep"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", [c[1] for c in DEEP], ids=[c[0] for c in DEEP])
def test_a_stability_out_target_nested_past_the_parser_is_one_line(tmp_path, capsys, monkeypatch, text):
    monkeypatch.setattr("harness.checks.stability.run_stability", lambda *a, **k: pytest.fail("measured before refusing --out"))
    path = tmp_path / "stability.json"
    path.write_text(text)
    argv = ["stability", CASES[0].id, "--backend", "sdpa-math", "--device", "cpu", "--out", str(path)]
    refused(capsys, argv, ["--out", str(path), "is not a variation attnbench wrote"])
    assert path.read_text() == text  # never overwritten


BATCH_SUITE = '[[grid]]\nbatch = ["2xfile:lengths.txt"]\nlayout = ["packed"]\nH = [2]\nd_k = [16]\n'


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", [c[1] for c in DEEP], ids=[c[0] for c in DEEP])
def test_a_manifest_beside_a_suite_nested_past_the_parser_is_one_line(tmp_path, capsys, text):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "lengths.txt").write_text("8 16\n")
    (folder / "mine.toml").write_text(BATCH_SUITE)
    (folder / "manifest.json").write_text(text)
    argv = ["run", "--suite", str(folder / "mine.toml"), "--device", "cpu", "--out", str(tmp_path / "results"), "--quiet"]
    refused(capsys, argv, [str(folder / "mine.toml"), str(folder / "manifest.json"), "nested too deep"])
    assert not (tmp_path / "results").exists()


# -- 6. well-formed but absurd, self-contradictory, or not checkable against the runs' device ----------------------------

BAD_VARIATIONS = [
    # id, the document's changes, words the message must contain
    ("cv-1e300", {"cv": 1e300}, ["'cv'"]),
    ("cv-negative", {"cv": -0.1}, ["'cv'"]),
    ("cv-nan", {"cv": float("nan")}, ["'cv'"]),
    ("cv-infinity", {"cv": float("inf")}, ["'cv'"]),
    ("cv-string", {"cv": "0.02"}, ["'cv'"]),
    ("cv-true", {"cv": True}, ["'cv'"]),
    ("cv-0.6-wider-than-the-medians-allow", {"cv": 0.6}, ["'cv'"]),
    ("cv-0-beside-varying-medians", {"cv": 0.0}, ["'cv'", "CV of its own 'medians_ms'"]),
    ("cv-twice-its-medians", {"cv": 2 * coefficient_of_variation(MEDIANS)}, ["'cv'", "CV of its own 'medians_ms'"]),
    ("cv-consistent-but-0.5-or-more", {"cv": coefficient_of_variation([1.0, 10.0]), "medians_ms": [1.0, 10.0], "processes": 2},
     ["'cv'", "0 ms"]),
    ("medians-empty", {"medians_ms": [], "processes": 0}, ["'medians_ms'"]),
    ("medians-one", {"medians_ms": [1.0], "processes": 1}, ["'medians_ms'"]),
    ("medians-negative", {"medians_ms": [-m for m in MEDIANS]}, ["'medians_ms[0]'"]),
    ("medians-zero", {"medians_ms": [0.0, 0.0, 0.0, 0.0, 0.0], "cv": 0.0}, ["'medians_ms[0]'"]),
    ("medians-nan", {"medians_ms": [1.0, float("nan"), 1.0, 1.0, 1.0]}, ["'medians_ms[1]'"]),
    ("medians-string", {"medians_ms": "1.0, 1.03"}, ["'medians_ms'"]),
    ("medians-huge", {"medians_ms": [1e308, 1.7e308], "processes": 2, "cv": 0.3}, ["'medians_ms'"]),
    ("processes-disagree", {"processes": 7}, ["'processes'"]),
    ("processes-text", {"processes": "5"}, ["'processes'"]),
    ("device-type-gpu", {"device_type": "gpu"}, ["'device_type'"]),
    ("device-name-empty", {"device_name": ""}, ["'device_name'"]),
    ("device-name-number", {"device_name": 5}, ["'device_name'"]),
    ("backend-missing", {"backend": None}, ["'backend'"]),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("changes, words", [c[1:] for c in BAD_VARIATIONS], ids=[c[0] for c in BAD_VARIATIONS])
def test_an_absurd_or_self_contradictory_variation_is_refused_naming_the_field(tmp_path, capsys, changes, words):
    base, new = runs(tmp_path)
    path = tmp_path / "stability.json"
    path.write_text(json.dumps(variation_doc(**changes)))  # NaN and Infinity as Python's json writes them
    refused(capsys, COMMANDS["compare"](base, new, tmp_path) + ["--variation", str(path)], ["--variation", str(path), *words])


UNCHECKABLE_ENVS = [
    # id, env.json's `before`, the field the message must name
    ("empty-fingerprint", {}, "before.device_type"),
    ("null-fingerprint", None, "before.device_type"),
    ("no-device-name", {"device_type": "cpu", "torch": "2.x"}, "before.device_name"),
    ("no-device-type", {"device_name": "synthetic CPU", "torch": "2.x"}, "before.device_type"),
    ("empty-device-name", {"device_type": "cpu", "device_name": ""}, "before.device_name"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("before, field", [c[1:] for c in UNCHECKABLE_ENVS], ids=[c[0] for c in UNCHECKABLE_ENVS])
def test_a_variation_is_refused_for_runs_whose_env_cannot_name_the_device(tmp_path, capsys, command, before, field):
    base, new = runs(tmp_path)
    for run in (base, new):
        (run / "env.json").write_text(json.dumps({"before": before, "telemetry_before": None, "telemetry_after": None}))
    path = tmp_path / "stability.json"
    path.write_text(json.dumps(variation_doc()))
    refused(capsys, COMMANDS[command](base, new, tmp_path) + ["--variation", str(path)], [str(path), "env.json", f"'{field}'"])


# -- 1 and 2 beyond the CLI: the JSON the harness reads for itself never blocks or overflows --------------------------------


def _fifo_at(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _deep_at(path: Path) -> Path:
    path.write_text('{"telemetry_before": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return path


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [_fifo_at, _deep_at, lambda p: (p.mkdir(), p)[1]], ids=["fifo", "deep", "folder"])
def test_a_runs_own_documents_that_cannot_be_read_are_not_recorded_never_a_hang_or_a_traceback(tmp_path, make):
    from harness.run.cooldown import idle_temperature_c
    from harness.run.ray_nodes import read_json

    path = make(tmp_path / "env.json")
    assert idle_temperature_c(path, 0) is None
    assert read_json(path) == {}


@pytest.mark.parametrize("cell", ["[" * 50_000 + "]" * 50_000, '{"a": ' * 20_000 + "1" + "}" * 20_000])
def test_a_lengths_cell_nested_past_the_parser_is_one_line(cell):
    from harness.analysis.serving import lengths
    from harness.errors import UserError
    from harness.suite.case_layout import json_lengths

    with pytest.raises(UserError, match="seq_lens_q must be a JSON list of lengths"):
        json_lengths("seq_lens_q", cell)
    assert lengths(cell) is None
