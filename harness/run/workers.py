"""The worker pool: which worker slots a run gets, starting a worker process on a run folder, and watching it.

A worker is `python -m harness.child worker` (harness.run.worker: the one worker loop): it claims pairs
from the run folder's `pending.txt` and appends their records itself. The supervisor only starts
workers, polls them, and accounts for the pair a worker was running when it died or overran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TextIO

from harness.errors import UserError
from harness.run import protocol
from harness.process import forkserver
from harness.process.children import child_command, child_env, kill_group, spawn
from harness.run.rundir import RunFolder
from harness.telemetry.nvml import visible_gpus


@dataclass(frozen=True)
class Slot:
    """A place for one worker: its name in records and what its environment adds (CUDA_VISIBLE_DEVICES, thread counts)."""

    name: str
    env: dict[str, str]


def worker_slots(device: str, workers: int, gpus: list[int] | None, memory_limit: int | None,
                 environ: Mapping[str, str] | None = None) -> list[Slot]:
    """The workers a run gets: one per GPU with --gpus, else `workers` CPU workers sharing the cores.

    --gpus indexes the GPUs this process may use, as torch numbers them: under an inherited
    CUDA_VISIBLE_DEVICES (a shared node, a SLURM allocation) index i is its i-th entry, never the
    machine's GPU i, which may be someone else's.
    """
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if gpus is not None:
        if device != "cuda":
            raise UserError("--gpus needs --device cuda (on the CPU, use --workers N)")
        if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
            raise UserError(f"--gpus lists each GPU once, by index: got {','.join(map(str, gpus))}")
        visible = visible_gpus(os.environ if environ is None else environ)
        if visible is None:
            return [Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": str(g)}) for g in gpus]
        beyond = [g for g in gpus if g >= len(visible)]
        if beyond:
            raise UserError(f"--gpus {','.join(map(str, beyond))}: CUDA_VISIBLE_DEVICES={','.join(visible)} leaves this run "
                            f"{len(visible)} GPU(s), indexed from 0")
        return [Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": visible[g]}) for g in gpus]
    if device == "cuda" and workers > 1:
        raise UserError("--workers > 1 on CUDA would share one GPU between workers and disturb their timings: use --gpus all")
    if device == "cuda" and memory_limit is not None:
        raise UserError("--memory-limit caps CPU workers only (CUDA maps far more address space than it uses)")
    env = {}
    if workers > 1:
        # Split the cores so that concurrent workers do not oversubscribe them.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    return [Slot(str(i), env) for i in range(workers)]


def worker_args(folder: RunFolder, slot: Slot, memory_limit: int | None, parent_pid: int) -> list[str]:
    """The `worker` job's arguments on a run folder: only what is its process's own (the rest it reads from the folder);
    `parent_pid` is the process it must outlive no further (this supervisor, or the template that forks it)."""
    args = ["--run-dir", str(folder.path), "--worker", slot.name, "--parent-pid", str(parent_pid)]
    if memory_limit is not None:
        args += ["--memory-limit", str(memory_limit)]
    return args


def worker_command(folder: RunFolder, slot: Slot, memory_limit: int | None) -> list[str]:
    """The command line of one worker started fresh on a run folder."""
    return child_command("worker", *worker_args(folder, slot, memory_limit, os.getpid()))


def worker_env(slot: Slot, extra_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker in `slot`: this process's, then the slot's, then the run's own variables."""
    return {**os.environ, **slot.env, **extra_env}


def start_template(slot: Slot, extra_env: Mapping[str, str]) -> None:
    """Start now the template a CPU worker in `slot` would fork from (harness.process.forkserver); where none starts, the
    worker itself tries again and starts fresh if it must, as it would without this."""
    env = child_env(worker_env(slot, extra_env))
    if forkserver.enabled(env):
        try:
            forkserver.template_for(env)
        except OSError:
            pass


def start_worker_process(folder: RunFolder, slot: Slot, memory_limit: int | None, log: TextIO, env: dict[str, str],
                         fork: bool) -> subprocess.Popen | forkserver.ForkedProcess:
    """Start one worker, its output on `log`: forked from a template (harness.process.forkserver) where `fork` and the
    environment allow it, else a fresh interpreter; the attempt's line in the log says which."""
    env = child_env(env)
    if fork and forkserver.enabled(env):
        try:
            template = forkserver.template_for(env)
            args = worker_args(folder, slot, memory_limit, template.pid)
            log.write(f"forked from worker template {template.pid} ({template.origin}): python -m harness.child worker {' '.join(args)}\n")
            log.flush()
            return template.launch(["worker", *args], log.fileno(), env)
        except OSError as exc:
            log.write(f"no worker template ({exc}); starting the worker as a fresh interpreter\n")
    command = worker_command(folder, slot, memory_limit)
    log.write(f"{' '.join(command)}\n")
    log.flush()
    return spawn(command, stdout=log, env=env)


class Worker:
    """One worker process and what it is doing."""

    def __init__(self, slot: Slot, process: subprocess.Popen | forkserver.ForkedProcess, current: Path, log_path: Path, log: TextIO,
                 attempt: int) -> None:
        self.slot, self.process, self.current, self.log_path, self._log, self.attempt = slot, process, current, log_path, log, attempt
        self._pair = ""
        self._pair_since = time.monotonic()
        self.returncode: int | None = None

    @classmethod
    def start(cls, folder: RunFolder, slot: Slot, extra_env: dict[str, str], memory_limit: int | None, attempt: int = 0,
              fork: bool = False) -> "Worker":
        """Start a worker on the folder's pending pairs, its output going to `worker-<slot>.log` (`fork`: from a template)."""
        current = protocol.current_path(folder.path, slot.name)
        protocol.atomic_write(current, "")
        log_path = folder.path / f"worker-{slot.name}.log"
        log = open(log_path, "a")
        log.write(f"\n=== attempt {attempt}: ")
        process = start_worker_process(folder, slot, memory_limit, log, worker_env(slot, extra_env), fork)
        return cls(slot, process, current, log_path, log, attempt)

    def current_pair(self) -> str:
        """The pair the worker said it started and has not finished ('' if none)."""
        try:
            return self.current.read_text().strip()
        except OSError:
            return ""

    def poll(self, timeout_s: float) -> str | None:
        """None while running; `exited` when the process ended, `timeout` when a pair overran (the worker is killed)."""
        rc = self.process.poll()
        if rc is not None:
            self.returncode = rc
            self._log.close()
            return "exited"
        pair = self.current_pair()
        if pair != self._pair:
            self._pair, self._pair_since = pair, time.monotonic()
        elif pair and time.monotonic() - self._pair_since > timeout_s:
            self.kill()
            self.returncode = self.process.returncode
            self._log.close()
            return "timeout"
        return None

    def describe_end(self, outcome: str) -> str:
        """How the process ended, in words."""
        if outcome == "timeout":
            return "killed for running past its time limit"
        rc = self.returncode
        if rc is not None and rc < 0:
            return f"killed by signal {signal_name(-rc)}"
        return f"exit code {rc}"

    def failure(self, outcome: str, timeout_s: float) -> tuple[str, str]:
        """The status and reason for the pair that was running when the worker ended."""
        if outcome == "timeout":
            return "timeout", f"killed after running past the {timeout_s:g} s time limit (--timeout)"
        rc = self.returncode
        if rc is not None and rc < 0:
            return "crashed", f"worker killed by signal {signal_name(-rc)} while running this pair (log: {self.log_path.name})"
        return "crashed", f"worker exited with code {rc} while running this pair (log: {self.log_path.name})"

    def kill(self) -> None:
        """Kill the worker's whole process group."""
        kill_group(self.process)

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the worker's log, indented."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "".join(f"  {line}\n" for line in text[-lines:])


def signal_name(number: int) -> str:
    """`SIGKILL` for 9, the number itself when it names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
