"""A sweep on a machine with other work still answers: a thread count that leaves room, and flagged rows measured again.

`make bench` beside other work ended with 480 of 480 rows contended and no answer: it timed on every core and never
measured a flagged row twice. A CPU run given no --threads now takes a thread per core other work left idle, and the
rows left contended, suspect or throttled are measured once more at the end, through the same worker loop; the new
row replaces the first for every reader while the first stays in records.jsonl.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.analysis.compare import compare_runs
from harness.history.ingest import read_run
from harness.measure.threads import auto_threads, busy_cores, choose_threads, cpu_times
from harness.results.store import read_records
from harness.run import protocol
from harness.run.remeasure import REMEASURE_FLOOR_S, allowed_s, evidence, read_plan, to_remeasure, write_plan
from harness.run.worker import WorkerLoop
from harness.suite.cases import Case
from tests.cli_runs import ROOT, attnbench, cli_env, write_suite
from tests.run_folders import make_run
from tests.synthetic_runs import synthetic_record

CASE = Case(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=16, d_v=16)
STAT = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 {busy0} 0 0 {idle0} 0 0 0 0 0 0\ncpu1 {busy1} 0 0 {idle1} 0 0 0 0 0 0\n"


# -- the thread count ---------------------------------------------------------------------------------------------------

def test_a_cpu_run_takes_a_thread_per_core_other_work_left_idle():
    assert auto_threads(default=2, cores=2, busy=1.05) == 1  # one CPU-bound process beside it on two cores
    assert auto_threads(default=2, cores=2, busy=0.1) == 2  # idle: torch's default, as before
    assert auto_threads(default=8, cores=8, busy=30.0) == 1  # never below one
    assert auto_threads(default=4, cores=16, busy=0.0) == 4  # never above torch's default


def test_the_load_is_read_from_proc_stat_on_this_process_s_cores_and_the_choice_is_recorded():
    texts = iter([STAT.format(busy0=0, idle0=0, busy1=0, idle1=0), STAT.format(busy0=100, idle0=0, busy1=10, idle1=90)])
    cores, busy = busy_cores(0.0, read=lambda: next(texts), sleep=lambda s: None)
    assert cores == len(os.sched_getaffinity(0))
    if sorted(os.sched_getaffinity(0)) == [0, 1]:
        assert busy == pytest.approx(2 * 110 / 200)  # cpu0 all busy, cpu1 a tenth: 1.1 cores
    assert cpu_times([7], STAT.format(busy0=1, idle0=1, busy1=1, idle1=1)) is None  # a core /proc/stat does not list
    threads, chosen = choose_threads(2, (2, 1.1))
    assert threads == 1 and chosen["threads"] == 1 and chosen["busy_cores"] == 1.1 and chosen["torch_default"] == 2
    assert choose_threads(2, None)[0] == 2  # /proc/stat unreadable: torch's default, and the manifest says why


# -- one row per pair for every reader -------------------------------------------------------------------------------------

def _row(backend: str, ms: float, *, contended: bool = False, status: str = "ok", first=None, run_id: str = "r"):
    record = synthetic_record(CASE, backend, ms, status=status, run_id=run_id)
    record.contended, record.time_pair_s = contended, ms / 100
    if first is not None:
        record.remeasured_from = evidence(first)
    return record


def _write(path: Path, records) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return path


def test_a_re_measured_row_replaces_its_first_row_for_every_reader_and_the_first_stays_in_the_file(tmp_path):
    first = _row("sdpa", 9.0, contended=True)
    again = _row("sdpa", 4.0, first=first)
    run = _write(tmp_path / "r", [first, _row("naive", 6.0), again])
    result = read_records(run)
    # In the first row's place: readers keep the run's order.
    assert [(r["backend"], r["latency_ms_median"]) for r in result.records] == [("sdpa", 4.0), ("naive", 6.0)]
    assert [r["latency_ms_median"] for r in result.superseded] == [9.0]  # nothing lost: set aside, with its evidence in the new row
    assert result.records[0]["remeasured_from"]["contended"] is True and result.records[0]["remeasured_from"]["latency_ms_median"] == 9.0
    assert len((run / "records.jsonl").read_text().splitlines()) == 3
    assert result.remeasured_keys() == {f"{CASE.id}-sdpa"} and to_remeasure(result) == []  # a resumed run measures it no third time


def test_a_re_measure_that_failed_leaves_the_measured_row_standing(tmp_path):
    first = _row("sdpa", 9.0, contended=True)
    result = read_records(_write(tmp_path / "r", [first, _row("sdpa", 0.0, status="oom", first=first)]))
    assert [(r["status"], r["latency_ms_median"]) for r in result.records] == [("ok", 9.0)]
    assert [r["status"] for r in result.superseded] == ["oom"] and to_remeasure(result) == []


def test_rows_of_a_pair_without_a_re_measure_are_all_kept_as_before(tmp_path):
    result = read_records(_write(tmp_path / "r", [_row("sdpa", 9.0, run_id="a"), _row("sdpa", 4.0, run_id="b")]))
    assert len(result.records) == 2 and result.superseded == ()


def test_compare_and_db_add_see_one_row_per_pair(tmp_path):
    base = make_run(tmp_path / "base")
    new = make_run(tmp_path / "new")
    rows = [json.loads(line) for line in (new / "records.jsonl").read_text().splitlines()]
    first = {**rows[0], "latency_ms_median": 1.9, "contended": True}
    again = {**rows[0], "remeasured_from": {"latency_ms_median": 1.9, "contended": True}}
    (new / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [first, *rows[1:], again]))
    result = compare_runs(base, new, 0.05)
    assert len(result.table) == 4 and result.judged == 4 and not result.failed
    ingested = read_run(new)
    assert len(ingested.rows) == 4 and ingested.run["rows"] == 4
    assert sum(1 for row in ingested.rows if json.loads(row["record_json"]).get("remeasured_from")) == 1


# -- the plan and the one worker loop --------------------------------------------------------------------------------------

def test_the_worker_loop_stamps_a_re_measured_pair_with_its_first_row_s_evidence(tmp_path):
    first = _row("sdpa", 9.0, contended=True)
    cheap = _row("naive", 1.0, contended=True)
    assert [r.backend for r in to_remeasure(read_records(_write(tmp_path / "r", [first, cheap, _row("x", 1.0)])))] == ["naive", "sdpa"]
    keys = write_plan(tmp_path, [first])
    plan = read_plan(tmp_path)
    assert keys == [first.pair_key] and plan[first.pair_key]["latency_ms_median"] == 9.0
    (tmp_path / protocol.REMEASURE).unlink()
    assert read_plan(tmp_path) == {}  # the sweep itself stamps nothing

    class Loop(WorkerLoop):
        def run_pair(self, case, backend_name, **kwargs):
            return _row(backend_name, 3.0)

    loop = Loop("r", "0", runner=None, registry=None, remeasure=plan)  # type: ignore[arg-type]
    events = list(loop.events([(first.pair_key, CASE, "sdpa"), (f"{CASE.id}-naive", CASE, "naive")]))
    records = [e.record for e in events if hasattr(e, "record")]
    assert records[0].remeasured_from["contended"] is True and records[1].remeasured_from is None


def test_re_measuring_may_take_half_the_run_s_time_and_a_floor_for_a_worker_s_start():
    assert allowed_s(600.0) == 300.0 and allowed_s(1.0) == REMEASURE_FLOOR_S


# -- a real sweep ------------------------------------------------------------------------------------------------------------

#: Makes every row of the sweep contended and suspect, and measures the re-measure with the flags out of reach: the plan's
#: file (protocol.REMEASURE) tells a worker which phase it serves, as it tells the worker loop.
_FIRST_PASS_BUSY = '''def busy(registry):
    import math, os, sys
    import harness.measure.contention as contention
    import harness.measure.stats as stats

    run_dir = sys.argv[sys.argv.index("--run-dir") + 1] if "--run-dir" in sys.argv else None
    again = run_dir is not None and os.path.exists(os.path.join(run_dir, "remeasure.json"))
    contention.CONTENDED_RUN_WAIT = contention.CONTENDED_SWITCH_RATE = math.inf if again else -1.0
    stats.SUSPECT_IQR = math.inf if again else -1.0
'''


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_sweep_measures_its_flagged_rows_again_and_a_row_keeps_its_flag_only_if_the_re_measure_has_it(tmp_path):
    (tmp_path / "busy_plugin.py").write_text(_FIRST_PASS_BUSY)
    env = cli_env(tmp_path, ATTNBENCH_BACKENDS="busy_plugin:busy", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    suite = write_suite(tmp_path / "tiny.toml", ["naive", "sdpa"], [8])
    done = attnbench(["run", "--suite", suite, "--device", "cpu", "--out", tmp_path / "results", "--run-id", "r"], env, timeout_s=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "re-measured 2 of 2 flagged rows at the end of the sweep: 2 now unflagged, 0 flagged again" in done.stdout, done.stdout
    assert "progress: re-measure: 2/2 pairs" in done.stderr  # a captured stderr is not a terminal: lines, not a bar
    run = tmp_path / "results" / "r"
    result = read_records(run)
    assert len(result.records) == 2 and len(result.superseded) == 2
    assert all(r["contended"] is False and r["suspect"] is False for r in result.records)
    assert all(r["remeasured_from"]["contended"] is True and r["remeasured_from"]["suspect"] is True for r in result.records)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["threads"] == manifest["threads_chosen"]["threads"] >= 1 and manifest["remeasure"] is True
    assert {r["threads"] for r in result.records} == {manifest["threads"]}
    assert not (run / protocol.REMEASURE).exists()
    csv_rows = (run / "records.csv").read_text().splitlines()
    assert len(csv_rows) == 3  # the header and one row per pair


#: Every row of the sweep contended; a worker that starts on the re-measure dies at its first pair (a segfault).
_DIES_ON_THE_REMEASURE = '''def busy(registry):
    import os, signal, sys
    import harness.measure.contention as contention
    import harness.run.worker as worker

    contention.CONTENDED_RUN_WAIT = contention.CONTENDED_SWITCH_RATE = -1.0
    run_dir = sys.argv[sys.argv.index("--run-dir") + 1] if "--run-dir" in sys.argv else None
    if run_dir is not None and os.path.exists(os.path.join(run_dir, "remeasure.json")):
        worker.WorkerLoop.run_pair = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGSEGV)
'''


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_worker_that_dies_on_a_re_measure_leaves_the_first_row_standing(tmp_path):
    (tmp_path / "busy_plugin.py").write_text(_DIES_ON_THE_REMEASURE)
    env = cli_env(tmp_path, ATTNBENCH_BACKENDS="busy_plugin:busy", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    suite = write_suite(tmp_path / "tiny.toml", ["naive", "sdpa"], [8])
    done = attnbench(["run", "--suite", suite, "--device", "cpu", "--out", tmp_path / "results", "--run-id", "r"], env, timeout_s=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "while measuring" in done.stderr and "again: its first row stands" in done.stderr
    assert "re-measured 0 of 2 flagged rows" in done.stdout and "2 contended" in done.stdout, done.stdout
    result = read_records(tmp_path / "results" / "r")
    assert len(result.records) == 2 and result.superseded == () and all(r["contended"] is True for r in result.records)
