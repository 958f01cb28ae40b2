"""The one worker loop (harness.run.worker): what it reads from the run folder, claims, the .current file, exit codes.

In process and on tiny CPU pairs; the supervised end-to-end paths (kill -9, restarts, timeouts) are
tests/test_reliability.py's and tests/test_hangs.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.backends.registry import load_registry
from harness.execution.execute import PairRunner
from harness.results.store import read_records
from harness.run import protocol
from harness.run.rundir import RunFolder
from harness.run.worker import Finished, Started, WorkerLoop, folder_loop, main
from harness.results.record import pair_key
from harness.suite.catalog import load_suite
from tests.cli_runs import write_suite


def make_folder(tmp_path: Path, backends: list[str], sizes: list[int], **manifest: object) -> RunFolder:
    """A run folder as the supervisor leaves it before starting workers: manifest, frozen suite, claims/ and pending.txt."""
    suite_path = write_suite(tmp_path / "tiny.toml", backends, sizes)
    keys = [pair_key(c, b) for c, b in load_suite(str(suite_path)).on_device("cpu").pairs(backends)]
    fields = {"run_id": "run", "suite": "tiny", "suite_arg": str(suite_path), "suite_copy": None, "device": "cpu",
              "backends": backends, "pairs": keys, "check": False, **manifest}
    folder = RunFolder.create(tmp_path / "run", fields, force=False, suite_file=str(suite_path))
    folder.unlock()
    (folder.path / protocol.CLAIMS).mkdir()
    (folder.path / protocol.PENDING).write_text("".join(f"{k}\n" for k in keys))
    return folder


def test_a_worker_runs_the_pending_pairs_in_order_and_appends_each_stamped_row(tmp_path, one_thread):
    folder = make_folder(tmp_path, ["naive", "sdpa"], [8, 16])
    assert main(["--run-dir", str(folder.path), "--worker", "w1"]) == 0
    rows = read_records(folder.path / "records.jsonl").records
    assert [f"{r['case_id']}-{r['backend']}" for r in rows] == folder.manifest["pairs"]
    assert {r["status"] for r in rows} == {"ok"} and {r["worker"] for r in rows} == {"w1"}
    assert all(r["agree"] is None for r in rows)  # the manifest's check: false reached the worker
    assert all(r["repro"] and r["order_in_case"] is not None for r in rows)  # stamped from the manifest
    assert protocol.current_path(folder.path, "w1").read_text() == ""  # emptied after the last row
    assert sorted(p.name for p in (folder.path / protocol.CLAIMS).iterdir()) == sorted(
        str(protocol.claim_path(folder.path, k).name) for k in folder.manifest["pairs"])


def test_a_second_worker_on_the_same_pending_list_runs_only_what_nobody_claimed(tmp_path, one_thread):
    folder = make_folder(tmp_path, ["naive"], [8, 16, 24])
    first = folder.manifest["pairs"][0]
    assert protocol.try_claim(folder.path, first, "other")
    assert main(["--run-dir", str(folder.path), "--worker", "w2"]) == 0
    rows = read_records(folder.path / "records.jsonl").records
    assert [f"{r['case_id']}-{r['backend']}" for r in rows] == folder.manifest["pairs"][1:]


def test_the_worker_reads_budget_phases_and_cooldown_from_the_manifest(tmp_path):
    folder = make_folder(tmp_path, ["naive"], [8], check=True, timer="kernels", energy=True, profile=True, traces=True,
                         cooldown_s=45.0)
    loop = folder_loop(folder, "0", folder.pairs(), registry=load_registry())
    phases = loop.runner.phases
    assert (phases.check, phases.timer, phases.energy, phases.profile) == (True, "kernels", True, True)
    assert phases.traces == folder.path / protocol.TRACES
    assert loop.runner.budget == load_suite(folder.suite_arg).on_device("cpu").budget  # the suite's TOML budget, not a default
    assert loop.cooldown is not None and loop.cooldown.max_s == 45.0


def test_worker_usage_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--worker", "0"]) == 2
    assert main(["--run-dir", str(tmp_path / "nowhere"), "--worker", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "--run-dir" in err and "nowhere" in err and "Traceback" not in err


def test_a_backend_the_worker_cannot_load_is_an_error_row_not_a_dead_worker(tmp_path):
    folder = make_folder(tmp_path, ["naive"], [8])
    registry = load_registry()
    case, _ = next(iter(folder.pairs().values()))
    loop = WorkerLoop("run", "w", PairRunner(), registry)
    events = list(loop.events([(pair_key(case, "no-such-backend"), case, "no-such-backend")]))
    assert [type(e) for e in events] == [Started, Finished]
    record = events[1].record
    assert record.status.value == "error" and "cannot load backend no-such-backend" in record.reason


def test_a_pair_that_poisons_the_process_ends_the_loop_with_its_row_written(tmp_path, monkeypatch):
    import harness.run.worker as worker_module

    folder = make_folder(tmp_path, ["naive"], [8, 16])
    loop = folder_loop(folder, "w", folder.pairs(), registry=load_registry())
    # A sticky CUDA error cannot be raised on a CPU: the first pair's row says it, as the executor writes it.
    monkeypatch.setattr(worker_module, "poisons_process", lambda record: record.case.S_q == 8)
    said: list[str] = []
    code = worker_module.serve(folder, loop, worker_module.pending_pairs(folder, folder.pairs()), said.append)
    assert code == protocol.EXIT_STICKY and "exiting for a restart" in said[0]
    rows = read_records(folder.path / "records.jsonl").records
    assert [r["S_q"] for r in rows] == [8]  # written before the exit; the second pair is left for a fresh worker


def test_a_row_that_cannot_be_appended_stops_the_worker_with_its_exit_code(tmp_path, monkeypatch):
    import harness.run.worker as worker_module

    folder = make_folder(tmp_path, ["naive"], [8, 16])
    loop = folder_loop(folder, "w", folder.pairs(), registry=load_registry())

    def full(self, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(worker_module.RunWriter, "append", full)
    said: list[str] = []
    code = worker_module.serve(folder, loop, worker_module.pending_pairs(folder, folder.pairs()), said.append)
    assert code == protocol.EXIT_CANNOT_WRITE and "No space left" in said[0]
    # The pair it could not write is still named current: the supervisor stops the run and says so once.
    assert protocol.current_path(folder.path, "w").read_text() == folder.manifest["pairs"][0]


def test_the_manifest_keeps_the_workers_fields_typed(tmp_path):
    folder = make_folder(tmp_path, ["naive"], [8], energy=True, cooldown_s=30.0)
    on_disk = json.loads((folder.path / "manifest.json").read_text())
    assert on_disk["energy"] is True and on_disk["cooldown_s"] == 30.0
    from harness.results.documents import Manifest

    with pytest.raises(Exception, match="cooldown_s"):
        Manifest.from_dict({**on_disk, "cooldown_s": "soon"}, "manifest.json")


def test_the_supervisor_gives_a_worker_only_what_is_its_process_own(tmp_path):
    import os
    import sys

    from harness.run.workers import Slot, worker_command

    folder = make_folder(tmp_path, ["naive"], [8], energy=True, cooldown_s=30.0, timer="graph")
    command = worker_command(folder, Slot("gpu1", {"CUDA_VISIBLE_DEVICES": "1"}), 2**30)
    assert command == [sys.executable, "-m", "harness.child", "worker", "--run-dir", str(folder.path), "--worker", "gpu1",
                       "--parent-pid", str(os.getpid()), "--memory-limit", str(2**30)]


def test_the_process_start_up_is_paid_before_the_first_pair_is_timed_not_by_it(monkeypatch):
    """A process's first backward starts the autograd engine (434 ms against 1.6 ms warm): the worker pays it before any pair."""
    import harness.run.worker as worker
    from harness.process import warmup as process_warmup
    from harness.suite.cases import Case

    order = []
    monkeypatch.setattr(worker, "warm_process", lambda: order.append("warm"))
    monkeypatch.setattr(worker, "execute", lambda case, backend, runner, run_id, name: order.append("pair") or
                        worker.case_record(case, backend, run_id, name))
    loop = WorkerLoop("run", "w", PairRunner(), load_registry())
    case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, mode="bwd")
    loop.run_pair(case, "naive")
    loop.run_pair(case, "naive")
    assert order == ["warm", "pair", "warm", "pair"]  # asked before every pair; the warm-up itself runs once per process
    monkeypatch.setattr(process_warmup, "_warmed", False)
    process_warmup.warm_process()
    assert process_warmup._warmed
