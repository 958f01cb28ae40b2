"""What runs on a Ray node for `--executor ray`: a case's pairs as one streaming task, and the node's own description."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Any, Iterator

from harness.errors import one_line
from harness.execution.execute import PairRunner, Phases
from harness.measure.timing import Budget
from harness.run.worker import Started, WorkerLoop
from harness.suite.cases import Case
from harness.results.record import pair_key


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


def _node_id() -> str:
    """In a task: the Ray id of the node it runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


_FROZEN = False


def _gc_freeze() -> None:
    import gc

    gc.freeze()


def _freeze_once() -> None:
    """Freeze what the worker process holds after its imports, once, so each pair's gc.collect() stays cheap (as local workers do)."""
    global _FROZEN
    if not _FROZEN:
        import gc

        gc.freeze()
        _FROZEN = True


def run_case_batch(case: Case, backends: list[str], budget: Budget, phases: Phases, run_id: str,
                   env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The Ray task: the worker loop on `backends` of `case` in order, yielding a `start` event before each pair and its record after it."""
    with _task_environment(env):
        from harness.backends.registry import load_registry

        _use_assigned_cpus(case.device)
        where = where_here(case.device)
        node_id = _node_id()
        registry = load_registry()
        _freeze_once()
        # One runner for the task: the backends of the case share its float64 reference, and its NVML session
        # and flush buffer are given back when the task ends (a CPU task's process serves the next task).
        runner = PairRunner(budget=budget, phases=phases)
        # A Ray task is this process's entry point for its pairs: it freezes what survives each, as a local worker does.
        loop = WorkerLoop(run_id, where["worker"], runner, registry, where={"node": where["node"], "device_name": where["device_name"]},
                          after_pair=_gc_freeze)
        with runner.resources:
            for event in loop.events((pair_key(case, name), case, name) for name in backends):
                if isinstance(event, Started):
                    # The node's Ray id: if the task dies, the driver asks Ray whether this node is still alive.
                    yield {"event": "start", "key": event.key, "node_id": node_id, **where}
                else:
                    yield {"event": "record", "key": event.key, "record": event.record.to_dict()}


def describe_node(device: str, dtypes: list[str], peaks: bool, env: dict[str, str]) -> dict[str, Any]:
    """A Ray task pinned to one node: its fingerprint, GPU telemetry and, with `peaks`, its measured ceilings."""
    with _task_environment(env):
        import ray

        from harness.env import fingerprint
        from harness.telemetry.nvml import gpu_telemetry
        from harness.telemetry import peaks as device_peaks

        _use_assigned_cpus(device)
        entry: dict[str, Any] = {
            "ray": ray.__version__, "ray_node_id": ray.get_runtime_context().get_node_id(),
            "before": fingerprint(device), "telemetry_before": gpu_telemetry() if device == "cuda" else None,
        }
        if peaks:
            try:
                measured = device_peaks.measure_peaks(device, dtypes)
            except Exception as exc:  # noqa: BLE001 - as a local run does: a file saying why, and the run goes on
                measured = no_peaks(device, f"peak measurement failed: {one_line(exc)}")
            measured.setdefault("device_name", entry["before"].get("device_name"))
            entry["peaks"] = measured
        return entry


def no_peaks(device: str, why: str) -> dict[str, Any]:
    """A peaks entry without ceilings, saying why (the shape a local run writes when its measurement fails)."""
    return {"device": device, "matmul": {}, "copy": None, "errors": {"measure": why}}


def node_telemetry(device: str) -> Any:
    """A Ray task pinned to one node: its GPUs' clocks, temperatures and throttle reasons now (None on a CPU run)."""
    from harness.telemetry.nvml import gpu_telemetry

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

