"""`attnbench stability` keeps each process's contention evidence and writes no variation measured beside other work.

The fresh processes are faked at `run_child` (their records say what their counters saw), so what is under test is the
command's reading of those records, never how busy this machine happens to be; one real child checks `--threads`.
"""

from __future__ import annotations

import json

import pytest

from harness.analysis.difference import ProcessEvidence, read_variation
from harness.checks import stability
from harness.checks.stability import coefficient_of_variation
from harness.errors import UserError
from harness.process.children import ChildResult, child_command, run_child
from harness.results.record import Record, Status
from harness.suite.cases import parse_case_id
from tests.cli_runs import assert_one_line_error, attnbench_in_process

CASE_ID = "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32"
QUIET = {"contended": False, "run_queue_wait_ratio": 0.01, "involuntary_switches": 3, "cpu_wall_ratio": 0.97}
BUSY = {"contended": True, "run_queue_wait_ratio": 0.42, "involuntary_switches": 310, "cpu_wall_ratio": 0.55}


def _record(median_ms: float, threads: int = 1, suspect: bool = False, iqr: float = 0.02, **evidence) -> dict:
    """What a stability child prints: its pair's record, measured, with these counters."""
    record = Record(case=parse_case_id(CASE_ID, "cpu"), backend="naive", status=Status.OK, latency_ms_median=median_ms,
                    latency_ms_min=median_ms * 0.99, latency_ms_max=median_ms * 1.01, samples=40, iterations=1,
                    iqr_ratio=iqr, noisy=iqr >= 0.10, suspect=suspect, threads=threads, **{**QUIET, **evidence})
    return record.to_dict()


@pytest.fixture
def children(monkeypatch):
    """Fake the fresh processes: each call of run_child answers the next of the records put in the returned list."""
    answers, started = [], []

    def fake(command, timeout_s=None, env=None):
        started.append(list(command))
        return ChildResult(0, (answers.pop(0),), "")

    monkeypatch.setattr(stability, "run_child", fake)
    monkeypatch.setattr("harness.env.fingerprint", lambda device: {"device_type": device, "device_name": "synthetic CPU"})
    return answers, started


def _stability(capsys, tmp_path, *extra):
    out = tmp_path / "var" / "stability.json"
    ran = attnbench_in_process(["stability", CASE_ID, "--backend", "naive", "--device", "cpu", "--processes", "5", "--out", out, *extra],
                               capsys)
    return ran, out


def test_a_contended_process_is_printed_with_its_evidence_and_no_variation_is_written(children, capsys, tmp_path):
    answers, _ = children
    answers += [_record(7.1), _record(7.1, **BUSY), _record(7.11), _record(7.09, **BUSY), _record(7.1)]
    ran, out = _stability(capsys, tmp_path)
    assert_one_line_error(ran, "2 of 5 processes were contended", "process 2, 4",
                          "a variation measured under contention would widen every interval by the other work's noise")
    assert "process 2: median 7.1 ms, contended: 0.42 thread-s waiting per s, 310 preemptions" in ran.out
    assert "process 1: median 7.1 ms, quiet: 0.01 thread-s waiting per s, 3 preemptions" in ran.out
    assert "within this box's run-to-run noise" not in ran.out and "variation:" not in ran.out
    assert not out.exists() and not out.parent.exists()


def test_a_suspect_process_or_one_beside_another_gpu_process_refuses_too(children, capsys, tmp_path):
    answers, _ = children
    answers += [_record(7.1), _record(9.0, suspect=True, iqr=0.31), _record(7.1),
                _record(7.2, contended=True, gpu_other_processes=2, run_queue_wait_ratio=None, involuntary_switches=None), _record(7.1)]
    ran, out = _stability(capsys, tmp_path)
    assert_one_line_error(ran, "2 of 5 processes were contended or suspect (process 2, 4)")
    assert "process 2: median 9 ms, quiet: 0.01 thread-s waiting per s, 3 preemptions; suspect: IQR 31 % of the median" in ran.out
    assert "process 4: median 7.2 ms, contended: 2 other processes on the GPU" in ran.out
    assert not out.exists()


def test_a_quiet_run_writes_the_variation_with_each_process_evidence_and_the_threads(children, capsys, tmp_path):
    answers, started = children
    medians = [7.1, 7.12, 7.08, 7.1, 7.11]
    answers += [_record(m, threads=2) for m in medians]
    ran, out = _stability(capsys, tmp_path, "--threads", "2")
    assert ran.code == 0, ran.err
    assert all(command[-2:] == ["--threads", "2"] for command in started) and len(started) == 5
    assert "5 fresh processes, 2 threads each:" in ran.out and "process 5: median 7.11 ms, quiet:" in ran.out
    document = json.loads(out.read_text())
    assert document["threads"] == 2 and len(document["per_process"]) == 5
    assert document["per_process"][0] == {"median_ms": pytest.approx(7.1), "contended": False, "suspect": False,
                                          "run_queue_wait_ratio": 0.01, "involuntary_switches": 3, "cpu_wall_ratio": 0.97,
                                          "iqr_ratio": 0.02, "threads": 2, "gpu_other_processes": None}
    variation = read_variation(out)
    assert variation.threads == 2 and variation.per_process[2] == ProcessEvidence(
        median_ms=pytest.approx(7.08), contended=False, suspect=False, run_queue_wait_ratio=0.01, involuntary_switches=3,
        cpu_wall_ratio=0.97, iqr_ratio=0.02, threads=2)
    assert "2 threads" in variation.describe()


def test_a_variation_written_before_the_evidence_was_kept_still_reads(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kind": "attnbench run-to-run variation", "cv": coefficient_of_variation([7.1, 7.12, 7.08]), "device_type": "cpu",
                                "device_name": "synthetic CPU", "case_id": CASE_ID, "backend": "naive", "processes": 3,
                                "medians_ms": [7.1, 7.12, 7.08]}))
    variation = read_variation(path)
    assert variation.medians_ms == (7.1, 7.12, 7.08) and variation.threads is None and variation.per_process is None
    assert variation.describe().startswith("run-to-run variation 0.28 % (CV of 3 fresh processes' medians")


@pytest.mark.parametrize("change, words", [
    ({"per_process": [{"median_ms": 7.1, "contended": True}, {"median_ms": 7.12}]}, ["per_process[0].contended", "contended or suspect"]),
    ({"per_process": [{"median_ms": 7.1}]}, ["'per_process'", "a list of 2 objects"]),
    ({"per_process": [{"median_ms": 7.1}, {"median_ms": 9.0}]}, ["per_process[1].median_ms", "its process's median"]),
    ({"per_process": [{"median_ms": 7.1, "involuntary_switches": 2.5}, {"median_ms": 7.12}]}, ["per_process[0].involuntary_switches"]),
    ({"threads": 0}, ["'threads'", "from 1"]),
], ids=["contended-process", "too-few", "wrong-median", "fractional-switches", "zero-threads"])
def test_evidence_that_stability_could_not_have_written_is_one_line(tmp_path, change, words):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"kind": "attnbench run-to-run variation", "cv": coefficient_of_variation([7.1, 7.12]), "device_type": "cpu",
                                "device_name": "synthetic CPU", "case_id": CASE_ID, "backend": "naive", "medians_ms": [7.1, 7.12],
                                **change}))
    with pytest.raises(UserError) as refusal:
        read_variation(path)
    message = str(refusal.value)
    assert "\n" not in message and message.startswith(f"--variation {path}: field") and all(w in message for w in words), message


def test_bad_threads_are_refused_before_any_process_starts(children, capsys, tmp_path):
    ran, out = _stability(capsys, tmp_path, "--threads", "0")
    assert_one_line_error(ran, "--threads")
    assert children[1] == [] and not out.exists()


@pytest.mark.slow
def test_the_stability_job_times_with_the_threads_it_was_given():
    done = run_child(child_command("stability", CASE_ID, "--device", "cpu", "--backend", "naive", "--measure-s", "0.02", "--threads", "1"),
                     timeout_s=300)
    assert done.ok, done.describe()
    record = Record.from_dict(done.objects[-1])
    assert record.threads == 1 and record.status is Status.OK
    assert stability.evidence_of(record).threads == 1 and stability.evidence_of(record).median_ms == record.latency_ms_median


def test_the_noise_band_stability_prints_is_the_difference_rules_own(children, capsys, tmp_path):
    """stability once printed a band of its own (2·√2·CV) beside the rule compare, recommend and report apply (±2·CV
    intervals that must not overlap): the printed band is now where that rule starts to call two medians different."""
    import re

    from harness.analysis.difference import differ

    answers, _ = children
    answers += [_record(m) for m in (7.0, 7.3, 6.8, 7.2, 7.05)]
    ran, out = _stability(capsys, tmp_path)
    assert ran.code == 0, ran.err
    cv = read_variation(out).cv
    band = float(re.search(r"a difference below ([\d.]+) % is within this box's run-to-run noise", ran.out)[1]) / 100
    point = lambda ms: {"latency_ms_ci95_low": ms, "latency_ms_ci95_high": ms}  # noqa: E731 - a median known to a point
    assert not differ(point(10.0), point(10.0 * (1 + band - 0.002)), cv)
    assert differ(point(10.0), point(10.0 * (1 + band + 0.002)), cv)
