"""The one worker loop: claim a pair, execute it with the worker's one `PairRunner`, append its record.

Every executor runs it. The local supervisor starts `python -m harness.child worker --run-dir D --worker N`
with only what the process itself must know (its parent's pid, a memory cap); the worker reads the
rest from the run folder: the pairs (`pending.txt`, in the run's order, through `RunFolder.pairs()`),
the budget, the phases (check, timer, energy, profile, traces) and the cool-down from its manifest.
A Ray task runs the same loop on a node (harness.run.ray_tasks) and streams its events to the driver,
which writes the rows there; `pytest suites/` runs the loop's pairs one test at a time, through
pytest-benchmark (harness.run.pytest_plugin).

The protocol with whoever watches a local worker (harness.run.supervisor) is files and exit codes:
before a pair its key goes into `worker-<name>.current` and after its record the file is emptied; a
pair is claimed through `claims/` so that workers share one pending list; exit 0 when no pair is
left, `EXIT_STICKY` after a pair that left the process unusable, `EXIT_CANNOT_WRITE` when a row
cannot be appended, `EXIT_ORPHANED` when the supervisor has gone, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from harness.backends.determinism import cublas_workspace_for
from harness.backends.registry import Registry, UnloadedPlugin, load_registry
from harness.errors import STICKY_PREFIX, UserError
from harness.execution.execute import PairRunner, Phases, execute
from harness.execution.outcome import case_record
from harness.process.warmup import warm_process
from harness.measure.threads import apply_threads
from harness.measure.timing import Clock, Loop
from harness.results.documents import Manifest
from harness.results.record import Record, Status
from harness.results.store import RunWriter
from harness.process.children import watch_parent
from harness.run import protocol
from harness.run.cooldown import Cooldown, Waited, worker_cooldown
from harness.run.remeasure import read_plan
from harness.run.repro import RunRows
from harness.run.rundir import RunFolder, read_run_manifest
from harness.suite.cases import Case

#: A pair to run: its key, its case and its backend's name.
PairItem = tuple[str, Case, str]


@dataclass(frozen=True)
class Started:
    """The loop is about to run pair `key` (its cool-down, if any, is over)."""

    key: str


@dataclass(frozen=True)
class Finished:
    """Pair `key` ended with `record` (a failure is a record too)."""

    key: str
    record: Record


def poisons_process(record: Record) -> bool:
    """True when the record's pair left the process unusable, so the worker must exit after writing it."""
    return record.status is Status.CRASHED and (record.reason or "").startswith(STICKY_PREFIX)


def run_phases(manifest: Manifest, traces: Path | None = None) -> Phases:
    """The phases every pair of the run `manifest` describes runs: the check, the timer, energy and profile as asked."""
    return Phases.of_run(manifest.options, traces)


@dataclass
class WorkerLoop:
    """One worker's life: one runner (its float64 reference shared by a case's backends), one registry, its pairs in turn."""

    run_id: str
    worker: str
    runner: PairRunner
    registry: Registry
    #: Stamps each row with its place in its case's order and its repro command (None outside a supervised run).
    rows: RunRows | None = None
    #: Waited for before each pair (GPU temperature); None: no wait.
    cooldown: Cooldown | None = None
    #: Columns saying where the pairs ran (a Ray node's `node` and `device_name`), set on every record.
    where: dict[str, Any] = field(default_factory=dict)
    #: Called after each pair, once its record is made: a process entry point passes `gc.freeze` (what survived the
    #: pair's collection is alive on purpose, so the next pair's collection walks only what that pair creates,
    #: 85 ms -> ~1 ms a pair). Process-wide state is the process's own choice, never the library's.
    after_pair: Callable[[], object] | None = None
    #: torch's intra-op CPU threads, set before each pair is timed (`run --threads`); None: the process's count as it is.
    threads: int | None = None
    #: Pairs measured again at the end of the sweep, each with its first row's evidence, stamped on the new row as
    #: `remeasured_from` (harness.run.remeasure); empty in the sweep itself.
    remeasure: dict[str, dict[str, Any]] = field(default_factory=dict)

    def events(self, pairs: Iterable[PairItem], claim: Callable[[str], bool] = lambda key: True) -> Iterator[Started | Finished]:
        """Run each pair this worker claims: `Started` before it, `Finished` after; stop after a pair that poisons the process."""
        for key, case, backend_name in pairs:
            if not claim(key):
                continue
            # Before the pair is announced: a cool-down is not the pair's time, so it never counts against its --timeout.
            waited = self.cooldown.wait() if self.cooldown is not None else None
            yield Started(key)
            record = self.run_pair(case, backend_name, waited=waited)
            if key in self.remeasure:
                record.remeasured_from = self.remeasure[key]
            yield Finished(key, record)
            if poisons_process(record):
                return  # nothing more can run here (a dead CUDA context): whoever watches starts a fresh worker

    def run_pair(self, case: Case, backend_name: str, *, waited: Waited | None = None,
                 loop_factory: Callable[[Clock], Loop] | None = None) -> Record:
        """Measure one pair (its timed rounds driven by `loop_factory`'s loop when given) and return its stamped record."""
        try:
            backend = self.registry.get(backend_name)
        except UserError as exc:  # the plugin loads where the run was planned but not in this worker
            record = case_record(case, UnloadedPlugin(backend_name, str(exc)), self.run_id, self.worker)
            record.status, record.reason = Status.ERROR, f"worker {self.worker} cannot load backend {backend_name}: {exc}"
        else:
            threads = apply_threads(self.threads)  # a no-op after the first pair: torch keeps the count process-wide
            warm_process()  # the autograd engine's start-up, once, before this process's first pair is timed
            runner = self.runner if loop_factory is None else replace(self.runner, loop_factory=loop_factory)
            record = execute(case, backend, runner, self.run_id, self.worker)
            if record.status is not Status.UNSUPPORTED:  # an unsupported pair ran nothing, on any number of threads
                record.threads = threads
        for name, value in self.where.items():
            setattr(record, name, value)
        if self.rows is not None:
            self.rows.stamp(record)
        if waited is not None:
            record.cooldown_s = waited.seconds
            if waited.problem:
                record.notes = {**(record.notes or {}), "cooldown": waited.problem}
        if self.after_pair is not None:
            self.after_pair()
        return record


def folder_loop(folder: RunFolder, worker: str, pairs: dict[str, tuple[Case, str]], registry: Registry | None = None) -> WorkerLoop:
    """The loop of worker `worker` on run folder `folder` (whose pairs by key are `pairs`), configured from the folder alone."""
    manifest = folder.document
    runner = PairRunner(budget=folder.budget, phases=run_phases(manifest, folder.path / protocol.TRACES))
    max_s = manifest.options.cooldown_s
    cooldown = worker_cooldown(max_s, folder.path) if max_s is not None else None
    return WorkerLoop(folder.run_id, worker, runner, registry or load_registry(), RunRows(folder.manifest, folder.path, pairs),
                      cooldown, threads=manifest.options.threads, remeasure=read_plan(folder.path))


def pending_pairs(folder: RunFolder, pairs: dict[str, tuple[Case, str]]) -> list[PairItem]:
    """The pairs of `pending.txt` in its order (the run's), each once; keys the run does not hold are skipped."""
    try:
        keys = (folder.path / protocol.PENDING).read_text().split()
    except OSError as exc:
        raise UserError(f"cannot read {folder.path / protocol.PENDING}: {exc.strerror or exc}") from None
    return [(key, *pairs[key]) for key in dict.fromkeys(keys) if key in pairs]


def serve(folder: RunFolder, loop: WorkerLoop, pairs: Iterable[PairItem], say: Callable[[str], None]) -> int:
    """Run the pairs this worker claims on the folder, appending each record; the worker's exit code."""
    writer = RunWriter(folder.path)
    current = protocol.current_path(folder.path, loop.worker)
    claim = lambda key: protocol.try_claim(folder.path, key, loop.worker)  # noqa: E731
    for event in loop.events(pairs, claim):
        if isinstance(event, Started):
            # Said before the pair starts, so that a supervisor can name the pair a crash took.
            protocol.atomic_write(current, event.key)
            continue
        try:
            writer.append(event.record)
            protocol.atomic_write(current, "")
        except OSError as exc:
            # Measuring on would lose every later row too: stop, and let the supervisor say so once.
            say(f"attnbench worker {loop.worker}: cannot write to {folder.path}: {exc.strerror or exc}")
            return protocol.EXIT_CANNOT_WRITE
        if poisons_process(event.record):
            say(f"attnbench worker {loop.worker}: {event.record.reason}; exiting for a restart")
            return protocol.EXIT_STICKY
    return 0


def _parser() -> argparse.ArgumentParser:
    from harness.process.jobs import job_parser

    parser = job_parser("worker", "Run the pending pairs of a run folder (started by attnbench run).")
    parser.add_argument("--run-dir", required=True, type=Path, help="the run folder (manifest.json, pending.txt)")
    parser.add_argument("--worker", required=True, help="this worker's name in records and in worker-<name>.current")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the supervisor) is gone")
    parser.add_argument("--memory-limit", type=int, default=None,
                        help="cap this worker's address space at its start-up size plus this many bytes (RLIMIT_AS)")
    return parser


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """The worker process: take the folder's workers lock, run its pending pairs, return the exit code."""
    try:
        args = _parser().parse_args(argv)
        if args.parent_pid is not None:
            watch_parent(args.parent_pid)
        manifest = read_run_manifest(args.run_dir, "worker cannot run")
        folder = RunFolder(args.run_dir, manifest)
        # Held until this process ends: a supervisor refuses to (re)start the folder while any worker lives.
        protocol.FolderLock(folder.path / protocol.WORKERS_LOCK).shared()
        if args.memory_limit is not None:
            cap = protocol.limit_address_space(args.memory_limit)
            _say(f"attnbench worker {args.worker}: address space capped at {cap / 2**30:.2f} GiB")
        by_key = folder.pairs()
        for name, value in cublas_workspace_for(case for case, _ in by_key.values()).items():
            os.environ.setdefault(name, value)  # before this process's first cuBLAS call
        loop = folder_loop(folder, args.worker, by_key)
        pairs = pending_pairs(folder, by_key)
    except UserError as exc:
        _say(f"attnbench worker: {exc}")
        return 2
    gc.freeze()  # the imports and the registry live as long as the worker: no pair's collection need walk them
    loop.after_pair = gc.freeze
    with loop.runner.resources:  # NVML, RAPL and the flush buffer are given back when the worker's pairs are done
        return serve(folder, loop, pairs, _say)


def worker_job(argv: list[str]) -> int:
    """harness.child's `worker` job: the worker process; after a sticky CUDA error it leaves without the interpreter's teardown."""
    code = main(argv)
    if code == protocol.EXIT_STICKY:
        sys.stderr.flush()
        os._exit(code)  # a dead CUDA context may hang or crash the interpreter's normal teardown
    return code
