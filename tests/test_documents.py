"""The documents beside a run's records (manifest.json, env.json, peaks.json) are read through one typed reader:
whatever is in them, `report`, `recommend`, `compare` and `run --resume` answer in one line naming the file and
the field, never with a traceback; and a run folder written before the marker existed still reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_runs import refused
from tests.run_folders import make_run

DEEP = "[" * 100_000 + "]" * 100_000


def _edit(name: str, change):
    """A change to one document of a fresh run: a text to write, or a function of the parsed document."""
    def apply(run: Path) -> None:
        path = run / name
        path.write_text(change if isinstance(change, str) else json.dumps(change(json.loads(path.read_text()))))
    return apply


def _set(name: str, **fields):
    return _edit(name, lambda doc: {**doc, **fields})


def _peak(**entry):
    return _edit("peaks.json", lambda doc: {**doc, "matmul": {"fp32": {**doc["matmul"]["fp32"], **entry}}})


ANALYSED = ("report", "recommend")
DOCUMENTS = [
    # id, the change, the commands that read it, words of the message
    ("manifest-a-string", _edit("manifest.json", '"r1"'), ANALYSED, ["manifest.json", "expected a JSON object, got a string"]),
    ("manifest-a-number", _edit("manifest.json", "42"), ANALYSED, ["manifest.json", "got a number"]),
    ("manifest-null", _edit("manifest.json", "null"), ANALYSED, ["manifest.json", "got null"]),
    ("manifest-truncated", _edit("manifest.json", '{"run_id": "r1", "backe'), ANALYSED, ["manifest.json", "not valid JSON"]),
    ("manifest-nested-deep", _edit("manifest.json", DEEP), ANALYSED, ["manifest.json", "nested too deep"]),
    ("manifest-capabilities-a-list", _set("manifest.json", capabilities=["naive"]), ANALYSED, ["'capabilities'", "expected an object"]),
    ("manifest-capability-a-string", _set("manifest.json", capabilities={"naive": {"baseline": "yes"}}), ANALYSED,
     ["'capabilities.naive.baseline'", "true or false"]),
    ("manifest-attempt-wall-text", _set("manifest.json", attempts=[{"started_utc": "x", "wall_s": "ten"}]), ANALYSED,
     ["'attempts[0].wall_s'", "a finite number"]),
    ("manifest-backends-a-string", _set("manifest.json", backends="naive"), ANALYSED, ["'backends'", "a list"]),
    ("manifest-suite-copy-escapes", _set("manifest.json", suite_copy="../../elsewhere.toml"), ("resume",), ["'suite_copy'", "file name"]),
    ("manifest-pairs-a-string", _set("manifest.json", pairs="all"), ("resume",), ["'pairs'", "a list"]),
    ("manifest-pairs-of-numbers", _set("manifest.json", pairs=[1, 2]), ("resume",), ["'pairs[0]'", "a string"]),
    ("manifest-pairs-unknown", _set("manifest.json", pairs=["B9-no-such-pair-naive"]), ("resume",), ["'pairs'", "B9-no-such-pair-naive"]),
    ("manifest-device-tpu", _set("manifest.json", device="tpu"), ("resume",), ["'device'", "'cpu' or 'cuda'"]),
    ("manifest-run-id-missing", _edit("manifest.json", lambda d: {k: v for k, v in d.items() if k != "run_id"}), ("resume",), ["'run_id' is missing"]),
    ("env-a-list", _edit("env.json", "[1]"), (*ANALYSED, "resume"), ["env.json", "got a list"]),
    ("env-before-a-list", _set("env.json", before=["cpu"]), ANALYSED, ["env.json", "'before'", "an object"]),
    ("env-device-name-a-list", _set("env.json", before={"device_name": ["a", "b"]}), (*ANALYSED, "compare"), ["'before.device_name'"]),
    ("env-torch-an-object", _set("env.json", before={"device_name": "x", "torch": {"v": 2}}), ("compare",), ["'before.torch'"]),
    ("env-telemetry-a-string", _set("env.json", telemetry_before="hot"), ANALYSED, ["'telemetry_before'", "an object"]),
    ("env-telemetry-of-numbers", _set("env.json", telemetry_after=[1, 2]), ANALYSED, ["'telemetry_after[0]'"]),
    ("env-telemetry-index-a-list", _set("env.json", telemetry_before=[{"index": [0]}]), ANALYSED, ["'telemetry_before[0].index'"]),
    ("env-nodes-a-list", _set("env.json", nodes=["n1"]), ANALYSED, ["'nodes'"]),
    ("env-truncated", _edit("env.json", '{"before": {"dev'), (*ANALYSED, "resume"), ["env.json", "not valid JSON"]),
    ("env-nested-deep", _edit("env.json", '{"before": ' + DEEP + "}"), ("report", "resume"), ["env.json", "nested too deep"]),
    ("peaks-a-number", _edit("peaks.json", "3.5"), ANALYSED, ["peaks.json", "got a number"]),
    ("peaks-negative", _peak(tflops=-1.0), ANALYSED, ["'matmul.fp32.tflops'", "a positive number"]),
    ("peaks-a-string-peak", _peak(tflops="fast"), ANALYSED, ["'matmul.fp32.tflops'"]),
    ("peaks-zero", _peak(tflops=0), ANALYSED, ["'matmul.fp32.tflops'", "positive"]),
    ("peaks-matmul-a-list", _set("peaks.json", matmul=[1.0]), ANALYSED, ["'matmul'", "an object"]),
    ("peaks-copy-a-string", _set("peaks.json", copy="fast"), ANALYSED, ["'copy'", "an object"]),
    ("peaks-copy-bytes-null", _set("peaks.json", copy={"bytes": None, "gbps": 10.0}), ANALYSED, ["'copy.bytes'"]),
    ("peaks-gbps-infinite-as-text", _set("peaks.json", copy={"bytes": 1, "gbps": "inf"}), ANALYSED, ["'copy.gbps'"]),
    ("peaks-errors-numbers", _set("peaks.json", errors={"copy": 5}), ANALYSED, ["'errors.copy'", "a string"]),
    ("peaks-truncated", _edit("peaks.json", '{"matmul": {"fp32": {"tfl'), ANALYSED, ["peaks.json", "not valid JSON"]),
    ("peaks-nested-deep", _edit("peaks.json", DEEP), ANALYSED, ["peaks.json", "nested too deep"]),
]
ROWS = [(f"{row_id}-{command}", change, command, words) for row_id, change, commands, words in DOCUMENTS for command in commands]


def _argv(command: str, run: Path, tmp: Path) -> list[str]:
    return {"report": ["report", str(run), "--out", str(tmp / "reports")], "recommend": ["recommend", str(run), "--seq", "16"],
            "compare": ["compare", str(make_run(tmp / "base")), str(run), "--out", str(tmp / "cmp.csv")],
            "resume": ["run", "--resume", str(run), "--quiet"]}[command]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change, command, words", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_damaged_document_is_one_line_naming_file_and_field(tmp_path, capsys, change, command, words):
    run = make_run(tmp_path / "r1")
    change(run)
    refused(capsys, _argv(command, run, tmp_path), words)


def test_report_out_in_a_link_loop_is_one_line(tmp_path, capsys):
    run = make_run(tmp_path / "r1")
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    refused(capsys, ["report", str(run), "--out", str(tmp_path / "loop-a")], ["--out", "loop-a"])
    refused(capsys, ["compare", str(run), str(run), "--out", str(tmp_path / "loop-a")], ["--out", "loop-a"])


@pytest.mark.parametrize("opening, closing", [("x = " + "[" * 10_000, "]" * 10_000), ("x = " + "{a = " * 10_000 + "1", "}" * 10_000)],
                         ids=["arrays", "inline-tables"])
def test_toml_nested_past_the_recursion_limit_is_one_line(tmp_path, capsys, opening, closing):
    suite = tmp_path / "deep.toml"
    suite.write_text(opening + closing + "\n")
    refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--quiet"], ["deep.toml", "nested too deep"])


def test_the_stored_h200_documents_and_an_older_manifest_still_read():
    """The documents of a real run (an older manifest: no marker, no uuid) read, typed, and come back as they were."""
    from harness.results.documents import Environment, Manifest, Peaks, read_document

    data = Path("/work/shared/data/h200-2026-11-29")
    if not data.exists():
        pytest.skip("the stored H200 run is not on this machine")
    manifest = read_document(data / "manifest.json", Manifest)
    assert manifest.harness is None and manifest.run_problem() is None and manifest.device == "cuda"
    assert manifest.to_dict() == json.loads((data / "manifest.json").read_text())
    env = read_document(data / "env.json", Environment)
    assert env.before["device_name"] == "NVIDIA H200" and isinstance(env.telemetry_before, list)
    assert env.to_dict() == json.loads((data / "env.json").read_text())
    peaks = read_document(data / "peaks.json", Peaks)
    assert peaks.matmul["bf16"]["tflops"] > 100 and peaks.copy["gbps"] > 1000

