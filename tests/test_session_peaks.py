"""The session's CPU ceilings are measured once per machine: a kept measurement is taken exactly when a run would take it."""

import json

import pytest

from harness.telemetry import peaks
from tests.session_peaks import session_peaks

DTYPES = ("fp32", "bf16", "fp16")


@pytest.fixture
def measured(monkeypatch):
    """Stand in for a new measurement and count the calls: each returns a peaks dict marked with its call number."""
    calls = []

    def measure(device, dtypes, cases=(), threads=None):
        calls.append((device, tuple(dtypes)))
        return {"new_measurement": len(calls)}

    monkeypatch.setattr(peaks, "measure_peaks", measure)
    return calls


def test_a_kept_measurement_of_this_machine_is_taken_and_nothing_is_measured(tmp_path, peaks_measured_once, measured):
    kept = tmp_path / "peaks.json"
    kept.write_text(peaks_measured_once.read_text())  # a real measurement of this machine, this torch, these threads
    assert session_peaks(tmp_path, DTYPES) == kept.read_text()
    assert measured == []


@pytest.mark.parametrize("change", ["torch", "host", "threads", "dtype", "damaged"])
def test_a_kept_measurement_a_run_would_refuse_is_measured_anew_and_replaced(tmp_path, peaks_measured_once, measured, change):
    stored = json.loads(peaks_measured_once.read_text())
    if change == "torch":
        stored["torch"] = "1.0.0"
    elif change == "host":
        stored["machine"] = {**stored["machine"], "host": "another-host"}
    elif change == "threads":
        stored["torch_threads"] = stored["torch_threads"] + 7
    elif change == "dtype":
        del stored["matmul"]["bf16"]
    kept = tmp_path / "peaks.json"
    kept.write_text("{not json" if change == "damaged" else json.dumps(stored))
    text = session_peaks(tmp_path, DTYPES)
    assert json.loads(text) == {"new_measurement": 1}
    assert measured == [("cpu", DTYPES)]
    assert kept.read_text() == text  # kept for the next session
    assert [p.name for p in tmp_path.iterdir()] == ["peaks.json"]  # no partial file left beside it


def test_without_a_cache_folder_the_session_measures_and_keeps_nothing(tmp_path, measured):
    assert json.loads(session_peaks(None, DTYPES)) == {"new_measurement": 1}
    assert session_peaks(None, DTYPES) and len(measured) == 2
    assert list(tmp_path.iterdir()) == []


def test_a_pytest_started_by_a_test_takes_its_outer_sessions_file_before_its_cache(tmp_path, peaks_measured_once, measured):
    inherited = tmp_path / "outer-session-peaks.json"
    inherited.write_text(peaks_measured_once.read_text())
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "peaks.json").write_text(json.dumps(json.loads(peaks_measured_once.read_text()), indent=1))  # as valid, other text
    assert session_peaks(cache, DTYPES, inherited) == inherited.read_text()
    assert measured == []


def test_an_inherited_file_a_run_would_refuse_is_not_taken(tmp_path, peaks_measured_once, measured):
    stored = json.loads(peaks_measured_once.read_text())
    stored["torch_threads"] = stored["torch_threads"] + 7
    inherited = tmp_path / "outer-session-peaks.json"
    inherited.write_text(json.dumps(stored))
    assert json.loads(session_peaks(None, DTYPES, inherited)) == {"new_measurement": 1}
    assert json.loads(session_peaks(None, DTYPES, tmp_path / "missing.json")) == {"new_measurement": 2}
