"""Reliability of `attnbench run`: every failure is simulated for real (see tests/failing_backends.py), never mocked.

The sweeps run the real CLI in subprocesses on tiny TOML suites with tiny budgets; the whole file
takes about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from harness.run import protocol
from harness.backends.registry import ENV_VAR, load_registry
from harness.suite.cases import Case, grid, parse_case_id
from harness.cli.main import main
from harness.errors import UserError
from harness.results.store import read_records
from harness.execution.execute import PairRunner, Phases, execute
from harness.run.worker import poisons_process
from harness.errors import is_sticky_cuda_error
from harness.suite.catalog import load_suite

from tests.cli_runs import PLUGIN, ROOT, attnbench_in_process, cli_env, executions, is_dead, keys, rows, write_suite


# -- the sweep of the "done when": crash, hang, OOM (raised and real) among normal pairs ---------------------------


@pytest.mark.e2e
def test_sweep_survives_crash_hang_oom_and_sticky_error(tmp_path, capsys, monkeypatch):
    # --no-remeasure: these runs count each pair's executions and each worker's attempts; a busy machine's flagged rows,
    # measured again at the end (tests/test_busy_machine.py), would add to both.
    # A plugin that raises at import sits in the same run: listed unavailable, its pairs unsupported.
    (tmp_path / "broken_plugin.py").write_text("raise ImportError('broken on purpose at import')\n")
    backends = ["naive", "t-segv", "t-hang", "t-oom", "t-alloc", "t-sticky", "t-unsup", "t-probe", "broken_plugin:Backend"]
    suite = write_suite(tmp_path / "sweep.toml", backends, [16, 32])
    env = cli_env(tmp_path, **{ENV_VAR: f"{PLUGIN},broken_plugin:Backend", "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    monkeypatch.syspath_prepend(str(tmp_path))  # what PYTHONPATH gives a process that starts with it
    done = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "sweep", "--timeout", "8",
                                 "--memory-limit", "1GiB", "--quiet", "--no-remeasure"], capsys, env=env, monkeypatch=monkeypatch)
    assert done.code == 0, done.err
    records = rows(tmp_path / "sweep")
    assert sorted(keys(records)) == sorted(json.loads((tmp_path / "sweep" / "manifest.json").read_text())["pairs"])
    assert len(records) == len(set(keys(records))) == 18
    status = {(r["S_q"], r["backend"]): r for r in records}
    for backend in backends[:-1]:  # every pair of the normal case is ok, whatever the backend
        assert status[16, backend]["status"] == "ok", status[16, backend]
    assert status[32, "naive"]["status"] == "ok"
    assert status[32, "t-segv"]["status"] == "crashed" and "SIGSEGV" in status[32, "t-segv"]["reason"]
    assert status[32, "t-hang"]["status"] == "timeout" and "8 s time limit" in status[32, "t-hang"]["reason"]
    assert status[32, "t-oom"]["status"] == "oom" and "simulated" in status[32, "t-oom"]["reason"]
    # A real 3 GiB allocation past the 1 GiB cap: the allocator fails with ENOMEM inside the pair → oom, worker lives on.
    assert status[32, "t-alloc"]["status"] == "oom" and "can't allocate memory" in status[32, "t-alloc"]["reason"]
    assert status[32, "t-sticky"]["status"] == "crashed" and status[32, "t-sticky"]["reason"].startswith("sticky CUDA error")
    assert status[32, "t-unsup"]["status"] == "unsupported" and "length 32" in status[32, "t-unsup"]["reason"]
    assert status[32, "t-probe"]["status"] == "error" and "probe bug" in status[32, "t-probe"]["reason"]
    for size in (16, 32):
        broken = status[size, "broken_plugin:Backend"]
        assert broken["status"] == "unsupported" and "broken on purpose at import" in broken["reason"]
    # The segfault, the hang and the sticky error each cost their worker, and a fresh one went on after each (whatever
    # the run's order put after them); every other pair leaves its worker alive for the next.
    executed = [line.split() for line in (tmp_path / "executions.log").read_text().splitlines()]
    killers = {f"B1-Sq32-Skv32-H2-Hkv2-dk16-fp32-t-{name}" for name in ("segv", "hang", "sticky")}
    for (key, pid), (_, next_pid) in zip(executed, executed[1:]):
        assert (pid != next_pid) == (key in killers), (key, executed)
    run_order = [k for k in json.loads((tmp_path / "sweep" / "manifest.json").read_text())["pairs"] if "broken_plugin" not in k]
    restarts = sum(1 for key in killers if run_order.index(key) < len(run_order) - 1)  # none after the last pair
    log = (tmp_path / "sweep" / "worker-0.log").read_text()
    assert "address space capped at" in log
    assert log.count("=== attempt") == 1 + restarts
    csv = (tmp_path / "sweep" / "records.csv").read_text().splitlines()
    assert len(csv) == 1 + 18


# -- kill -9 of the whole run, then --resume; two CPU workers sharing one run --------------------------------------


@pytest.mark.e2e
def test_kill_and_resume_matches_an_uninterrupted_two_worker_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    suite = write_suite(tmp_path / "slow.toml", ["t-slow"], [8, 16, 24, 40, 48, 56])

    # Uninterrupted, two workers sharing the pairs dynamically (each waits for the other at its first pair,
    # so both really take part); every row exactly once.
    whole_dir = tmp_path / "whole"
    whole_dir.mkdir()
    env = cli_env(whole_dir, ATTNBENCH_TEST_PREPARE_S="0.2", ATTNBENCH_TEST_RENDEZVOUS="2")
    ran = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "whole", "--workers", "2", "--quiet", "--no-remeasure"],
                               capsys, env=env, monkeypatch=monkeypatch)
    assert ran.code == 0, ran.err
    whole = rows(tmp_path / "whole")
    assert len(whole) == 6 and len(set(keys(whole))) == 6
    assert {r["status"] for r in whole} == {"ok"}
    assert {r["worker"] for r in whole} == {"0", "1"}
    assert set(executions(whole_dir).values()) == {1}  # no pair ran twice, in either worker

    # The same suite, one worker, killed with SIGKILL after two rows.
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    env = cli_env(killed_dir, ATTNBENCH_TEST_PREPARE_S="0.5")
    run_dir = tmp_path / "run"
    supervisor = subprocess.Popen([sys.executable, "-m", "harness", "run", "--suite", str(suite), "--out", str(tmp_path),
                                   "--run-id", "run", "--quiet", "--no-remeasure"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (run_dir / "records.jsonl").exists() and len((run_dir / "records.jsonl").read_bytes().splitlines()) >= 2:
            break
        assert supervisor.poll() is None, supervisor.stderr.read().decode()
        time.sleep(0.05)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    before = rows(run_dir)
    assert 2 <= len(before) < 6
    # The orphaned worker dies with its supervisor (parent-death signal): nothing writes to the folder any more.
    worker_pids = {int(line.split()[1]) for line in (killed_dir / "executions.log").read_text().splitlines()}
    deadline = time.monotonic() + 10
    while not all(is_dead(p) for p in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(is_dead(p) for p in worker_pids)

    # A second run into the same folder is refused without --force.
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "run", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1

    done = attnbench_in_process(["run", "--resume", str(run_dir), "--quiet"], capsys, env=env, monkeypatch=monkeypatch)
    assert done.code == 0, done.err
    after = rows(run_dir)
    assert after[: len(before)] == before  # finished rows kept as they were
    assert sorted(keys(after)) == sorted(keys(whole))  # the same set of rows as the uninterrupted run
    assert {r["status"] for r in after} == {"ok"}
    ran = executions(killed_dir)
    assert all(ran[k] == 1 for k in keys(before))  # no finished pair ran again
    assert sum(ran.values()) <= 6 + 1  # at most the one pair cut short by the kill ran twice


@pytest.mark.e2e
def test_resume_drops_only_a_truncated_last_line_and_refuses_a_corrupt_file(tmp_path, capsys, monkeypatch):
    suite = write_suite(tmp_path / "three.toml", ["t-slow"], [8, 16, 24])
    env = cli_env(tmp_path, ATTNBENCH_TEST_PREPARE_S="0")
    ran = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "r", "--quiet", "--no-remeasure"], capsys, env=env, monkeypatch=monkeypatch)
    assert ran.code == 0, ran.err
    run_dir = tmp_path / "r"
    full = rows(run_dir)
    raw = (run_dir / "records.jsonl").read_bytes()

    # A kill in the middle of the last write: that line, and only it, is dropped and its pair run again.
    corrupt_dir = tmp_path / "corrupt"
    shutil.copytree(run_dir, corrupt_dir)
    (run_dir / "records.jsonl").write_bytes(raw[:-25])
    result = read_records(run_dir)
    assert result.dropped_partial_line and result.records == full[:2]
    (tmp_path / "executions.log").unlink()
    done = attnbench_in_process(["run", "--resume", str(run_dir), "--quiet"], capsys)
    assert done.code == 0, done.err
    assert executions(tmp_path) == Counter({keys(full)[2]: 1})
    again = rows(run_dir)
    assert again[:2] == full[:2] and keys(again) == keys(full)
    assert b"\n".join((run_dir / "records.jsonl").read_bytes().splitlines()[:2]) == b"\n".join(raw.splitlines()[:2])

    # A bad line that is not the last one is corruption: one line naming the file and the line, exit 2, nothing run.
    lines = raw.splitlines(keepends=True)
    lines[1] = b'{"case_id": "B1-Sq16\n'
    (corrupt_dir / "records.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(UserError, match=r"records\.jsonl:2: corrupt record"):
        read_records(corrupt_dir)
    assert main(["run", "--resume", str(corrupt_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{corrupt_dir / 'records.jsonl'}:2" in err


@pytest.mark.e2e
def test_a_live_run_folder_is_neither_resumed_nor_overwritten(tmp_path, capsys):
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    manifest = {"run_id": "busy", "suite_arg": str(suite), "device": "cpu", "backends": ["naive"], "pairs": []}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    # A worker of an earlier attempt still holds its lock (this test process stands in for it).
    lock = protocol.FolderLock(run_dir / protocol.WORKERS_LOCK)
    lock.shared()
    try:
        start = time.monotonic()
        assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
        assert "live workers" in capsys.readouterr().err
        assert time.monotonic() - start >= 4  # it gave them time to die first
    finally:
        lock.release()
    # A supervisor still runs the folder: neither --resume nor --force touches it.
    lock = protocol.FolderLock(run_dir / protocol.SUPERVISOR_LOCK)
    assert lock.try_exclusive()
    try:
        assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
        assert "in use by another attnbench run" in capsys.readouterr().err
        assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "busy", "--force", "--quiet"]) == 2
        assert "in use by another attnbench run" in capsys.readouterr().err
        assert (run_dir / "manifest.json").exists()  # --force did not delete a folder in use
    finally:
        lock.release()


# -- in the worker: OOM releases memory; sticky errors; unsupported rows -----------------------------------------------


def test_oom_is_recorded_and_its_memory_released_before_the_next_case(monkeypatch):
    from tests.failing_backends import HELD, OomRaiseBackend

    monkeypatch.setenv("ATTNBENCH_TEST_FAIL_S", "32")
    monkeypatch.delenv("ATTNBENCH_TEST_LOG", raising=False)
    case = Case(B=1, S_q=32, S_kv=32, H=2, H_kv=2, d_k=16, d_v=16)
    HELD.clear()
    record = execute(case, OomRaiseBackend(), PairRunner(phases=Phases(check=False)))
    assert record.status == "oom" and "simulated" in record.reason
    assert len(HELD) == 1 and HELD[0]() is None  # the 256 MiB the backend held when it raised is gone already
    # A sticky CUDA error is told from an ordinary one by its message.
    assert is_sticky_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_sticky_cuda_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_sticky_cuda_error(RuntimeError("CUDA error: out of memory"))
    assert not is_sticky_cuda_error(RuntimeError("illegal memory access in my own code"))
    assert not poisons_process(record)


def test_unsupported_and_buggy_probes_become_rows(monkeypatch):
    from tests.failing_backends import StickyBackend, SupportsRaisesBackend, UnsupportedBackend

    monkeypatch.delenv("ATTNBENCH_TEST_LOG", raising=False)
    case = Case(B=1, S_q=32, S_kv=32, H=2, H_kv=2, d_k=16, d_v=16)
    record = execute(case, UnsupportedBackend(), PairRunner(phases=Phases(check=False)))
    assert record.status == "unsupported" and record.reason == "t-unsup serves no sequence of length 32"
    record = execute(case, SupportsRaisesBackend(), PairRunner(phases=Phases(check=False)))
    assert record.status == "error" and "KeyError" in record.reason
    record = execute(case, StickyBackend(), PairRunner(phases=Phases(check=False)))
    assert record.status == "crashed" and poisons_process(record)


# -- plugins ------------------------------------------------------------------------------------------------------------


def test_broken_plugins_are_listed_unavailable_and_do_not_stop_loading(tmp_path, monkeypatch):
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('no such GPU library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, f"raises_at_import:Backend, {PLUGIN}, tests.failing_backends:raise_on_load, nocolon, harness:nothing")
    registry = load_registry()
    rows_by_name = {row.name: row for row in registry.describe()}
    assert {"naive", "t-slow", "t-segv"} <= set(registry.names())
    assert rows_by_name["t-slow"].available
    for spec, error in [("raises_at_import:Backend", "no such GPU library"), ("tests.failing_backends:raise_on_load", "broken on purpose"),
                        ("nocolon", "expected module:attr"), ("harness:nothing", "has no attribute")]:
        assert not rows_by_name[spec].available and error in rows_by_name[spec].reason
        with pytest.raises(UserError, match="failed to load"):
            registry.get(spec)


# -- bad input ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ('[[grid]]\nB = 1\nS = [0]\nH = 2\nd_k = 16\n', "field 'S' has value 0"),
    ('[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\ndtype = "fp8"\n', "field 'dtype' has value 'fp8'"),
    ('[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\ncausal = "yes"\n', "field 'causal' has value 'yes'"),
    ('[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\nmode = "backward"\n', "field 'mode' has value 'backward'"),
    ('seed = -1\n[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n', "field 'seed' has value -1"),
    ('backends = []\n[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n', "field 'backends' has value []"),
    ('[budget]\nmin_rounds = 2.5\n[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n', "budget field 'min_rounds' has value 2.5"),
    ('[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\nflavour = 1\n', "unknown field 'flavour'"),
    ('[[grid]]\nB = 1\nS = 8\nH = 8\nH_kv = 3\nd_k = 16\n', "H_kv=3"),
    ('device = "tpu"\n[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n', "field 'device' has value 'tpu'"),
    ('[budget]\nmeasure_s = "long"\n[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n', "budget field 'measure_s' has value 'long'"),
    ('[[grid]]\nB = 1\nS = 8\nH = 2\n', "missing field 'd_k'"),
    ('name = "x"\n', "no [[grid]]"),
    ('[[grid]\n', "not valid TOML"),
])
def test_invalid_suite_files_name_the_field_and_value(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        load_suite(str(path))
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_invalid_suite_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('[[grid]]\nB = 1\nS = [8, -4]\nH = 2\nd_k = 16\n')
    assert main(["run", "--suite", str(path), "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'S' has value -4" in err
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no run folder was started


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--gpus", "0,1"], "--gpus needs --device cuda"),
    (["--timeout", "0"], "--timeout must be a positive"),
    (["--memory-limit", "lots"], "--memory-limit: not a size"),
])
def test_bad_run_options_are_refused(tmp_path, capsys, args, message):
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--device", "cpu", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "one").exists()


def test_gpus_index_the_gpus_an_inherited_cuda_visible_devices_leaves(monkeypatch):
    from harness.run.workers import worker_slots

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a shared node: GPUs 0 and 1 are someone else's
    slots = worker_slots("cuda", 1, [0, 1], None)
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"]) for s in slots] == [("gpu0", "2"), ("gpu1", "3")]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in worker_slots("cuda", 1, [1], None)] == ["3"]
    with pytest.raises(UserError, match=r"--gpus 2: CUDA_VISIBLE_DEVICES=2,3 leaves this run 2 GPU\(s\)") as refused:
        worker_slots("cuda", 1, [0, 2], None)
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e0a1b2c-0000-1111-2222-333344445555, MIG-7f3d9c1e-aaaa-bbbb-cccc-ddddeeeeffff")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in worker_slots("cuda", 1, [1, 0], None)] == [
        "MIG-7f3d9c1e-aaaa-bbbb-cccc-ddddeeeeffff", "GPU-5e0a1b2c-0000-1111-2222-333344445555"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in worker_slots("cuda", 1, [0, 1], None)] == ["0", "1"]


def test_parse_size():
    assert protocol.parse_size("2GiB") == 2 * 2**30
    assert protocol.parse_size("512M") == 512 * 2**20
    assert protocol.parse_size("4096") == 4096
    for bad in ("", "-1G", "2 parsecs", "0"):
        with pytest.raises(ValueError):
            protocol.parse_size(bad)


# -- case ids -----------------------------------------------------------------------------------------------------------


def test_case_ids_round_trip():
    cases = grid(B=[1, 2], S_q=[1, 64], S_kv=[128], H=[8], H_kv=["H", 2, 1], d_k=[64], d_v=[None, 32], dtype=["fp32", "bf16"],
                 causal=[False, True], mode=["fwd", "bwd", "fwd_bwd"], window=[None, 16], padding=[False, True], seed=3)
    cases.append(Case(B=1, S_q=1, S_kv=64, H=16, H_kv=1, d_k=96, d_v=64, mla=True))
    for case in cases:
        assert parse_case_id(case.id, "cpu") == case
        assert parse_case_id(case.id, device="cuda") == case.replace(device="cuda")


@pytest.mark.parametrize("bad, message", [
    ("B1-Sq64-Skv64-H8-Hkv8-dk64", "expected a dtype"),
    ("B1-Sq64-Skv64-H8-dk64-fp32", "token 'dk64' is not Hkv<integer>"),
    ("B1-Sq64-Skv64-H8-Hkv8-dk64-fp32-pad-causal", "unexpected token 'causal'"),
    ("B1-Sq64-Skv64-H8-Hkv8-dk64-dv64-fp32", "not canonical"),
    ("B1-Sq64-Skv64-H8-Hkv3-dk64-fp32", "not divisible"),
    ("", "missing B"),
])
def test_bad_case_ids_say_what_is_wrong(bad, message):
    with pytest.raises(UserError, match=message):
        parse_case_id(bad)


# -- stability ----------------------------------------------------------------------------------------------------------


def test_coefficient_of_variation_is_the_sample_stdev_over_the_mean():
    from harness.checks.stability import StabilityResult, coefficient_of_variation

    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0
    assert coefficient_of_variation([9.0, 11.0]) == pytest.approx(2 ** 0.5 / 10)  # stdev √2 (n−1), mean 10
    with pytest.raises(ValueError):
        coefficient_of_variation([1.0])
    result = StabilityResult(Case(B=1, S_q=8, S_kv=8, H=1, H_kv=1, d_k=8, d_v=8), "naive", (0.009, 0.011))
    assert "coefficient of variation 14.14 %" in result.report()


@pytest.mark.slow
def test_stability_cli_measures_in_fresh_processes(tmp_path, monkeypatch, capsys):
    log = tmp_path / "executions.log"
    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("ATTNBENCH_TEST_LOG", str(log))
    monkeypatch.setenv("ATTNBENCH_TEST_PREPARE_S", "0")
    code = main(["stability", "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32", "--processes", "2", "--backend", "t-slow",
                 "--device", "cpu", "--measure-s", "0.02", "--out", str(tmp_path / "stability.json")])
    captured = capsys.readouterr()
    out = captured.out
    # Real children on a machine that may be busy: a contended process is refused with its evidence, never written as noise.
    assert code == 0 or (code == 2 and "processes were contended or suspect" in captured.err and not (tmp_path / "stability.json").exists()), captured.err
    assert "2 fresh processes" in out and "process 2: median" in out and "coefficient of variation" in out
    pids = [line.split()[1] for line in log.read_text().splitlines()]
    assert len(pids) == 2 and len(set(pids)) == 2 and str(os.getpid()) not in pids
    # The same case by flags; a failing pair is an error, not a number.
    assert main(["stability", "--B", "1", "--S", "32", "--H", "2", "--d-k", "16", "--backend", "t-oom", "--processes", "2", "--device", "cpu"]) == 2
    assert "t-oom gives oom for B1-Sq32-Skv32-H2-Hkv2-dk16-fp32" in capsys.readouterr().err
    assert main(["stability", "B1-Sq16-Skv16-H2-Hkv2-dk16-fp32", "--S", "16"]) == 2
    assert "not both" in capsys.readouterr().err
