"""`attnbench run`: the supervisor that runs a suite's pairs in worker processes (`python -m harness.run.worker`).

A worker that dies costs only the pair it was running, recorded `crashed` with its signal or exit
code; a pair that overruns its time limit is killed and recorded `timeout`; the worker is then
restarted on what is left. Out-of-memory inside a pair is caught in the worker itself (`oom`).

The protocol (all of it plain files in the run folder, see `harness.run.protocol`), so the same
workers can be started by a cluster scheduler on a shared file system instead of by this module:

- `manifest.json` lists every pair key (`<case id>-<backend>`) of the run and each pair as data (its
  case's fields and backend), with the budget: workers and `--resume` read the pairs from there, never
  from the suite (whose grid may have changed since); `suite.toml` is a copy of a TOML suite. `records.jsonl` gets one JSON line per finished pair, appended with
  O_APPEND and fsynced one at a time by whoever finished it; a pair is done when it has a line.
- `pending.txt` lists the pairs still to run. Every worker gets the same list and, before each pair,
  claims it by creating `claims/<key>` with O_EXCL: exactly one worker wins, the others skip it
  (dynamic sharing: a fast worker simply claims more). Claims are cleared when a run is resumed.
- Before a pair a worker writes its key to `worker-<name>.current` (atomic replace) and empties it
  after appending the record. Whoever watches the worker (this supervisor, or a scheduler's
  epilogue) reads that file when the worker dies or overruns, appends the `crashed` / `timeout`
  record for that pair, and starts a new worker on the same `pending.txt`.
- A worker exits on purpose with code 70 (`protocol.EXIT_STICKY`) after a pair that left its process
  unusable (a sticky CUDA error such as an illegal memory access); its record is already written.
- Each worker holds `workers.lock` shared for its whole life, the supervisor holds `supervisor.lock`
  exclusively. A supervisor (new, `--force` or `--resume`) starts only when it can take both
  exclusively, so it never runs beside a live supervisor or orphaned workers of an earlier attempt.
  Workers are also started with a parent-death signal (Linux) and watch their parent, so that
  `kill -9` of the supervisor takes them down too; `--resume` then finishes the run.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from harness.backends.registry import Registry, load_registry
from harness.env import detect_device
from harness.measure.threads import threads_for_this_machine
from harness.errors import UserError
from harness.results.documents import MANIFEST
from harness.results.store import RunWriter, validate_run_id, write_csv, write_file
from harness.results.vocabulary import UNTRUSTED_FLAGS
from harness.run import protocol
from harness.run.driver import FailureRows, sigterm_interrupts
from harness.run.order import fair_pairs, select_keys
from harness.run.config import RunConfig, RunSummary  # noqa: F401 - their home was here: importers keep this name
from harness.run.plugin_probe import check_workers_load
from harness.run.progress import Progress
from harness.run.remeasure import remeasure_flagged
from harness.run.manifest_pairs import pair_manifest, suite_of_run
from harness.run.rundir import RunFolder, new_run_id
from harness.run.workers import Slot, Worker, start_template, worker_slots
from harness.suite.catalog import Suite, resolve_suite_name, suite_on_device
from harness.results.record import pair_key

#: A worker's exit code when it ran out of pairs (harness.run.worker; a failed pair is a row, never an exit code).
_FINISHED = (0,)
#: Restarts allowed to a worker slot that died without consuming a pair (a crash at start-up would loop).
_MAX_FRUITLESS_RESTARTS = 2


def _resolve_suite(name: str, device: str) -> tuple[Suite, str]:
    """The suite on `device`, and what it was given as (a TOML file's or run folder's absolute path, else the name).

    A run folder as the suite (what a row's `repro` names) is its pairs as its manifest holds them."""
    if Path(name).is_dir() and (Path(name) / MANIFEST).is_file():
        folder = RunFolder.open(Path(name))
        return suite_of_run(folder.path, folder.document, folder.suite_arg).on_device(device), str(folder.path.resolve())
    name = resolve_suite_name(name, device)
    suite = suite_on_device(name, device)
    if Path(name).suffix == ".toml" or Path(name).exists():
        name = str(Path(name).resolve())
    return suite, name


class Supervisor:
    """Runs the pending pairs of one run folder to completion, in local worker processes.

    The steps an executor may replace are methods: which devices exist (`_default_device`,
    `_check_device`), which options it accepts (`_check_options`), what is measured beside the
    rows (`_write_environment`, `_write_env_after`) and who runs the pending pairs (`_execute`).
    Opening the folder, the rows of broken plugins and the closing rows are shared.
    """

    #: Whether flagged rows are measured again at the end through this executor's `_execute` (harness.run.remeasure).
    remeasures = True
    #: Whether a CPU run given no --threads picks one from this machine's load (the local executor's workers run here).
    chooses_threads = True
    #: Whether a worker process started here is probed for the plugins before a run (harness.run.plugin_probe).
    probes_workers = True
    #: Whether a CPU run's workers are forked here from a worker template (harness.process.forkserver).
    forks_local_workers = True
    #: The reason of the row a pair gets when the run ended without anybody running it.
    missing_reason = "no worker ran this pair (a worker failed outside any pair; see the worker-*.log files)"

    def __init__(self, config: RunConfig, log: TextIO | None = None) -> None:
        self.config = config
        # The stream of now, not of when this module was imported (a default of sys.stderr is bound once: a test's
        # captured stream, closed since).
        self.log = log if log is not None else sys.stderr
        self.registry: Registry = load_registry()
        #: The pairs being measured again now (a worker that dies on one leaves its first row standing).
        self._remeasuring: set[str] = set()

    # -- set-up -------------------------------------------------------------------------------
    def _check_options(self, device: str) -> None:
        """Refuse options this executor cannot honour on `device` (UserError), before any folder is touched."""
        self._slots(device)

    def _default_device(self) -> str:
        """The device a new run gets when --device is not given."""
        return detect_device()

    def _check_device(self, device: str) -> None:
        """Refuse a device that is not there."""
        if device == "cuda" and detect_device() != "cuda":
            raise UserError("--device cuda asked for, but torch sees no CUDA device")

    def _write_environment(self, folder: RunFolder, suite: Suite) -> None:
        """env.json and peaks.json of a new run, before any pair runs (so nothing competes with the peaks)."""
        folder.write_env_before()
        # The CPU ceiling is the best of products the suite's own cases perform, at the run's thread count.
        folder.write_peaks(sorted({c.dtype for c in suite.cases}), suite.cases, folder.document.options.threads, source=self.config.peaks)

    def _write_env_after(self, folder: RunFolder) -> None:
        """What env.json gets after the last pair."""
        folder.write_env_after()

    def _slots(self, device: str) -> list[Slot]:
        config = self.config
        if not config.case_timeout_s > 0:
            raise UserError(f"--timeout must be a positive number of seconds, got {config.case_timeout_s}")
        return worker_slots(device, config.workers, config.gpus, config.memory_limit)

    def _open(self) -> RunFolder:
        """The run folder: an existing one to resume, or a new one with its manifest, env.json and peaks.json."""
        config = self.config
        if config.resume is not None:
            folder = RunFolder.open(Path(config.resume))
            self._check_options(folder.device)  # reject impossible worker options before locking
            folder.lock()
            return folder
        device = config.device or self._default_device()
        if device not in ("cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: expected cpu or cuda")
        self._check_device(device)
        self._check_options(device)
        if config.options.cooldown_s is not None and device != "cuda":
            raise UserError("--cooldown waits for the GPU's temperature (NVML); a CPU run has no such reading: drop --cooldown")
        suite, suite_arg = _resolve_suite(config.suite, device)
        names = suite.backend_names(config.backends, self.registry.names())
        broken: dict[str, str] = {}
        capabilities: dict[str, dict[str, bool]] = {}
        for name in names:
            try:
                capabilities[name] = self.registry.get(name).capabilities()
            except UserError as exc:
                if name not in self.registry:
                    raise
                # A plugin that failed to load is listed, with its error, as unsupported rows: it never stops the run.
                broken[name] = str(exc)
                self.log.write(f"attnbench: {exc}\n")
        ordered = {pair_key(c, b): (c, b) for c, b in fair_pairs(suite.pairs(names), config.options.order_seed)}
        keys = select_keys(list(ordered.values()), config.only, config.cases, suite.name)
        if self.probes_workers:  # before the folder exists: a plugin no worker can load would make each of its rows an error
            check_workers_load(self.registry, list(dict.fromkeys(ordered[k][1] for k in keys)), {**os.environ, **config.worker_env},
                               fork=device == "cpu")
        run_id = validate_run_id(config.run_id or new_run_id(suite.slug))
        options = replace(config.options, budget=config.options.budget or suite.budget)
        threads_chosen = None
        if device == "cpu" and options.threads is None and self.chooses_threads:
            threads, threads_chosen = threads_for_this_machine()
            options = replace(options, threads=threads)
        manifest = {
            "run_id": run_id, "suite": suite.name, "suite_arg": suite_arg, "suite_copy": None, "device": device,
            "backends": names, "broken": broken, "capabilities": capabilities,
            # The pairs as data and the options with their budget: resume, report and compare never load the suite again.
            **pair_manifest([ordered[k] for k in keys]), **options.to_manifest(),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": sys.executable,  # what `repro` runs: a fresh shell's `python` may not hold this torch
            "threads_chosen": threads_chosen,
        }
        folder = RunFolder.create(Path(config.out) / run_id, manifest, force=config.force,
                                  suite_file=suite_arg if Path(suite_arg).suffix == ".toml" else None, pairs={k: ordered[k] for k in keys})
        if config.options.traces:
            (folder.path / protocol.TRACES).mkdir(exist_ok=True)
        if device == "cpu" and self.forks_local_workers:
            self._start_worker_template(device)
        self._write_environment(folder, suite)
        folder.write_capabilities(self.registry, names)
        return folder

    def _start_worker_template(self, device: str) -> None:
        """Start the CPU workers' template before this process measures its ceilings on the run's threads: an OpenMP pool
        made by that measurement would keep the `attnbench` command from forking the template from itself (a second
        import of torch instead, harness.process.command_image). It waits, ready, while the ceilings are measured."""
        start_template(self._slots(device)[0], self.config.worker_env)

    # -- running ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Run every pair of the run that has no record yet; return the summary."""
        started = time.monotonic()
        folder = self._open()
        folder.path = folder.path.resolve()
        try:
            return self._run(folder, started)
        except OSError as exc:  # ENOSPC, EFBIG (ulimit -f), EIO: the rows written so far are whole and fsynced
            raise UserError(f"cannot write to {folder.path} ({exc.strerror or exc}): the finished rows are kept; "
                            f"free space, then finish with: attnbench run --resume {folder.path}") from None
        finally:
            folder.unlock()

    def _run(self, folder: RunFolder, started: float) -> RunSummary:
        self._started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
        pairs = folder.pairs()  # from the manifest alone, in the run's order: the one source of what the run is
        recorded = folder.recorded(repair=True)
        foreign = [r for r in recorded if r.pair_key not in pairs or (r.run_id and r.run_id != folder.run_id)]
        if foreign:
            raise UserError(f"{folder.path / 'records.jsonl'} holds {len(foreign)} rows that are not pairs of run {folder.run_id} "
                            f"(first: {foreign[0].pair_key} of run {foreign[0].run_id!r}): the folder mixes runs; resume refuses it")
        done = {r.pair_key for r in recorded}
        total = len(pairs)
        failures = FailureRows(RunWriter(folder.path), folder, pairs, self.registry)
        broken = folder.broken
        for key in pairs:
            if key not in done and pairs[key][1] in broken:
                failures.write(key, "supervisor", "unsupported", broken[pairs[key][1]])
                done.add(key)
        pending = [k for k in pairs if k not in done]
        progress = Progress(total, len(done), self.log if self.config.progress else None)
        (folder.path / protocol.REMEASURE).unlink(missing_ok=True)  # an interrupted re-measure's plan: its pairs have rows
        self._execute(folder, pending, failures, progress)
        progress.update(folder.count_lines(), final=True, last_pair=folder.last_recorded_key)
        remeasured = self._remeasure(folder, failures, started) if self.remeasures and folder.document.options.remeasure else {}
        summary = self._finish(folder, failures, progress, started)
        summary.remeasured = remeasured
        return summary

    def _remeasure(self, folder: RunFolder, failures: FailureRows, started: float) -> dict[str, int]:
        """Measure the flagged rows once more in fresh local workers (harness.run.remeasure), noting which are being measured."""
        def execute(keys: list[str], progress: Progress, stop_at: float) -> None:
            self._remeasuring = set(keys)
            try:
                self._execute(folder, keys, failures, progress, stop_at=stop_at)
            finally:
                self._remeasuring = set()

        return remeasure_flagged(folder, execute, started, self.log if self.config.progress else None)

    def _execute(self, folder: RunFolder, pending: list[str], failures: FailureRows, progress: Progress, stop_at: float | None = None) -> None:
        """Run the pending pairs in local workers that share them through the folder's claims.

        `stop_at` (time.monotonic()): from then on no pair is started; the ones left are claimed here so that every worker
        finds none and ends after the pair it is running."""
        run_dir = folder.path
        claims = run_dir / protocol.CLAIMS
        shutil.rmtree(claims, ignore_errors=True)  # claims of an earlier attempt: their pairs have no record
        claims.mkdir()
        write_file(run_dir / protocol.PENDING, "".join(f"{k}\n" for k in pending))
        slots = self._slots(folder.device)[: max(1, len(pending))]
        active: dict[str, Worker] = {}
        fruitless: dict[str, int] = {}
        # CPU workers are forked from a template that has imported torch once (harness.process.forkserver); CUDA ones start fresh.
        fork = folder.device == "cpu"
        start = lambda slot, attempt=0: Worker.start(folder, slot, self.config.worker_env, self.config.memory_limit, attempt, fork)  # noqa: E731
        with sigterm_interrupts():
            try:
                if pending:
                    for slot in slots:
                        active[slot.name] = start(slot)
                while active:
                    time.sleep(0.2)
                    if stop_at is not None and time.monotonic() >= stop_at:
                        for key in pending:
                            protocol.try_claim(run_dir, key, "supervisor")
                        stop_at = None
                    progress.update(folder.count_lines(), last_pair=folder.last_recorded_key)
                    for name, worker in list(active.items()):
                        outcome = worker.poll(self.config.case_timeout_s)
                        if outcome is None:
                            continue
                        del active[name]
                        restart, consumed = self._settle(worker, outcome, folder, failures)
                        fruitless[name] = 0 if consumed else fruitless.get(name, 0) + 1
                        unclaimed = any(not protocol.claim_path(run_dir, k).exists() for k in pending)
                        if restart and unclaimed and fruitless[name] <= _MAX_FRUITLESS_RESTARTS:
                            active[name] = start(worker.slot, worker.attempt + 1)
            except BaseException as exc:
                for worker in active.values():
                    worker.kill()
                if isinstance(exc, KeyboardInterrupt):
                    self.log.write(f"\ninterrupted: finished rows are in {run_dir}; finish with: attnbench run --resume {run_dir}\n")
                raise

    def _finish(self, folder: RunFolder, failures: FailureRows, progress: Progress, started: float) -> RunSummary:
        """Give every pair still without a row one, write records.csv and the closing environment; the summary."""
        progress.update(folder.count_lines(), final=True, last_pair=folder.last_recorded_key)
        pairs = failures.pairs
        records = folder.recorded()  # read once: a quick run's 1,000 rows cost half a second a reading
        missing = set(pairs) - {r.pair_key for r in records}
        for key in [k for k in pairs if k in missing]:  # a worker that gave up without a trace still leaves a row
            failures.write(key, "supervisor", "error", self.missing_reason)
        if missing:
            records = folder.recorded()
        write_csv(folder.path, records)
        self._write_env_after(folder)
        folder.clear_worker_files()
        folder.add_attempt(self._started_utc, time.monotonic() - started)
        counts: dict[str, int] = {}
        for record in records:
            counts[record.status.value] = counts.get(record.status.value, 0) + 1
        # Counted from the closing read, never on the progress bar's poll (that would parse rows beside timed samples).
        undecided = {why: sum(1 for r in records if getattr(r, why)) for why in UNTRUSTED_FLAGS}
        return RunSummary(folder.path, counts, len(pairs), time.monotonic() - started, {k: n for k, n in undecided.items() if n})

    def _settle(self, worker: Worker, outcome: str, folder: RunFolder, failures: FailureRows) -> tuple[bool, bool]:
        """Account for a worker that ended: (whether to restart it, whether it used up a pair on the way)."""
        rc = worker.returncode
        if outcome == "exited" and rc in _FINISHED:
            return False, True
        if outcome == "exited" and rc == protocol.EXIT_STICKY:
            return True, True  # it wrote the pair's `crashed` record itself before exiting
        if outcome == "exited" and rc == protocol.EXIT_CANNOT_WRITE:
            raise OSError(f"worker {worker.slot.name} could not append its row (see {worker.log_path.name})")
        failed_key = worker.current_pair()
        if failed_key and failed_key in self._remeasuring:
            self.log.write(f"\nworker {worker.slot.name} ended ({worker.describe_end(outcome)}) while measuring {failed_key} again: its first row stands\n")
            return True, True
        if failed_key and failed_key not in folder.recorded_keys():
            status, reason = worker.failure(outcome, self.config.case_timeout_s)
            failures.write(failed_key, worker.slot.name, status, reason)
            return True, True
        self.log.write(f"\nworker {worker.slot.name} ended ({worker.describe_end(outcome)}) outside any pair; last lines of {worker.log_path}:\n")
        self.log.write(worker.log_tail())
        # A usage or internal error would only repeat itself; a signal (the kernel's OOM killer, say) may not.
        return outcome == "timeout" or (rc is not None and rc < 0), False
