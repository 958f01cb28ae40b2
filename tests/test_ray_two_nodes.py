"""A Ray run across two nodes that loses one: scripts/ray_two_nodes.sh as root, and the node-loss accounting on fake events.

The accounting (harness.run.ray_scheduler) is tested in process with a fake Ray whose tasks yield scripted events;
the script runs real Ray nodes in two network namespaces and is skipped, saying why, where they cannot be made.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from harness.results.record import Record, Status, pair_key
from harness.run.ray_scheduler import NodeWatch, NoLiveNode, PairsRun
from harness.suite.cases import Case
from tests.cli_runs import ROOT, attnbench_in_process
from tests.history_runs import run_folder
from tests.postgres_server import fresh_database, postgres_base  # noqa: F401  (postgres_base: the session's server, a fixture)

SCRIPT = ROOT / "scripts" / "ray_two_nodes.sh"
HEAD, LOST = "node-head", "node-lost"

# -- a fake Ray: tasks are lists of scripted events ---------------------------------------------------------------------


class RayError(Exception):
    """Ray's base error."""


class RayTaskError(RayError):
    """The task's own code raised."""

    cause = None


class NodeDiedError(RayError):
    """Ray's word that the task's node is dead."""


class WorkerCrashedError(RayError):
    """The task's worker process died."""


class FakeRef:
    """An object ref: `ray.get` returns its value or raises its error."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class FakeRay:
    """The calls PairsRun and NodeWatch make, answered from `nodes` (id → alive), with each case's tasks scripted."""

    exceptions = SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError, NodeDiedError=NodeDiedError,
                                 WorkerCrashedError=WorkerCrashedError)

    def __init__(self, nodes: dict[str, bool]) -> None:
        self.alive = dict(nodes)
        self.cancelled: list[Any] = []

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": node, "Alive": alive, "NodeManagerAddress": node, "Resources": {"CPU": 1.0} if alive else {}}
                for node, alive in self.alive.items()]

    def get(self, ref: FakeRef) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return list(refs), []

    def cancel(self, ref: Any, force: bool = False) -> None:
        self.cancelled.append(ref)


CASES = [Case(B=1, S_q=s, S_kv=s, H=2, H_kv=2, d_k=16, d_v=16, dtype="fp32", device="cpu") for s in (16, 32)]
BACKENDS = ["naive", "sdpa", "sdpa-math"]


def start(case: Case, backend: str, node: str) -> FakeRef:
    return FakeRef({"event": "start", "key": pair_key(case, backend), "worker": f"ray:{node}:1", "node": node, "node_id": node,
                    "device_name": "cpu model"})


def record(case: Case, backend: str, node: str) -> FakeRef:
    row = Record(case=case, backend=backend, status=Status("ok"), worker=f"ray:{node}:1", node=node)
    return FakeRef({"event": "record", "key": pair_key(case, backend), "record": row.to_dict()})


def runs(case: Case, backends: list[str], node: str) -> list[FakeRef]:
    """The events of a task that runs `backends` of `case` to the end on `node`."""
    return [ref for b in backends for ref in (start(case, b, node), record(case, b, node))]


class Tasks:
    """`.remote(case, backends)`: the next scripted task of that case, as the generator PairsRun reads; logs what was asked."""

    def __init__(self, scripts: dict[str, list[list[FakeRef]]]) -> None:
        self.scripts, self.asked = scripts, []

    def remote(self, case: Case, backends: list[str]) -> Iterator[FakeRef]:
        self.asked.append((case.id, list(backends)))
        return iter(self.scripts[case.id].pop(0))


class Written:
    """The run's writer and failure rows: every row, in order."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str | None]] = []  # (pair key, status, node)

    def append(self, row: Record) -> None:
        self.rows.append((row.pair_key, row.status.value, row.node))

    def write(self, key: str, worker: str, status: str, reason: str, where: dict[str, Any] | None = None) -> None:
        self.rows.append((key, status, (where or {}).get("node")))


def pairs_run(ray: FakeRay, tasks: Tasks, written: Written, tmp_path: Path) -> PairsRun:
    folder = SimpleNamespace(path=tmp_path, device="cpu", count_lines=lambda: len(written.rows))
    failures = SimpleNamespace(folder=folder, pairs={pair_key(c, b): (c, b) for c in CASES for b in BACKENDS}, writer=written,
                               rows=SimpleNamespace(stamp=lambda row: row), write=written.write)
    watch = NodeWatch(ray, "cpu")
    return PairsRun(ray, failures, None, timeout_s=600, env={}, seen_nodes=set(), log=io.StringIO(), watch=watch, task=tasks)


def run_all(run: PairsRun) -> None:
    run.run(list(run.pairs), SimpleNamespace(update=lambda *a, **k: None))


# -- the accounting -------------------------------------------------------------------------------------------------


def test_a_lost_nodes_pairs_run_again_on_a_live_node_one_row_each(tmp_path):
    ray = FakeRay({HEAD: True, LOST: True})
    a, b = CASES
    died = FakeRef(error=NodeDiedError("Task failed because the node it was running on is dead or unavailable."))
    tasks = Tasks({
        a.id: [runs(a, BACKENDS, HEAD)],
        # On the node that is lost: one pair finished, the next started, then the node went.
        b.id: [[*runs(b, BACKENDS[:1], LOST), start(b, BACKENDS[1], LOST), died],
               # Its replacement, on the head; the lost node's record of the first pair, arriving late, is not a second row.
               [*runs(b, BACKENDS[1:], HEAD), record(b, BACKENDS[0], LOST)]],
    })
    written = Written()
    run = pairs_run(ray, tasks, written, tmp_path)
    ray.alive[LOST] = False
    run_all(run)
    per_pair = Counter(key for key, _, _ in written.rows)
    assert set(per_pair) == set(run.pairs) and set(per_pair.values()) == {1}, written.rows
    assert {status for _, status, _ in written.rows} == {"ok"}
    node_of = {key: node for key, _, node in written.rows}
    assert node_of[pair_key(b, BACKENDS[0])] == LOST and node_of[pair_key(b, BACKENDS[1])] == HEAD
    assert tasks.asked[-1] == (b.id, BACKENDS[1:])  # the running pair and the one after it moved, the finished one did not
    assert [(node, keys) for _, node, keys in run.moved] == [(LOST, [pair_key(b, k) for k in BACKENDS[1:]])]
    assert "Ray node node-lost left the cluster" in run.log.getvalue()


def test_a_worker_death_is_a_lost_node_only_when_ray_says_the_node_is_dead(tmp_path):
    a, b = CASES
    for node_dead, status in ((False, "crashed"), (True, None)):
        ray = FakeRay({HEAD: True, LOST: True})
        crash = FakeRef(error=WorkerCrashedError("The worker died unexpectedly while executing this task."))
        tasks = Tasks({a.id: [runs(a, BACKENDS, HEAD)],
                       b.id: [[start(b, BACKENDS[0], LOST), crash], runs(b, BACKENDS[1:] if status else BACKENDS, HEAD)]})
        written = Written()
        run = pairs_run(ray, tasks, written, tmp_path)
        ray.alive[LOST] = not node_dead
        run_all(run)
        first = [(s, n) for k, s, n in written.rows if k == pair_key(b, BACKENDS[0])]
        # Alive by Ray's word: the pair crashed its worker, a row says so. Dead: it runs again elsewhere.
        assert first == ([("crashed", LOST)] if status else [("ok", HEAD)]), written.rows
        assert len(written.rows) == len(run.pairs)


def test_with_no_live_node_left_the_run_stops_with_the_resume_command(tmp_path):
    ray = FakeRay({LOST: True})
    a, _ = CASES
    tasks = Tasks({a.id: [[start(a, BACKENDS[0], LOST), FakeRef(error=NodeDiedError("dead"))]]})
    written = Written()
    run = pairs_run(ray, tasks, written, tmp_path)
    ray.alive[LOST] = False
    with pytest.raises(NoLiveNode, match=f"no live node left.*attnbench run --resume {re.escape(str(tmp_path))} --executor ray"):
        run.run([pair_key(a, b) for b in BACKENDS], SimpleNamespace(update=lambda *a, **k: None))
    assert written.rows == []  # nothing was run to the end, and no row claims otherwise


def test_node_watch_knows_a_lost_node_by_ray_s_word_and_remembers_it():
    ray = FakeRay({HEAD: True, LOST: False})
    watch = NodeWatch(ray, "cpu")
    assert watch.node_lost(LOST, "10.0.0.2", WorkerCrashedError()) is not None
    assert watch.node_lost(LOST, "10.0.0.2", RayError()) is not None  # remembered
    assert watch.node_lost(None, "?", WorkerCrashedError()) is None  # no node to ask about: a crash
    assert watch.node_lost(None, "?", NodeDiedError("dead")) is not None
    assert watch.live_nodes() == [HEAD]


# -- rows per node, in the report and in `db list` -------------------------------------------------------------------


def ray_run_folder(tmp_path: Path) -> Path:
    """A real-format run folder whose rows name two Ray nodes (2 and 1 rows) and one row no node."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    lines = (run / "records.jsonl").read_text().splitlines()
    nodes = ["10.9.0.1", "10.9.0.2", "10.9.0.1", None]
    assert len(lines) == len(nodes)
    (run / "records.jsonl").write_text("".join(json.dumps({**json.loads(line), "node": node}) + "\n" for line, node in zip(lines, nodes)))
    return run


def assert_db_list_counts_rows_per_node(db: str, tmp_path: Path, capsys) -> None:
    run = ray_run_folder(tmp_path)
    local = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")  # a local run: its line names no node
    assert attnbench_in_process(["db", "add", run, local, "--db", db], capsys).code == 0
    listed = attnbench_in_process(["db", "list", "--db", db], capsys).out.splitlines()
    assert listed[0].endswith("rows per node: 10.9.0.1 2, 10.9.0.2 1") and "rows per node" not in listed[1], listed
    as_json = json.loads(attnbench_in_process(["db", "list", "--db", db, "--json"], capsys).out)
    assert [r["rows_per_node"] for r in as_json] == [{"10.9.0.1": 2, "10.9.0.2": 1}, None]


@pytest.mark.slow  # a report and two database commands: seconds
def test_report_and_db_list_count_each_nodes_rows(tmp_path, capsys):
    md = attnbench_in_process(["report", ray_run_folder(tmp_path / "report"), "--md"], capsys)
    assert md.code == 0, md.err
    assert "- rows per node: 10.9.0.1: 2 rows, 10.9.0.2: 1 row, this machine (no node): 1 row" in md.out
    assert_db_list_counts_rows_per_node(str(tmp_path / "db.sqlite"), tmp_path, capsys)


@pytest.mark.postgres
def test_db_list_counts_each_nodes_rows_on_postgresql(postgres_base, tmp_path, capsys):  # noqa: F811 - the session's server
    assert_db_list_counts_rows_per_node(fresh_database(postgres_base), tmp_path, capsys)


# -- the script, as root --------------------------------------------------------------------------------------------


def _why_no_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "scripts/ray_two_nodes.sh makes network namespaces, which needs root; this test runs as a user"
    if shutil.which("ip") is None:
        return "scripts/ray_two_nodes.sh needs iproute2's `ip netns`; `ip` is not installed"
    probe = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns list` fails here ({probe.stderr.strip()}): no network namespaces"
    return None


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_nodes_in_namespaces_one_killed_partway_lose_no_row(tmp_path):
    why = _why_no_namespaces()
    if why:
        pytest.skip(why)
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install -e '.[ray]'")
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], check=False, env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=540)
    timeline = (tmp_path / "timeline.txt").read_text()
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    topology = re.search(r"namespaces (\S+) \((\S+)\) and (\S+) \((\S+)\)", timeline)
    assert topology, timeline
    ns_head, head_ip, ns_node, node_ip = topology.groups()
    assert "killed every process of" in timeline and "left the cluster" in timeline, timeline

    run = tmp_path / "two-nodes"
    pairs = json.loads((run / "manifest.json").read_text())["pairs"]
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]
    per_pair = Counter(f"{r['case_id']}-{r['backend']}" for r in rows)
    assert set(per_pair) == set(pairs) and set(per_pair.values()) == {1}, per_pair
    assert {r["node"] for r in rows} == {head_ip, node_ip}
    assert not [r for r in rows if r["status"] in ("error", "crashed")]
    # The pairs the driver moved off the lost node ran to a row on the head.
    moved = re.findall(r"go to a live node: (.*)", (tmp_path / "driver.log").read_text())
    assert moved, (tmp_path / "driver.log").read_text()
    node_of = {f"{r['case_id']}-{r['backend']}": r["node"] for r in rows}
    assert all(node_of[key] == head_ip for line in moved for key in line.split(", ")), (moved, node_of)
    # It cleaned up what it made.
    left = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    assert ns_head not in left and ns_node not in left, left
