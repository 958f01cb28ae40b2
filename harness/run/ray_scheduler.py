"""The driver's loop over a Ray run's tasks: one task per case, each row written as it arrives, dead tasks replaced.

A task whose worker died either crashed (its pair is `crashed`: running it again would crash again) or lost its
node (the node left the cluster: the pair did nothing wrong). NodeWatch tells them apart by what Ray says about the
node when the task dies (NodeDiedError, or its GCS already holding the node dead), never by guessing from timing: a task on a lost node costs no row, its case's pairs go to a live node, and when
no live node is left the run stops with the resume command.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from harness.errors import UserError, one_line
from harness.measure.timing import Budget
from harness.results.documents import MANIFEST, Manifest
from harness.results.record import Record
from harness.run.driver import FailureRows
from harness.run.progress import Progress
from harness.run.ray_tasks import run_case_batch, task_options
from harness.run.worker import run_phases
from harness.suite.cases import Case
from harness.results.record import pair_key

#: New tasks a case may get after tasks that died before finishing any of its pairs (a crash at start-up would loop).
MAX_FRUITLESS_TASKS = 2
#: How often the driver looks at its tasks (seconds): the granularity of --timeout and of the progress bar.
POLL_S = 0.2
class NoLiveNode(UserError):
    """The cluster has no live node that can run the run's tasks (every node that could was lost)."""


class NodeWatch:
    """Tells a task that crashed from a task whose node was lost, by what Ray says about the node."""

    def __init__(self, ray: Any, device: str) -> None:
        self.ray, self.device = ray, device
        #: Ray node id → the node's address, for each node found lost during this run.
        self.lost: dict[str, str] = {}

    def alive_in_cluster(self, node_id: str) -> bool | None:
        """What Ray's GCS says of the node: alive, dead, or None when it does not know the node."""
        for node in self.ray.nodes():
            if node.get("NodeID") == node_id:
                return bool(node.get("Alive"))
        return None

    def node_lost(self, node_id: str | None, address: str, exc: BaseException) -> str | None:
        """Why the task that raised `exc` went with its node (Ray's word for it), or None when the task itself crashed."""
        ray = self.ray
        if node_id in self.lost:
            return "Ray declared the node dead earlier in this run"
        if isinstance(exc, ray.exceptions.NodeDiedError):
            if node_id is not None:
                self.lost[node_id] = address
            return "Ray: NodeDiedError, the node the task ran on is dead or unavailable"
        if node_id is not None and self.alive_in_cluster(node_id) is False:
            self.lost[node_id] = address
            return f"Ray's GCS marked the node dead when its task died ({type(exc).__name__})"
        # Ray's word is not "dead": the task crashed. The driver does not wait for a later verdict (a probe task, the
        # GCS's health checks): its loop would stand still meanwhile, and every other running pair's --timeout with it.
        return None

    def live_nodes(self) -> list[str]:
        """The addresses of the live nodes that can run this run's tasks (a CPU; on CUDA a GPU too)."""
        out = []
        for node in self.ray.nodes():
            resources = node.get("Resources") or {}
            if (node.get("Alive") and node.get("NodeID") not in self.lost and resources.get("CPU", 0) >= 1
                    and (self.device != "cuda" or resources.get("GPU", 0) >= 1)):
                out.append(node.get("NodeManagerAddress"))
        return out


@dataclass
class _Batch:
    """The pairs of one case still to run, and the task running them."""

    case: Case
    backends: list[str]
    gen: Any = None
    running: str | None = None
    since: float = 0.0
    where: dict[str, str] = field(default_factory=dict)
    progressed: bool = False
    fruitless: int = 0
    #: The last task ended because its node left the cluster: that is no failure of the case's pairs.
    node_lost: bool = False

    def pending_keys(self) -> list[str]:
        """The pair keys still to run."""
        return [pair_key(self.case, b) for b in self.backends]

    def finished(self, key: str) -> None:
        """Drop a pair that now has its row."""
        self.backends = [b for b in self.backends if pair_key(self.case, b) != key]
        if self.running == key:
            self.running = None
        self.progressed = True


#: A case's task yields its next event only once the driver has taken the last. Ray reports a yield to its owner
#: asynchronously, and a worker that dies loses what it had not reported: without this, a SIGKILL could take a pair's
#: `ok` row and the next pair's `start` with it, and the death be blamed on the pair that had finished (seen under load).
ONE_EVENT_AT_A_TIME = {"_generator_backpressure_num_objects": 1}


class PairsRun:
    """The driver's loop over one run's tasks: submit a task per case, write each row as it arrives, replace dead tasks."""

    def __init__(self, ray: Any, failures: FailureRows, budget: Budget | None, *, timeout_s: float, env: dict[str, str],
                 seen_nodes: set[str], log: TextIO, watch: NodeWatch | None = None, task: Any = None) -> None:
        """`failures` holds the run's folder, pairs and writer; `env` is set in every task; each node that runs a pair joins `seen_nodes`.

        `task` (whose `.remote(case, backends)` starts a case's task) replaces the Ray task of `run_case_batch` with the
        run's budget and phases: the tests' fake events.
        """
        self.ray, self.failures, self.timeout_s, self.seen_nodes, self.log = ray, failures, timeout_s, seen_nodes, log
        self.folder, self.pairs, self.writer, self.rows = failures.folder, failures.pairs, failures.writer, failures.rows
        if task is None:
            task = ray.remote(**task_options(self.folder.device), **ONE_EVENT_AT_A_TIME)(run_case_batch)
            manifest = Manifest.from_dict(self.folder.manifest, self.folder.path / MANIFEST)
            self.arguments: tuple[Any, ...] = (budget, run_phases(manifest), self.folder.run_id, env)
        else:
            self.arguments = ()
        self.task = task
        self.active: dict[Any, _Batch] = {}
        self.watch = watch or NodeWatch(ray, self.folder.device)
        #: The pairs given a row by this attempt: a pair has one row, whichever task's record arrives (a lost node's, late).
        self.written: set[str] = set()
        #: (time, node address, pair keys) of each case whose task was lost with its node: the pairs that moved.
        self.moved: list[tuple[float, str, list[str]]] = []

    def run(self, pending: list[str], progress: Progress) -> None:
        """Run every pending pair to a row."""
        batches: dict[str, _Batch] = {}
        for key in pending:  # the manifest's order (harness.run.order): cases outer, each case's backends in its fair order
            case, backend = self.pairs[key]
            batches.setdefault(case.id, _Batch(case, [], progressed=True)).backends.append(backend)
        for batch in batches.values():
            self.submit(batch)
        while self.active:
            progress.update(self.folder.count_lines())
            ready, _ = self.ray.wait(list(self.active), num_returns=1, timeout=POLL_S)
            for gen in ready:
                ended = self.take_event(gen, self.active[gen])
                if ended:
                    self.after_task(self.active.pop(gen), ended)
            now = time.monotonic()
            for gen, batch in list(self.active.items()):
                if batch.running and now - batch.since > self.timeout_s:
                    self.ray.cancel(gen, force=True)  # force: Ray kills the worker process, whatever the pair is stuck in
                    del self.active[gen]
                    self.fail_running(batch, "timeout", f"killed after running past the {self.timeout_s:g} s time limit "
                                                        "(--timeout; its Ray task was cancelled)")
                    self.after_task(batch, "cancelled after --timeout")

    def submit(self, batch: _Batch) -> None:
        """Start a task on the batch's remaining pairs (one more fruitless try if the last task finished none)."""
        batch.fruitless = 0 if batch.progressed or batch.node_lost else batch.fruitless + 1
        batch.progressed, batch.running, batch.where, batch.node_lost = False, None, {}, False
        batch.gen = self.task.remote(batch.case, list(batch.backends), *self.arguments)
        self.active[batch.gen] = batch

    def cancel_all(self) -> None:
        """Cancel every running task (on an interrupt: the rows so far stay, --resume runs the rest)."""
        for gen in self.active:
            try:
                self.ray.cancel(gen, force=True)
            except Exception:  # noqa: BLE001 - interrupted anyway: cancel what can be cancelled
                pass

    def take_event(self, gen: Any, batch: _Batch) -> str | None:
        """Handle the task's next event; None while it goes on, else how it ended (`done`, or the reason it died)."""
        ray = self.ray
        try:
            ref = next(gen)
        except StopIteration:
            return "done"
        try:
            event = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the task's own code raised (a pair's failure is a row, never an exception)
            self.fail_running(batch, "error", f"the Ray task failed: {one_line(exc.cause if exc.cause is not None else exc)}")
            return one_line(exc)
        except ray.exceptions.RayError as exc:  # the worker died: a segfault, SIGKILL, Ray's OOM killer, a lost node
            node = batch.where.get("node", "its node")
            lost = self.watch.node_lost(batch.where.get("node_id"), node, exc)
            if lost:
                self.lose_node(batch, node, lost)
                return f"its node {node} left the cluster"
            self.fail_running(batch, "crashed", f"the Ray task died on {node} while running this pair: {one_line(exc)}")
            return one_line(exc)
        kind = event.get("event")
        if kind == "start":
            batch.running, batch.since = event["key"], time.monotonic()
            batch.where = {k: event[k] for k in ("worker", "node", "host", "device_name", "node_id") if k in event}
            self.seen_nodes.add(event["node"])
        elif kind == "record":
            if event["key"] not in self.written:
                record = Record.from_dict(event["record"], where=f"record from Ray task {batch.where.get('worker', '?')}")
                self.writer.append(self.rows.stamp(record))
                self.written.add(event["key"])
            batch.finished(event["key"])
        return None

    def lose_node(self, batch: _Batch, node: str, why: str) -> None:
        """The batch's task went with its node: its running pair gets no row and runs again, with the case's others, elsewhere."""
        moved = batch.pending_keys()
        batch.running, batch.node_lost = None, True
        self.moved.append((time.time(), node, moved))
        self.log.write(f"\nattnbench: {time.strftime('%H:%M:%S')} Ray node {node} left the cluster ({why}); "
                       f"{len(moved)} pairs of case {batch.case.id} go to a live node: {', '.join(moved) or 'none'}\n")

    def fail(self, batch: _Batch, key: str, status: str, reason: str) -> None:
        """Write the row of a pair that did not finish, naming where it ran."""
        if key not in self.written:
            extra = {k: batch.where[k] for k in ("node", "device_name") if k in batch.where}
            self.failures.write(key, batch.where.get("worker", "ray"), status, reason, extra)
            self.written.add(key)
        batch.finished(key)

    def fail_running(self, batch: _Batch, status: str, reason: str) -> None:
        """The row of the pair the task was running when it ended (none when it was between pairs)."""
        if batch.running is not None:
            self.fail(batch, batch.running, status, reason)

    def after_task(self, batch: _Batch, ended: str) -> None:
        """After a case's task ended: a new task for its remaining pairs, unless its tasks keep dying before any pair."""
        if not batch.backends:
            return
        if batch.node_lost and not self.watch.live_nodes():
            lost = ", ".join(sorted(set(self.watch.lost.values()))) or "its node"
            raise NoLiveNode(f"the Ray cluster lost {lost} and has no live node left that can run this run's tasks: "
                             f"the finished rows are in {self.folder.path}; when nodes are back, finish with: "
                             f"attnbench run --resume {self.folder.path} --executor ray")
        if batch.progressed or batch.node_lost or batch.fruitless < MAX_FRUITLESS_TASKS:
            self.submit(batch)
            return
        reason = f"no Ray task could run this case's pairs ({MAX_FRUITLESS_TASKS + 1} tasks ended before any pair; last: {ended})"
        for key in batch.pending_keys():
            self.fail(batch, key, "error", reason)
        self.log.write(f"\nattnbench: the tasks of case {batch.case.id} kept ending before any pair ({ended}); "
                                  "its pairs are recorded as errors\n")
