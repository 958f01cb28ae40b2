"""`attnbench run --executor ray`: a run's pairs as tasks on a Ray cluster; the run folder is written by the driver alone.

How it maps onto the local supervisor (harness.run.supervisor), and why:

- The driver (the `attnbench run` process) opens, locks and writes the run folder as the local supervisor
  does: the same manifest, each record appended and fsynced on its own by `RunWriter`, the same closing
  rows and records.csv. Only the driver writes, so the nodes need no shared file system, and `--resume`
  works from either executor: a pair is done when it has a row, whoever wrote it.
- One task runs the pending backends of one case, in the run's order, through the same worker loop as a
  local worker (harness.run.worker; the case's float64 reference is computed once per task). The task is a streaming
  generator: before each pair it yields a `start` event (the pair, its node, process and device), after it
  the record, so the driver writes each row as it arrives and knows which pair was running if the task dies.
- A task that dies (a segfault, SIGKILL, Ray's out-of-memory killer) costs only the pair it was running,
  recorded `crashed` with Ray's error; the case's remaining backends go to a new task. A task whose node left
  the cluster (Ray says so: ray_scheduler.NodeWatch) costs nothing: its pairs run again on a live node, and with
  no live node left the run stops with the resume command. A pair that
  runs past `--timeout` has its task cancelled (force: Ray kills the worker process) and is recorded
  `timeout`. Ray never retries a task (max_retries=0): a retry would run a crashing pair again.
- On CUDA a task holds one GPU (Ray sets CUDA_VISIBLE_DEVICES) and its worker process exits after it
  (max_calls=1), so a sticky CUDA error or leaked memory never reaches the next case. On a CPU a task holds
  one CPU and torch runs as many threads as the task holds CPUs.
- Every row names its node and device: `worker` is `ray:<node ip>:<pid>`, and the record's extra columns
  `node` and `device_name` hold the node's IP and its GPU (or CPU) model. env.json and peaks.json hold one
  entry per node under `nodes`, measured on that node before any pair runs (so nothing competes with the
  peaks); their top-level entries summarise the nodes, and peaks.json has top-level ceilings only when
  every node has the same device, so one GPU's ceilings are never applied to another GPU's rows.
- The driver's ATTNBENCH_* environment variables (ATTNBENCH_BACKENDS: the backend plugins) are set in each
  task, because a task's process inherits the environment of the node's Ray, not the driver's.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator, MutableMapping, TextIO

from harness.errors import UserError
from harness.errors import one_line
from harness.results.documents import ENV, PEAKS
from harness.run.driver import FailureRows, sigterm_interrupts
from harness.run.progress import Progress
from harness.run.rundir import RunFolder, write_env
from harness.run.supervisor import RunConfig, RunSummary, Supervisor
from harness.run.ray_nodes import check_address, env_with_nodes, peaks_with_nodes, read_json, write_json
from harness.run.ray_scheduler import NoLiveNode, PairsRun
from harness.run.ray_tasks import describe_node, no_peaks, node_telemetry, task_options
from harness.suite.catalog import Suite

#: Ray's switch for clusters beyond one host; "0" keeps a local Ray on 127.0.0.1 (ray._private.services.get_node_ip_address).
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
INSTALL_HINT = "--executor ray needs Ray, which is not installed here: pip install 'attnbench[ray]' (or: pip install ray)"
#: Environment variables of the driver that every task gets (plugins, and the test backends' switches).
ENV_PREFIX = "ATTNBENCH_"
#: How long the nodes may take to describe themselves (CUDA peaks included) before the run goes on without them.
PROBE_TIMEOUT_S = 600.0


def become_driver(config: RunConfig, environ: MutableMapping[str, str] = os.environ) -> None:
    """Make this process a Ray driver's, before Ray is imported: a Ray the run starts for itself listens on loopback only."""
    if not (config.ray_address or environ.get("RAY_ADDRESS")):
        # Process-wide on purpose, so set where the process turns driver: Ray reads it when it is imported,
        # and the Ray processes this run starts inherit it (never this machine's network address).
        environ.setdefault(LOOPBACK_ONLY, "0")


def import_ray() -> Any:
    """The `ray` module, or the one-line UserError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


@contextmanager
def _held_back_stderr() -> Iterator[None]:
    """Hold back what is written to file descriptor 2 meanwhile, and write it out after only if nothing raised.

    Ray's C++ client logs a warning line for each retry while it cannot join a cluster (a wrong token:
    about twenty lines), past Python's logging; when it fails, the one-line error says why instead.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))  # joined: nothing is lost


def _connect_reason(exc: BaseException) -> str:
    """Why ray.init failed, in one line; an authentication failure says what to set."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 5:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any("Authentication" in type(c).__name__ or "InvalidAuthToken" in str(c) for c in chain):
        return ("the cluster uses token authentication and this process has no token: export RAY_AUTH_MODE=token and make the "
                "head's ~/.ray/auth_token readable here (or set RAY_AUTH_TOKEN)")
    return one_line(exc)


class RaySupervisor(Supervisor):
    """Runs the pending pairs of one run folder as Ray tasks, writing the folder from this process."""

    #: Not yet: a Ray task's rows would need the re-measure plan stamped on them, and its nodes' load is not this machine's.
    remeasures = chooses_threads = False
    #: A task loads its plugins on its node, under the ATTNBENCH_* variables it is given: a local child says nothing of it.
    probes_workers = False
    #: Its workers are Ray's processes on its nodes.
    forks_local_workers = False

    missing_reason = "no Ray task ran this pair (its case's tasks kept dying before any pair; see the Ray logs of the node)"

    def __init__(self, config: RunConfig, log: TextIO | None = None) -> None:
        self.ray = import_ray()  # first: without Ray, one line and nothing else happens
        super().__init__(config, log)
        self._started_local = False
        #: The nodes that ran a pair of this attempt (those that joined mid-run are described after the pairs).
        self.seen_nodes: set[str] = set()

    # -- set-up -------------------------------------------------------------------------------------------------------
    def _check_flags(self) -> None:
        """Refuse the local executor's worker options, which Ray decides for itself."""
        config = self.config
        if not config.case_timeout_s > 0:
            raise UserError(f"--timeout must be a positive number of seconds, got {config.case_timeout_s}")
        if config.gpus is not None:
            raise UserError("--gpus is for the local executor: with --executor ray, each task gets one GPU from Ray")
        if config.workers != 1:
            raise UserError("--workers is for the local executor: with --executor ray, the cluster's CPUs (or GPUs) "
                            "set how many pairs run at once")
        if config.memory_limit is not None:
            raise UserError("--memory-limit is for the local executor: Ray's own memory monitor guards the nodes")
        if config.options.traces:
            raise UserError("--traces is for the local executor: a Ray task's trace would be written on its node, not in the run folder")
        if config.options.threads is not None:
            raise UserError("--threads is for the local executor: a Ray task times with the CPUs Ray assigned it, and its rows record how many")
        if config.options.cooldown_s is not None:
            raise UserError("--cooldown is for the local executor: a Ray task does not yet know its GPU's idle temperature")

    def _check_options(self, device: str) -> None:
        self._check_flags()
        resources = self.ray.cluster_resources()
        if device == "cuda" and resources.get("GPU", 0) < 1:
            raise UserError("this run needs CUDA, but the Ray cluster has no GPU (`ray status` lists its resources)")
        if resources.get("CPU", 0) < 1:
            raise UserError("the Ray cluster has no CPU to run a task on (`ray status` lists its resources)")

    def _default_device(self) -> str:
        return "cuda" if self.ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"

    def _check_device(self, device: str) -> None:
        if device == "cuda" and self.ray.cluster_resources().get("GPU", 0) < 1:
            raise UserError("--device cuda asked for, but the Ray cluster has no GPU (`ray status` lists its resources)")

    def _write_environment(self, folder: RunFolder, suite: Suite) -> None:
        from harness.env import IDENTITY_KEYS, fingerprint

        driver = {k: v for k, v in fingerprint("cpu").items() if k in ("time_utc", "host", "python", "platform", "torch", *IDENTITY_KEYS)}
        driver["ray"] = self.ray.__version__
        write_env(folder.path, {"executor": "ray", "driver": driver, "nodes": {}})
        # The nodes describe themselves (and measure their peaks) in _execute, where a resumed run does it too.

    def _connect(self) -> None:
        """Join the cluster at --ray-address (or RAY_ADDRESS), else start a local Ray for this run."""
        ray = self.ray
        address = self.config.ray_address or os.environ.get("RAY_ADDRESS") or None
        if address:
            check_address(address)
        kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
        if not address:
            kwargs["include_dashboard"] = False
        try:
            if address:
                with _held_back_stderr():
                    ray.init(address=address, **kwargs)
            else:  # never while starting a local Ray: its processes would inherit the held-back descriptor
                ray.init(address=address, **kwargs)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, AuthenticationError: all one line to the user
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UserError(f"cannot start or join {where}: {_connect_reason(exc)}") from None
        self._started_local = not address

    def run(self) -> RunSummary:
        """Check the options, join (or start) the cluster, run the pairs, and leave the cluster."""
        started = time.monotonic()
        self._check_flags()  # before the seconds Ray takes to start
        self._connect()
        try:
            summary = super().run()
        finally:
            self.ray.shutdown()
        summary.wall_s = time.monotonic() - started  # joining or starting Ray is part of the run's time
        return summary

    # -- the nodes ---------------------------------------------------------------------------------------------------
    def task_env(self) -> dict[str, str]:
        """What every task sets in its environment: the driver's ATTNBENCH_* variables and the run's worker_env."""
        return {**{k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}, **self.config.worker_env}

    def _alive_nodes(self, device: str) -> dict[str, str]:
        """Node IP → Ray node id of each live node that can run this run's tasks."""
        nodes: dict[str, str] = {}
        for node in self.ray.nodes():
            resources = node.get("Resources") or {}
            if node.get("Alive") and resources.get("CPU", 0) >= 1 and (device != "cuda" or resources.get("GPU", 0) >= 1):
                nodes.setdefault(node["NodeManagerAddress"], node["NodeID"])
        return nodes

    def _on_node(self, fn: Any, node_id: str, options: dict[str, Any]) -> Any:
        """`fn` as a Ray task with `options`, pinned to one node (it waits for that node, never runs elsewhere)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.ray.remote(**options)(fn).options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))

    def _gather(self, refs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Each label's task result, or {'error': why} for a task that failed or did not finish in time (it is cancelled)."""
        ray = self.ray
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready_set = set(ready)
        out: dict[str, Any] = {}
        for label, ref in refs.items():
            if ref not in ready_set:
                ray.cancel(ref, force=True)
                out[label] = {"error": f"did not answer within {timeout_s:g} s"}
                continue
            try:
                out[label] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                out[label] = {"error": one_line(exc)}
        return out

    def _describe_nodes(self, folder: RunFolder, labels: dict[str, str], dtypes: list[str], note: str | None = None) -> None:
        """Probe the given nodes (IP → node id) on the nodes themselves; add them to env.json and peaks.json."""
        if not labels:
            return
        device = folder.device
        # On CUDA the probe holds a GPU, like a pair's task; nothing else runs yet, so nothing competes with the peaks.
        refs = {label: self._on_node(describe_node, node_id, task_options(device)).remote(device, dtypes, True, self.task_env())
                for label, node_id in labels.items()}
        results = self._gather(refs, PROBE_TIMEOUT_S)
        env_entries, peak_entries = {}, {}
        for label, result in results.items():
            peaks = result.pop("peaks", None) if "error" not in result else no_peaks(device, result["error"])
            if note:
                result["note"] = note
            env_entries[label], peak_entries[label] = result, peaks
        env = read_json(folder.path / ENV)
        legacy_name = (env.get("before") or {}).get("device_name") if "nodes" not in env else None
        write_env(folder.path, env_with_nodes(env, env_entries))
        write_json(folder.path / PEAKS, peaks_with_nodes(read_json(folder.path / PEAKS), peak_entries, device, legacy_name))

    def _write_env_after(self, folder: RunFolder) -> None:
        device = folder.device
        env = read_json(folder.path / ENV)
        alive = self._alive_nodes(device)
        late = {label: alive[label] for label in sorted(self.seen_nodes) if label not in (env.get("nodes") or {}) and label in alive}
        if late:  # nodes that joined during the run: described now that no pair competes with their peaks
            dtypes = sorted({c.dtype for c, _ in folder.pairs().values()})
            self._describe_nodes(folder, late, dtypes, note="described after the pairs: the node joined the cluster during the run")
            env = read_json(folder.path / ENV)
        labels = [label for label in (env.get("nodes") or {}) if label != "local"]
        if device == "cuda":
            # NVML reads every GPU of the node without holding one: no resources, so it never waits.
            no_resources = {"num_cpus": 0, "num_gpus": 0, "max_retries": 0}
            refs = {label: self._on_node(node_telemetry, alive[label], no_resources).remote(device) for label in labels if label in alive}
            after = self._gather(refs, 60.0) if refs else {}
            gone = {"unavailable": "the node left the cluster before the run ended"}
            entries = {label: {"telemetry_after": after.get(label, gone)} for label in labels}
        else:
            entries = {label: {"telemetry_after": None} for label in labels}
        write_env(folder.path, env_with_nodes(env, entries))

    # -- the pairs ---------------------------------------------------------------------------------------------------
    def _execute(self, folder: RunFolder, pending: list[str], failures: FailureRows, progress: Progress) -> None:
        """Describe the nodes not yet in env.json, then run the pending pairs as one streaming task per case."""
        if not pending:
            return
        known = read_json(folder.path / ENV).get("nodes") or {}
        new_nodes = {ip: node_id for ip, node_id in self._alive_nodes(folder.device).items() if ip not in known}
        self._describe_nodes(folder, new_nodes, sorted({c.dtype for c, _ in failures.pairs.values()}))
        pairs_run = PairsRun(self.ray, failures, folder.budget, timeout_s=self.config.case_timeout_s, env=self.task_env(),
                             seen_nodes=self.seen_nodes, log=self.log)
        with sigterm_interrupts():
            try:
                pairs_run.run(pending, progress)
            except NoLiveNode:
                pairs_run.cancel_all()  # the tasks left wait for a node that is gone
                raise
            except KeyboardInterrupt:
                pairs_run.cancel_all()
                self.log.write(f"\ninterrupted: finished rows are in {folder.path}; "
                               f"finish with: attnbench run --resume {folder.path} --executor ray\n")
                raise
