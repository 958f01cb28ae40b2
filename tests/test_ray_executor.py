"""`attnbench run --executor ray` on a real Ray cluster started on this machine (2 CPUs, loopback clients, no dashboard).

Like tests/test_reliability.py, every failure is real (a SIGKILL, a hang, a killed driver) and the
sweeps run the real CLI in subprocesses on tiny TOML suites. Most tests share one Ray head started
with `ray start --head --block` in its own session, killed with every process of that session at
the end; the first test lets attnbench start (and stop) a local Ray by itself. The shared head
declares one GPU that this machine does not have, so that the CUDA path (a GPU per task, a fresh
process per task, the probes) runs for real up to the first CUDA call; the CPU tests say --device cpu. Without Ray installed
these tests skip, except in CI (CI=true), where scripts/setup-env.sh must have installed it.
The file takes about two minutes on two shared cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from harness.backends.registry import ENV_VAR
from harness.cli.main import main
from harness.env import cpu_model
from harness.run.ray_executor import INSTALL_HINT, LOOPBACK_ONLY
from harness.run.ray_nodes import env_with_nodes, peaks_with_nodes, summarize
from tests.cli_runs import PLUGIN, ROOT, attnbench, attnbench_in_process, cli_env, executions, is_dead, keys, rows, write_suite

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY and not os.environ.get("CI"),
                               reason="ray is not installed: pip install -e '.[ray]' (CI installs it through scripts/setup-env.sh)")
PLUGINS = f"{PLUGIN},tests.ray_backends:KillBackend"
WORKER = re.compile(r"^ray:(?P<node>[0-9a-fA-F.:]+):(?P<pid>\d+)$")


def ray_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The CLI's environment for a Ray run: the test backends, no auth token and no usage stats (a loopback test cluster)."""
    # LOOPBACK_ONLY: every Ray process of the tests (heads started here, drivers, workers) uses 127.0.0.1 only.
    env = cli_env(tmp_path, **{ENV_VAR: PLUGINS, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", LOOPBACK_ONLY: "0", **extra})
    env.pop("RAY_ADDRESS", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_of(pid: int) -> int | None:
    """The session id of a process (field 6 of /proc/<pid>/stat), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])


def kill_session(session: int) -> None:
    """SIGKILL every process of a session this test started (Ray's head, its raylet, agents and workers)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _session_of(int(entry.name)) == session:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


#: What `ray start` says when its raylet did not register with the GCS within Ray's fixed 30 s (ray/_private/node.py): on two
#: cores shared with three other test workers and their children, a start-up Ray's own scheduling lost, not attnbench.
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
#: Starts of a head tried before a test fails: a second start only after Ray's own start-up timeout, never after another error.
HEAD_STARTS = 2


@contextmanager
def ray_head(cpus: int, gpus: int, **env: str) -> Iterator[str]:
    """Start a Ray head on this machine (its own temp dir and session), yield its address, then kill its whole session."""
    for attempt in range(1, HEAD_STARTS + 1):
        temp = Path(tempfile.mkdtemp(prefix="abray-", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
        port = _free_port()
        head_env = {**ray_env(temp), "PYTHONPATH": str(ROOT), **env}  # the tasks' processes import tests.* from the checkout
        log_path = temp / "head.log"
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
                   f"--num-gpus={gpus}", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
                   "--object-store-memory=100000000"]
        with open(log_path, "w") as log:
            head = subprocess.Popen(command, env=head_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while "Ray runtime started" not in log_path.read_text():
                if head.poll() is not None and RAY_STARTUP_TIMEOUT in log_path.read_text() and attempt < HEAD_STARTS:
                    break
                assert head.poll() is None and time.monotonic() < deadline, f"ray start failed:\n{log_path.read_text()[-3000:]}"
                time.sleep(0.2)
            else:
                yield f"127.0.0.1:{port}"
                return
        finally:
            kill_session(head.pid)
            head.wait()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a Ray head on this machine with 2 CPUs and one (pretended) GPU, for the tests of this module."""
    if not HAS_RAY:
        pytest.fail("CI is set but ray is not installed: scripts/setup-env.sh installs the ray extra when CI is set")
    with ray_head(cpus=2, gpus=1) as address:
        yield address


def by_key(records: list[dict]) -> dict[str, dict]:
    """Records by pair key."""
    return {f"{r['case_id']}-{r['backend']}": r for r in records}


def assert_names_its_node(record: dict) -> None:
    """A Ray row names the node and process it ran in, and the device model."""
    match = WORKER.match(record["worker"])
    assert match, record["worker"]
    assert record["node"] == match["node"] and record["device_name"] == cpu_model()


# -- the same rows as a local run --------------------------------------------------------------------------------------


#: A local Ray started for one run: ~25 s on a quiet 2-core machine, 240 s and more beside two CPU-bound processes
#: (Ray's own processes and each case's fresh worker process wait for the CPU): the limit is for a hang, not for load.
LOCAL_RAY_RUN_S = 900


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(LOCAL_RAY_RUN_S + 120)
def test_ray_run_has_the_rows_of_a_local_run(tmp_path, capsys, monkeypatch):
    suite = write_suite(tmp_path / "small.toml", ["naive", "sdpa", "t-slow"], [8, 16, 24])
    short = Path(tempfile.mkdtemp(prefix="abray-", dir="/tmp"))
    try:
        env = ray_env(tmp_path, ATTNBENCH_TEST_PREPARE_S="0", RAY_TMPDIR=str(short))
        local = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "local", "--quiet"], capsys,
                                     env=env, monkeypatch=monkeypatch)
        assert local.code == 0, local.err
        # No --ray-address and no RAY_ADDRESS: attnbench starts a local Ray for the run and stops it after.
        done = attnbench(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "ray", "--executor", "ray", "--quiet"], env,
                         timeout_s=LOCAL_RAY_RUN_S)
        assert done.returncode == 0, done.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)
    # A busy machine may add "; 1 contended: their medians decide no answer" before the closing parenthesis.
    assert "9 of 9 pairs recorded (9 ok" in done.stdout
    local_rows, ray_rows = by_key(rows(tmp_path / "local")), by_key(rows(tmp_path / "ray"))
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert sorted(ray_rows) == sorted(local_rows) == sorted(manifest["pairs"]) and len(rows(tmp_path / "ray")) == 9
    for key, row in ray_rows.items():
        assert (row["status"], row["agree"], row["run_id"]) == (local_rows[key]["status"], local_rows[key]["agree"], "ray")
        # Two samples at least, unless the row says a call outran the budget (a machine slowed by load: 128 ms seen, budget 10 ms).
        assert row["latency_ms_median"] > 0 and (row["samples"] >= 2 or row["stopped_by"] in {"call_exceeds_budget", "first_call"}), row
        assert_names_its_node(row)
        # The driver stamps what the manifest knows: the same order as the local run, and the command that re-runs the pair.
        assert row["order_in_case"] == local_rows[key]["order_in_case"] and f"--backends {row['backend']}" in row["repro"]
    # env.json and peaks.json: one entry per node, measured there; the top level stands for all nodes.
    node = next(iter(ray_rows.values()))["node"]
    env = json.loads((tmp_path / "ray" / "env.json").read_text())
    assert env["executor"] == "ray" and list(env["nodes"]) == [node]
    assert env["nodes"][node]["before"]["device_name"] == env["before"]["device_name"] == cpu_model()
    assert env["nodes"][node]["before"]["torch_threads"] == 1  # a CPU task holds one CPU, and torch runs one thread
    peaks = json.loads((tmp_path / "ray" / "peaks.json").read_text())
    assert list(peaks["nodes"]) == [node] and peaks["node"] == node and peaks["matmul"]["fp32"]["tflops"] > 0
    csv = (tmp_path / "ray" / "records.csv").read_text().splitlines()
    assert len(csv) == 1 + 9 and {"node", "device_name"} <= set(csv[0].split(","))
    from harness.analysis.frame import load

    frame = load([tmp_path / "ray"]).frame  # the analysis reads a Ray run as it reads a local one
    assert set(frame["device_name"]) == {cpu_model()} and frame["pct_peak_flops"].notna().all()


# -- a task that dies, a task that hangs ----------------------------------------------------------------------------------


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_task_is_crashed_hung_task_is_cancelled_and_the_rest_finish(tmp_path, ray_cluster):
    # Backends run in the run's order within a case's task: after t-kill (or t-hang) dies, the rest need a new task.
    backends = ["naive", "t-kill", "t-slow", "t-hang", "t-oom", "t-sticky"]
    suite = write_suite(tmp_path / "sweep.toml", backends, [16, 32])
    env = ray_env(tmp_path, ATTNBENCH_TEST_PREPARE_S="0")
    done = attnbench(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "sweep", "--executor", "ray", "--device", "cpu",
                      "--ray-address", ray_cluster, "--timeout", "6", "--quiet"], env)
    assert done.returncode == 0, done.stderr
    records = rows(tmp_path / "sweep")
    assert len(records) == len(set(keys(records))) == 12
    status = {(r["S_q"], r["backend"]): r for r in records}
    for backend in backends:
        assert status[16, backend]["status"] == "ok", status[16, backend]
    assert status[32, "naive"]["status"] == "ok" and status[32, "t-slow"]["status"] == "ok", (status[32, "naive"], status[32, "t-slow"])
    killed = status[32, "t-kill"]
    assert killed["status"] == "crashed", killed
    assert "WorkerCrashedError" in killed["reason"] and "The worker died unexpectedly" in killed["reason"]
    hung = status[32, "t-hang"]
    assert hung["status"] == "timeout" and "6 s time limit" in hung["reason"] and "cancelled" in hung["reason"]
    assert status[32, "t-oom"]["status"] == "oom"
    assert status[32, "t-sticky"]["status"] == "crashed" and status[32, "t-sticky"]["reason"].startswith("sticky CUDA error")
    for record in records:  # the rows the driver wrote for a dead or cancelled task name the node too
        assert_names_its_node(record)
    # Each death cost its process: the pair after it in the run's order (the manifest's) ran in a new one.
    case = "B1-Sq32-Skv32-H2-Hkv2-dk16-fp32"
    executed = [line.split() for line in (tmp_path / "executions.log").read_text().splitlines() if line.startswith(f"{case}-")]
    assert dict(executed)[f"{case}-t-kill"] == WORKER.match(killed["worker"])["pid"]
    deaths = [(key, pid, next_pid) for (key, pid), (_, next_pid) in zip(executed, executed[1:]) if key in {f"{case}-t-kill", f"{case}-t-hang"}]
    assert deaths and all(pid != next_pid for _, pid, next_pid in deaths), executed


#: A driver that takes one event of a three-step task and waits: the task's marks show how far it ran.
ONE_TAKEN = """
import sys, time
from pathlib import Path
import ray
from harness.run.ray_scheduler import ONE_EVENT_AT_A_TIME
options = ONE_EVENT_AT_A_TIME if sys.argv[3] == "paced" else {}
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=1, max_retries=0, **options)
def steps(folder):
    for i in range(3):
        (Path(folder) / str(i)).touch()
        yield i

marks = Path(sys.argv[2])
events = steps.remote(str(marks))
assert ray.get(next(events)) == 0
deadline = time.monotonic() + 60
while not (marks / "1").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.0)
print(" ".join(sorted(p.name for p in marks.iterdir())))
"""


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_case_task_runs_no_further_than_one_event_past_what_the_driver_took(tmp_path, ray_cluster):
    # What the driver's blame of a dead task rests on: had the task run on, a SIGKILL could take events it had not reported.
    ran = {}
    for pace in ("paced", "free"):
        marks = tmp_path / pace
        marks.mkdir()
        done = subprocess.run([sys.executable, "-c", ONE_TAKEN, ray_cluster, str(marks), pace], env=ray_env(tmp_path),
                              cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        ran[pace] = done.stdout.split()
    assert ran == {"paced": ["0", "1"], "free": ["0", "1", "2"]}  # Ray's own generator, unpaced, runs to its end


# -- kill -9 of the driver, then --resume ------------------------------------------------------------------------------


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_driver_killed_then_resumed_runs_no_finished_pair_again(tmp_path, ray_cluster):
    suite = write_suite(tmp_path / "slow.toml", ["t-slow"], [8, 16, 24, 40, 48, 56])
    env = ray_env(tmp_path, ATTNBENCH_TEST_PREPARE_S="0.5")
    run_dir = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, "-m", "harness", "run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "run",
                               "--executor", "ray", "--device", "cpu", "--ray-address", ray_cluster, "--quiet"],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run_dir / "records.jsonl").exists() and len((run_dir / "records.jsonl").read_bytes().splitlines()) >= 2):
            assert driver.poll() is None, driver.stderr.read().decode()
            assert time.monotonic() < deadline, "no two rows within 120 s"
            time.sleep(0.05)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    before = rows(run_dir)
    assert 2 <= len(before) < 6
    # Ray ends the tasks of a driver that is gone: nothing of the killed run goes on computing.
    task_pids = {int(line.split()[1]) for line in (tmp_path / "executions.log").read_text().splitlines()}
    deadline = time.monotonic() + 10
    while not all(is_dead(p) for p in task_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(is_dead(p) for p in task_pids)

    done = attnbench(["run", "--resume", str(run_dir), "--executor", "ray", "--ray-address", ray_cluster, "--quiet"], env)
    assert done.returncode == 0, done.stderr
    after = rows(run_dir)
    assert after[: len(before)] == before  # the finished rows are kept as they were
    assert sorted(keys(after)) == sorted(json.loads((run_dir / "manifest.json").read_text())["pairs"])
    assert {r["status"] for r in after} == {"ok"}
    ran = executions(tmp_path)
    assert all(ran[k] == 1 for k in keys(before))  # no finished pair ran again
    assert sum(ran.values()) <= 6 + 2  # at most the two pairs in flight at the kill ran twice


# -- the CUDA path, on a GPU Ray was told about but torch cannot see ----------------------------------------------------


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cuda_tasks_hold_a_gpu_and_a_fresh_process_each(tmp_path, ray_cluster):
    suite = write_suite(tmp_path / "gpu.toml", ["naive", "sdpa"], [8, 16])
    env = ray_env(tmp_path)
    done = attnbench(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "gpu", "--executor", "ray", "--device", "cuda",
                      "--ray-address", ray_cluster, "--quiet"], env)
    # Every pair is an unsupported row (below), the reason the missing device: the node's task sees no GPU.
    assert done.returncode == 0 and "4 unsupported" in done.stdout, (done.stdout, done.stderr)
    records = rows(tmp_path / "gpu")
    assert len(records) == 4 and {r["device"] for r in records} == {"cuda"}
    # Every pair got its task's GPU (CUDA_VISIBLE_DEVICES=0), found none and said so in its row: a row, not a stop.
    for record in records:
        assert record["status"] == "unsupported" and "no CUDA device" in record["reason"], record
        assert WORKER.match(record["worker"]) and record["device_name"] == "no CUDA device visible to the task"
    pids = {r["case_id"]: r["worker"] for r in records}
    assert len(set(pids.values())) == 2  # one task per case, each in a new process (max_calls=1): no CUDA state is shared
    node = records[0]["node"]
    env_json = json.loads((tmp_path / "gpu" / "env.json").read_text())
    assert env_json["nodes"][node]["before"]["device_type"] == "cuda" and "telemetry_after" in env_json["nodes"][node]
    peaks = json.loads((tmp_path / "gpu" / "peaks.json").read_text())
    assert "peak measurement failed" in peaks["nodes"][node]["errors"]["measure"] and peaks["matmul"] == {}


# -- one run folder, both executors ---------------------------------------------------------------------------------------


def _drop_last_lines(run_dir: Path, n: int) -> list[str]:
    """Remove the last `n` rows of a run (as if it had been stopped before them); their pair keys."""
    path = run_dir / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-n]))
    return keys([json.loads(line) for line in lines[-n:]])


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_resumes_from_either_executor(tmp_path, ray_cluster, capsys, monkeypatch):
    suite = write_suite(tmp_path / "four.toml", ["t-slow"], [8, 16, 24, 40])
    env = ray_env(tmp_path, ATTNBENCH_TEST_PREPARE_S="0")
    run_dir = tmp_path / "r"
    ran = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "r", "--quiet", "--no-remeasure"], capsys, env=env, monkeypatch=monkeypatch)
    assert ran.code == 0, ran.err
    full = keys(rows(run_dir))

    # Begun locally, finished on Ray: only the pairs without a row run.
    dropped = _drop_last_lines(run_dir, 2)
    (tmp_path / "executions.log").unlink()
    done = attnbench(["run", "--resume", str(run_dir), "--executor", "ray", "--ray-address", ray_cluster, "--quiet"], env)
    assert done.returncode == 0, done.stderr
    assert executions(tmp_path) == Counter({k: 1 for k in dropped})
    records = rows(run_dir)
    assert sorted(keys(records)) == sorted(full)
    assert [r["worker"] for r in records[:2]] == ["0", "0"] and all(WORKER.match(r["worker"]) for r in records[2:])
    env_json = json.loads((run_dir / "env.json").read_text())
    assert set(env_json["nodes"]) == {"local", records[-1]["node"]}  # the local machine is kept as a node of its own
    peaks = json.loads((run_dir / "peaks.json").read_text())
    assert set(peaks["nodes"]) == {"local", records[-1]["node"]} and peaks["matmul"]  # one CPU model: top-level ceilings kept

    # Begun (in part) on Ray, finished locally.
    dropped = _drop_last_lines(run_dir, 1)
    (tmp_path / "executions.log").unlink()
    done = attnbench(["run", "--resume", str(run_dir), "--quiet"], env)
    assert done.returncode == 0, done.stderr
    assert executions(tmp_path) == Counter({k: 1 for k in dropped})
    assert sorted(keys(rows(run_dir))) == sorted(full) and {r["status"] for r in rows(run_dir)} == {"ok"}


# -- user errors: one line, exit 2, no run folder --------------------------------------------------------------------------


def test_without_ray_the_executor_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError, as where Ray is not installed
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--executor", "ray", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"attnbench: error: {INSTALL_HINT}\n" and "pip install 'attnbench[ray]'" in err
    assert not (tmp_path / "one").exists()


@pytest.mark.parametrize("args, message", [
    (["--ray-address", "127.0.0.1:1"], "--ray-address goes with --executor ray"),
    (["--executor", "slurm"], "invalid choice: 'slurm'"),
])
def test_ray_options_without_the_ray_executor_are_refused(tmp_path, capsys, args, message):
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "one").exists()


@needs_ray
@pytest.mark.parametrize("args, message", [
    (["--ray-address", "127.0.0.1:{closed}"], "no Ray cluster answers at 127.0.0.1:"),
    (["--ray-address", "headnode"], "--ray-address takes HOST:PORT"),
    (["--ray-address", "ray://headnode:10001"], "Ray Client (ray://) is not supported"),
    (["--workers", "2"], "--workers is for the local executor"),
    (["--gpus", "0"], "--gpus is for the local executor"),
    (["--memory-limit", "1GiB"], "--memory-limit is for the local executor"),
    (["--cooldown", "30"], "--cooldown is for the local executor"),
    (["--timeout", "0"], "--timeout must be a positive"),
])
def test_bad_ray_options_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    args = [a.replace("{closed}", str(_free_port())) for a in args]
    started = time.monotonic()
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--executor", "ray", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert time.monotonic() - started < 15  # refused before any Ray starts or retries
    assert not (tmp_path / "one").exists()


@needs_ray
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_cluster_that_wants_a_token_is_one_line_saying_what_to_set(tmp_path, capsys):
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    # The token comes from the environment, so that no test writes ~/.ray/auth_token.
    with ray_head(cpus=1, gpus=0, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="attnbench-test-" + "0" * 32) as address:
        env = ray_env(tmp_path)  # RAY_AUTH_MODE=disabled: this driver has no token
        done = attnbench(["run", "--suite", str(suite), "--out", str(tmp_path), "--executor", "ray", "--ray-address", address,
                          "--quiet"], env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # Ray's own retry warnings are held back
    assert "token authentication" in done.stderr and "RAY_AUTH_MODE=token" in done.stderr
    assert not (tmp_path / "one").exists()


# -- env.json and peaks.json across nodes -------------------------------------------------------------------------------


def test_nodes_with_different_gpus_get_no_shared_ceilings():
    a100 = {"device": "cuda", "device_name": "NVIDIA A100", "matmul": {"bf16": {"tflops": 280.0}}, "copy": {"gbps": 1800.0}}
    h100 = {"device": "cuda", "device_name": "NVIDIA H100", "matmul": {"bf16": {"tflops": 700.0}}, "copy": {"gbps": 3000.0}}
    mixed = peaks_with_nodes({}, {"10.0.0.1": a100, "10.0.0.2": h100}, "cuda")
    assert mixed["matmul"] == {} and mixed["copy"] is None and "different devices" in mixed["errors"]["measure"]
    assert mixed["nodes"]["10.0.0.2"]["matmul"]["bf16"]["tflops"] == 700.0
    same = peaks_with_nodes({}, {"10.0.0.2": h100, "10.0.0.3": {**h100, "copy": {"gbps": 2900.0}}}, "cuda")
    assert same["node"] == "10.0.0.2" and same["matmul"]["bf16"]["tflops"] == 700.0 and set(same["nodes"]) == {"10.0.0.2", "10.0.0.3"}


def test_env_summarises_nodes_and_keeps_each_ones_telemetry():
    gpu = [{"index": 0, "name": "NVIDIA H100", "sm_clock_mhz": 1980}]

    def node(host: str, name: str) -> dict:
        return {"before": {"host": host, "device_name": name, "torch": "2.13", "time_utc": f"2026-01-01T00:00:0{host[-1]}"},
                "telemetry_before": gpu}

    one = env_with_nodes({"executor": "ray", "nodes": {}}, {"10.0.0.1": node("gpu1", "NVIDIA H100")})
    assert one["before"]["device_name"] == "NVIDIA H100" and one["telemetry_before"] == gpu
    two = env_with_nodes(one, {"10.0.0.2": node("gpu2", "NVIDIA A100")})
    assert two["before"]["device_name"] == "NVIDIA A100 | NVIDIA H100" and two["before"]["torch"] == "2.13"
    assert two["before"]["time_utc"] == "2026-01-01T00:00:01" and "nodes.<node>.telemetry_before" in two["telemetry_before"]["unavailable"]
    local = env_with_nodes({"before": {"host": "laptop", "device_name": "cpu"}, "telemetry_before": None}, {})
    assert local["nodes"] == {"local": {"before": {"host": "laptop", "device_name": "cpu"}, "telemetry_before": None}}
    assert summarize([{"a": 1}, {"a": 1, "b": 2}]) == {"a": 1, "b": "2 | None"}
