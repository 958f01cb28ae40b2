"""`run --peaks`: a run takes ceilings measured earlier on this machine only where they can be its own, and says so."""

from __future__ import annotations

import json

import pytest
import torch

from harness.run import rundir
from harness.telemetry import peaks as device_peaks
from harness.telemetry.peaks_reuse import PEAKS_ENV, machine
from tests.cli_runs import attnbench_in_process, refused, write_suite

#: A measurement as this machine's measure_peaks leaves it (the sweep left out), one thread.
MEASURED = {"device": "cpu", "measured_utc": "2026-12-03T07:00:00+00:00", "timer": "perf_counter", "torch": torch.__version__,
            "torch_threads": 1, "statistic": "best sample (fastest call)",
            "matmul": {"fp32": {"product": "256×256·256×256", "tflops": 0.2, "contended": True},
                       "bf16": {"product": "256×256·256×256", "tflops": 0.05, "contended": False}},
            "copy": {"bytes": 64, "gbps": 10.0, "contended": False}, "errors": {}}


def stored(tmp_path, **changes):
    """A peaks.json of this machine (or one changed as `changes` say) in its own folder."""
    folder = tmp_path / "earlier"
    folder.mkdir(exist_ok=True)
    path = folder / "peaks.json"
    path.write_text(json.dumps({**MEASURED, "machine": machine("cpu"), **changes}))
    return path


def measured_here(monkeypatch):
    """Make measuring the ceilings leave a marker, so a test sees whether the run measured or took."""
    calls = []

    def fake(device, dtypes, cases=(), threads=None):
        calls.append(list(dtypes))
        return {"device": device, "matmul": {d: {"tflops": 1.0} for d in dtypes}, "copy": {"bytes": 1, "gbps": 1.0}, "errors": {},
                "measured": "here"}

    monkeypatch.setattr(device_peaks, "measure_peaks", fake)
    return calls


def test_a_matching_measurement_is_taken_whole_with_its_contended_flags_and_its_source(tmp_path, monkeypatch):
    calls = measured_here(monkeypatch)
    source = stored(tmp_path)
    peaks = json.loads(rundir.write_peaks(tmp_path, "cpu", ["fp32", "bf16"], threads=1, source=source).read_text())
    assert calls == []  # nothing measured
    assert peaks["reused_from"] == {"path": str(source.resolve()), "measured_utc": MEASURED["measured_utc"]}
    assert peaks["matmul"] == MEASURED["matmul"] and peaks["copy"] == MEASURED["copy"]
    assert peaks["matmul"]["fp32"]["contended"] is True  # a ceiling measured beside other work stays called so


@pytest.mark.parametrize("changes, dtypes, threads, words", [
    ({}, ["fp32"], 2, ["measured with 1 threads", "times with 2"]),
    ({"torch": "2.0.0"}, ["fp32"], 1, ["torch 2.0.0", torch.__version__]),
    ({"machine": {"host": "elsewhere", "cpu": "another CPU"}}, ["fp32"], 1, ["elsewhere"]),
    ({"machine": None}, ["fp32"], 1, ["an unnamed machine"]),  # written before peaks.json named its machine
    ({"device": "cuda"}, ["fp32"], 1, ["measured on 'cuda'", "this run is on 'cpu'"]),
    ({}, ["fp32", "fp16"], 1, ["no fp16 ceiling"]),
    ({"errors": {"copy": "RuntimeError: no"}}, ["fp32"], 1, ["failed in part", "copy"]),
    ({"reused_from": {"path": "/x/peaks.json"}}, ["fp32"], 1, ["itself a copy"]),
], ids=["threads", "torch", "machine", "unnamed-machine", "device", "dtype", "errors", "copy-of-copy"])
def test_a_measurement_that_cannot_be_this_runs_is_measured_anew_and_the_file_says_why(tmp_path, monkeypatch, changes, dtypes, threads,
                                                                                      words):
    calls = measured_here(monkeypatch)
    source = stored(tmp_path, **changes)
    peaks = json.loads(rundir.write_peaks(tmp_path, "cpu", dtypes, threads=threads, source=source).read_text())
    assert calls == [dtypes] and peaks["measured"] == "here" and "reused_from" not in peaks
    assert peaks["reuse_refused"].startswith(str(source))
    for word in words:
        assert word in peaks["reuse_refused"], (word, peaks["reuse_refused"])


def test_a_run_given_peaks_takes_them_and_a_run_given_none_measures_its_own(tmp_path, capsys, monkeypatch):
    suite = write_suite(tmp_path / "tiny.toml", ["naive"], [16])
    source = stored(tmp_path)
    monkeypatch.delenv(PEAKS_ENV, raising=False)
    for run_id, extra in (("taken", ["--peaks", str(source.parent)]), ("own", [])):
        ran = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path / "results", "--run-id", run_id, "--threads", "1",
                                    "--no-remeasure", *extra], capsys)
        assert ran.code == 0, ran.err
    taken = json.loads((tmp_path / "results" / "taken" / "peaks.json").read_text())
    own = json.loads((tmp_path / "results" / "own" / "peaks.json").read_text())
    assert taken["reused_from"]["path"] == str(source.resolve()) and taken["matmul"] == MEASURED["matmul"]
    assert "reused_from" not in own and "reuse_refused" not in own and own["machine"] == machine("cpu")
    assert own["matmul"]["fp32"]["tflops"] > 0 and own["torch_threads"] == 1


def test_the_variable_is_the_default_and_the_flag_wins(tmp_path, capsys, monkeypatch):
    calls = measured_here(monkeypatch)
    suite = write_suite(tmp_path / "tiny.toml", ["naive"], [16])
    monkeypatch.setenv(PEAKS_ENV, str(tmp_path / "missing"))
    err = refused(capsys, ["run", "--suite", suite, "--out", tmp_path / "results"], [PEAKS_ENV, "missing", "no peaks.json"])
    assert "--peaks" not in err.split(":")[1]
    ran = attnbench_in_process(["run", "--suite", suite, "--out", tmp_path / "results", "--run-id", "flag", "--threads", "1",
                                "--no-remeasure", "--peaks", stored(tmp_path)], capsys)
    assert ran.code == 0, ran.err
    assert calls == [] and "reused_from" in json.loads((tmp_path / "results" / "flag" / "peaks.json").read_text())


def test_bad_peaks_arguments_are_one_line(tmp_path, capsys):
    suite = write_suite(tmp_path / "tiny.toml", ["naive"], [16])
    out = ["--out", tmp_path / "results"]
    refused(capsys, ["run", "--suite", suite, *out, "--peaks", tmp_path / "nowhere"], ["--peaks", "nowhere", "no peaks.json"])
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "peaks.json").write_text("{not json")
    refused(capsys, ["run", "--suite", suite, *out, "--run-id", "d", "--peaks", tmp_path / "damaged"], ["peaks.json"])
    assert not (tmp_path / "results" / "d").exists()  # refused before the run folder is made: the same command runs once fixed
    refused(capsys, ["run", "--resume", tmp_path / "results" / "d", "--peaks", tmp_path / "damaged"], ["--resume", "--peaks"])
