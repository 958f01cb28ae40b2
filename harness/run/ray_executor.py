"""`attnbench run --executor ray`: a run's pairs as tasks on a Ray cluster; the run folder is written by the driver alone.

How it maps onto the local supervisor (harness.run.supervisor), and why:

- The driver (the `attnbench run` process) opens, locks and writes the run folder as the local supervisor
  does: the same manifest, each record appended and fsynced on its own by `RunWriter`, the same closing
  rows and records.csv. Only the driver writes, so the nodes need no shared file system, and `--resume`
  works from either executor: a pair is done when it has a row, whoever wrote it.
- One task runs the pending backends of one case, in the suite's order, through the same `execute` as a
  local worker (the case's float64 reference is computed once per task). The task is a streaming
  generator: before each pair it yields a `start` event (the pair, its node, process and device), after it
  the record, so the driver writes each row as it arrives and knows which pair was running if the task dies.
- A task that dies (a segfault, SIGKILL, Ray's out-of-memory killer, a lost node) costs only the pair it was
  running, recorded `crashed` with Ray's error; the case's remaining backends go to a new task. A pair that
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

import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

from harness.errors import UserError
from harness.measure.execute import PairRunner, Phases, execute, one_line, poisons_process
from harness.measure.roofline import PEAKS
from harness.measure.timing import Budget
from harness.results.record import Record
from harness.results.store import ENV, RunWriter
from harness.run import protocol
from harness.run.progress import Progress
from harness.run.rundir import RunFolder
from harness.run.supervisor import RunConfig, RunSummary, Supervisor, _raise_interrupt
from harness.suite.cases import Case
from harness.suite.catalog import Suite, load_suite, pair_key

INSTALL_HINT = "--executor ray needs Ray, which is not installed here: pip install 'attnbench[ray]' (or: pip install ray)"
#: Environment variables of the driver that every task gets (plugins, and the test backends' switches).
ENV_PREFIX = "ATTNBENCH_"
#: New tasks a case may get after tasks that died before finishing any of its pairs (a crash at start-up would loop).
MAX_FRUITLESS_TASKS = 2
#: How long the nodes may take to describe themselves (CUDA peaks included) before the run goes on without them.
PROBE_TIMEOUT_S = 600.0
#: How often the driver looks at its tasks (seconds): the granularity of --timeout and of the progress bar.
POLL_S = 0.2


def import_ray() -> Any:
    """The `ray` module, or the one-line UserError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


# -- in a task, on a node ---------------------------------------------------------------------------------------------


@contextmanager
def _task_environment(env: dict[str, str]) -> Iterator[None]:
    """Set the driver's variables for the length of the task, then put back what the worker process had."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _use_assigned_cpus(device: str) -> None:
    """On a CPU, run torch with as many threads as CPUs the task holds (Ray's OMP_NUM_THREADS says the same; this makes it explicit)."""
    if device != "cpu":
        return
    import ray
    import torch

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))


def where_here(device: str) -> dict[str, str]:
    """In a task: its worker name (`ray:<node ip>:<pid>`), node IP, host name and device model."""
    import ray

    from harness.env import cpu_model

    node = ray.util.get_node_ip_address()
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device visible to the task"
    else:
        name = cpu_model()
    return {"worker": f"ray:{node}:{os.getpid()}", "node": node, "host": socket.gethostname(), "device_name": name}


_FROZEN = False


def _freeze_once() -> None:
    """Freeze what the worker process holds after its imports, once, so each pair's gc.collect() stays cheap (as pytest workers do)."""
    global _FROZEN
    if not _FROZEN:
        import gc

        gc.freeze()
        _FROZEN = True


def run_case_batch(case: Case, backends: list[str], budget: Budget, check: bool, run_id: str,
                   env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The Ray task: run `backends` on `case` in order, yielding a `start` event before each pair and its record after it."""
    with _task_environment(env):
        from harness.backends.registry import load_registry

        _use_assigned_cpus(case.device)
        where = where_here(case.device)
        registry = load_registry()
        _freeze_once()
        # One runner for the task: the backends of the case share its float64 reference.
        runner = PairRunner(budget=budget, phases=Phases(check=check))
        for name in backends:
            key = pair_key(case, name)
            yield {"event": "start", "key": key, **where}
            try:
                backend = registry.get(name)
            except UserError as exc:  # the plugin is missing or broken on this node, not on the driver
                yield {"event": "failed", "key": key, "reason": f"on node {where['node']}: {exc}"}
                continue
            record = execute(case, backend, runner, run_id, where["worker"])
            record.extra.update(node=where["node"], device_name=where["device_name"])
            yield {"event": "record", "key": key, "record": record.to_dict()}
            if poisons_process(record):
                return  # nothing more can run in this process (a lost CUDA context): the driver gives the rest a new task


def describe_node(device: str, dtypes: list[str], peaks: bool, env: dict[str, str]) -> dict[str, Any]:
    """A Ray task pinned to one node: its fingerprint, GPU telemetry and, with `peaks`, its measured ceilings."""
    with _task_environment(env):
        import ray

        from harness.env import fingerprint, gpu_telemetry
        from harness.measure import roofline

        _use_assigned_cpus(device)
        entry: dict[str, Any] = {
            "ray": ray.__version__, "ray_node_id": ray.get_runtime_context().get_node_id(),
            "before": fingerprint(device), "telemetry_before": gpu_telemetry() if device == "cuda" else None,
        }
        if peaks:
            try:
                measured = roofline.measure_peaks(device, dtypes)
            except Exception as exc:  # noqa: BLE001 - as a local run does: a file saying why, and the run goes on
                measured = _no_peaks(device, f"peak measurement failed: {one_line(exc)}")
            measured.setdefault("device_name", entry["before"].get("device_name"))
            entry["peaks"] = measured
        return entry


def _no_peaks(device: str, why: str) -> dict[str, Any]:
    """A peaks entry without ceilings, saying why (the shape a local run writes when its measurement fails)."""
    return {"device": device, "matmul": {}, "copy": None, "errors": {"measure": why}}


def node_telemetry(device: str) -> Any:
    """A Ray task pinned to one node: its GPUs' clocks, temperatures and throttle reasons now (None on a CPU run)."""
    from harness.env import gpu_telemetry

    return gpu_telemetry() if device == "cuda" else None


def task_options(device: str) -> dict[str, Any]:
    """The resources and policies of a task on `device`, given to ray.remote() itself (Ray refuses max_calls in .options()).

    A CUDA task holds one GPU and its process exits after it (max_calls=1: a lost CUDA context or leaked
    memory never reaches the next task); every task holds one CPU; Ray never retries a task.
    """
    options: dict[str, Any] = {"num_cpus": 1, "num_gpus": 0, "max_retries": 0}
    if device == "cuda":
        options.update(num_gpus=1, max_calls=1)
    return options


# -- env.json and peaks.json with one entry per node -----------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    protocol.atomic_write(path, json.dumps(data, indent=1, default=str))


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One fingerprint for several nodes: a field's value when all agree, else their values joined by ' | ' (time: the earliest)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for entry in entries for k in entry):
        values = [entry.get(key) for entry in entries]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) == 1:
            out[key] = values[0]
        elif key == "time_utc":
            out[key] = min(str(v) for v in values if v is not None)
        else:
            out[key] = " | ".join(sorted({str(v) for v in values}))
    return out


def env_with_nodes(env: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """env.json with `nodes` merged in, and its top-level fields (what reports and `compare` read) summarising every node."""
    env = dict(env)
    known = env.get("nodes")
    if not isinstance(known, dict):
        # A run begun by the local executor: the machine that ran its rows is one more node.
        known = {"local": {k: env[k] for k in ("before", "telemetry_before", "telemetry_after") if k in env}} if env.get("before") else {}
    known = {label: dict(entry) for label, entry in known.items()}
    for label, entry in nodes.items():
        known.setdefault(label, {}).update(entry)
    env["executor"] = "ray"
    env["nodes"] = known
    befores = [entry["before"] for entry in known.values() if isinstance(entry.get("before"), dict)]
    if befores:
        env["before"] = summarize(befores)
    for when in ("telemetry_before", "telemetry_after"):
        values = [entry.get(when) for entry in known.values() if when in entry]
        if len(known) == 1 and values:
            env[when] = values[0]
        elif any(v is not None for v in values):
            # A report lists GPUs by index: indices of different nodes would be mixed up, so they stay per node.
            env[when] = {"unavailable": f"{len(known)} nodes: each node's GPU telemetry is in env.json under nodes.<node>.{when}"}
        elif values:
            env[when] = None
    return env


def peaks_with_nodes(peaks: dict[str, Any], nodes: dict[str, dict[str, Any]], device: str,
                     legacy_device_name: str | None = None) -> dict[str, Any]:
    """peaks.json with `nodes` merged in; top-level ceilings (the ones the analysis applies) only when every node has the same device."""
    known = peaks.get("nodes")
    if not isinstance(known, dict):
        known = {}
        if peaks.get("matmul") is not None or peaks.get("errors"):  # peaks a local run measured on its own machine
            legacy = dict(peaks)
            legacy.setdefault("device_name", legacy_device_name)
            known["local"] = legacy
    known = {**known, **nodes}
    measured = {label: p for label, p in known.items() if isinstance(p, dict) and (p.get("matmul") or p.get("copy"))}
    names = sorted({str(p.get("device_name")) for p in measured.values()})
    if len(names) == 1:
        label = min(measured)
        top = {k: v for k, v in measured[label].items() if k != "nodes"}
        top["node"] = label
    else:
        why = ("no node's ceilings were measured" if not measured else
               f"the nodes have different devices ({'; '.join(names)}): "
               "each node's ceilings are under nodes, never applied to another device's rows")
        top = _no_peaks(device, why)
    top["nodes"] = known
    return top


# -- the driver ---------------------------------------------------------------------------------------------------------


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

    def pending_keys(self) -> list[str]:
        """The pair keys still to run."""
        return [pair_key(self.case, b) for b in self.backends]

    def finished(self, key: str) -> None:
        """Drop a pair that now has its row."""
        self.backends = [b for b in self.backends if pair_key(self.case, b) != key]
        if self.running == key:
            self.running = None
        self.progressed = True


def _check_address(address: str) -> None:
    """Refuse an address nobody answers at, in one line and in seconds (Ray itself retries for a minute, then prints a traceback)."""
    if address == "auto":
        return
    if address.startswith("ray://"):
        raise UserError(f"--ray-address {address}: Ray Client (ray://) is not supported; run attnbench on a node of the cluster "
                        "with the head's HOST:PORT (ray start --head prints it)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--ray-address takes HOST:PORT (what `ray start --head` prints, e.g. 10.0.0.1:6379) or 'auto': got {address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as exc:
        raise UserError(f"no Ray cluster answers at {address}: {exc.strerror or exc}") from None


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

    missing_reason = "no Ray task ran this pair (its case's tasks kept dying before any pair; see the Ray logs of the node)"

    def __init__(self, config: RunConfig, log: TextIO = sys.stderr) -> None:
        self.ray = import_ray()  # first: without Ray, one line and nothing else happens
        super().__init__(config, log)
        self._started_local = False
        self._seen_nodes: set[str] = set()

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
        from harness.env import fingerprint

        driver = {k: v for k, v in fingerprint("cpu").items() if k in ("time_utc", "host", "python", "platform", "torch")}
        driver["ray"] = self.ray.__version__
        _write_json(folder.path / ENV, {"executor": "ray", "driver": driver, "nodes": {}})
        # The nodes describe themselves (and measure their peaks) in _execute, where a resumed run does it too.

    def _connect(self) -> None:
        """Join the cluster at --ray-address (or RAY_ADDRESS), else start a local Ray for this run."""
        ray = self.ray
        address = self.config.ray_address or os.environ.get("RAY_ADDRESS") or None
        if address:
            _check_address(address)
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
    def _env(self) -> dict[str, str]:
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
        refs = {label: self._on_node(describe_node, node_id, task_options(device)).remote(device, dtypes, True, self._env())
                for label, node_id in labels.items()}
        results = self._gather(refs, PROBE_TIMEOUT_S)
        env_entries, peak_entries = {}, {}
        for label, result in results.items():
            peaks = result.pop("peaks", None) if "error" not in result else _no_peaks(device, result["error"])
            if note:
                result["note"] = note
            env_entries[label], peak_entries[label] = result, peaks
        env = _read_json(folder.path / ENV)
        legacy_name = (env.get("before") or {}).get("device_name") if "nodes" not in env else None
        _write_json(folder.path / ENV, env_with_nodes(env, env_entries))
        _write_json(folder.path / PEAKS, peaks_with_nodes(_read_json(folder.path / PEAKS), peak_entries, device, legacy_name))

    def _write_env_after(self, folder: RunFolder) -> None:
        device = folder.device
        env = _read_json(folder.path / ENV)
        alive = self._alive_nodes(device)
        late = {label: alive[label] for label in sorted(self._seen_nodes) if label not in (env.get("nodes") or {}) and label in alive}
        if late:  # nodes that joined during the run: described now that no pair competes with their peaks
            dtypes = sorted({c.dtype for c, _ in folder.pairs().values()})
            self._describe_nodes(folder, late, dtypes, note="described after the pairs: the node joined the cluster during the run")
            env = _read_json(folder.path / ENV)
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
        _write_json(folder.path / ENV, env_with_nodes(env, entries))

    # -- the pairs ---------------------------------------------------------------------------------------------------
    def _execute(self, folder: RunFolder, pairs: dict[str, tuple[Case, str]], pending: list[str], writer: RunWriter,
                 progress: Progress) -> None:
        """Describe the nodes not yet in env.json, then run the pending pairs as one streaming task per case."""
        if not pending:
            return
        suite = load_suite(folder.suite_arg).on_device(folder.device)
        known = _read_json(folder.path / ENV).get("nodes") or {}
        new_nodes = {ip: node_id for ip, node_id in self._alive_nodes(folder.device).items() if ip not in known}
        self._describe_nodes(folder, new_nodes, sorted({c.dtype for c in suite.cases}))
        pairs_run = _PairsRun(self, folder, pairs, writer, suite.budget)
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            pairs_run.run(pending, progress)
        except KeyboardInterrupt:
            pairs_run.cancel_all()
            self.log.write(f"\ninterrupted: finished rows are in {folder.path}; "
                           f"finish with: attnbench run --resume {folder.path} --executor ray\n")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous_term)


class _PairsRun:
    """The driver's loop over one run's tasks: submit a task per case, write each row as it arrives, replace dead tasks."""

    def __init__(self, supervisor: RaySupervisor, folder: RunFolder, pairs: dict[str, tuple[Case, str]], writer: RunWriter,
                 budget: Budget) -> None:
        self.supervisor, self.ray, self.folder, self.pairs, self.writer = supervisor, supervisor.ray, folder, pairs, writer
        self.timeout_s = supervisor.config.case_timeout_s
        self.task = self.ray.remote(**task_options(folder.device))(run_case_batch)
        self.arguments = (budget, bool(folder.manifest.get("check", True)), folder.run_id, supervisor._env())
        self.active: dict[Any, _Batch] = {}

    def run(self, pending: list[str], progress: Progress) -> None:
        """Run every pending pair to a row."""
        batches: dict[str, _Batch] = {}
        for key in pending:  # cases in the suite's order, each case's backends in theirs
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
        batch.fruitless = 0 if batch.progressed else batch.fruitless + 1
        batch.progressed, batch.running, batch.where = False, None, {}
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
            self.fail_running(batch, "crashed", f"the Ray task died on {node} while running this pair: {one_line(exc)}")
            return one_line(exc)
        kind = event.get("event")
        if kind == "start":
            batch.running, batch.since = event["key"], time.monotonic()
            batch.where = {k: event[k] for k in ("worker", "node", "host", "device_name") if k in event}
            self.supervisor._seen_nodes.add(event["node"])
        elif kind == "record":
            self.writer.append(Record.from_dict(event["record"], where=f"record from Ray task {batch.where.get('worker', '?')}"))
            batch.finished(event["key"])
        elif kind == "failed":
            self.fail(batch, event["key"], "error", event["reason"])
        return None

    def fail(self, batch: _Batch, key: str, status: str, reason: str) -> None:
        """Write the row of a pair that did not finish, naming where it ran."""
        extra = {k: batch.where[k] for k in ("node", "device_name") if k in batch.where}
        self.supervisor._record_failure(self.writer, self.folder, self.pairs, key, batch.where.get("worker", "ray"), status, reason, extra)
        batch.finished(key)

    def fail_running(self, batch: _Batch, status: str, reason: str) -> None:
        """The row of the pair the task was running when it ended (none when it was between pairs)."""
        if batch.running is not None:
            self.fail(batch, batch.running, status, reason)

    def after_task(self, batch: _Batch, ended: str) -> None:
        """After a case's task ended: a new task for its remaining pairs, unless its tasks keep dying before any pair."""
        if not batch.backends:
            return
        if batch.progressed or batch.fruitless < MAX_FRUITLESS_TASKS:
            self.submit(batch)
            return
        reason = f"no Ray task could run this case's pairs ({MAX_FRUITLESS_TASKS + 1} tasks ended before any pair; last: {ended})"
        for key in batch.pending_keys():
            self.fail(batch, key, "error", reason)
        self.supervisor.log.write(f"\nattnbench: the tasks of case {batch.case.id} kept ending before any pair ({ended}); "
                                  "its pairs are recorded as errors\n")
