"""`attnbench run`: the supervisor that runs a suite's pairs in pytest worker processes.

A worker that dies costs only the pair it was running, recorded `crashed` with its signal or exit
code; a pair that overruns its time limit is killed and recorded `timeout`; the worker is then
restarted on what is left. Out-of-memory inside a pair is caught in the worker itself (`oom`).

The protocol (all of it plain files in the run folder, see `harness.run.protocol`), so the same
workers can be started by a cluster scheduler on a shared file system instead of by this module:

- `manifest.json` lists every pair key (`<case id>-<backend>`) of the run; `suite.toml` is a frozen
  copy of a TOML suite. `records.jsonl` gets one JSON line per finished pair, appended with
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

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from harness.run import protocol
from harness.backends.base import Backend
from harness.backends.registry import Registry, load_registry
from harness.suite.cases import Case
from harness.env import fingerprint, gpu_telemetry
from harness.errors import UserError
from harness.results.store import RECORDS, RunWriter, read_records, validate_run_id, write_csv
from harness.measure.execute import Options, base_record
from harness.measure.roofline import write_peaks
from harness.suite.catalog import Suite, load_suite, pair_key

MANIFEST = "manifest.json"
SUITE_COPY = "suite.toml"
SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"
#: pytest's exit codes for a session that ran to its end (all passed, some failed, nothing to run).
_PYTEST_FINISHED = (0, 1, 5)
#: How long a new supervisor waits for orphaned workers of a killed one to die (they get SIGKILL at once on Linux).
_ORPHAN_WAIT_S = 5.0
#: Restarts allowed to a worker slot that died without consuming a pair (a crash at start-up would loop).
_MAX_FRUITLESS_RESTARTS = 2


def new_run_id(suite: str) -> str:
    """A sortable, unique-enough run id: UTC time, suite name and process id."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{suite}-{os.getpid()}"


@dataclass
class RunConfig:
    """What `attnbench run` was asked for (built by the CLI, or by hand in tests)."""

    suite: str
    device: str | None = None
    backends: list[str] | None = None
    out: Path = Path("results")
    run_id: str | None = None
    workers: int = 1
    gpus: list[int] | None = None
    force: bool = False
    resume: Path | None = None
    check: bool = True
    case_timeout_s: float = 600.0
    #: Keep only pairs whose key contains every one of these substrings.
    only: list[str] = field(default_factory=list)
    progress: bool = False
    worker_env: dict[str, str] = field(default_factory=dict)
    #: Address space each CPU worker may add to its start-up size (RLIMIT_AS), in bytes; None = no cap.
    memory_limit: int | None = None


@dataclass
class RunSummary:
    """Where a run went and how its pairs ended."""

    run_dir: Path
    counts: dict[str, int]
    total: int
    wall_s: float


def detect_device() -> str:
    """`cuda` when torch sees a GPU, else `cpu`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_suite(config: RunConfig, device: str) -> tuple[Suite, str]:
    name = config.suite
    if name == "auto":
        name = "default" if device == "cuda" else "quick"
    suite = load_suite(name)
    if Path(name).suffix == ".toml" or Path(name).exists():
        name = str(Path(name).resolve())
    return suite.on_device(device), name


class _Unloadable(Backend):
    """Stands for a backend plugin that failed to load, so that its pairs still get `unsupported` rows."""

    family = "plugin"

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason  # type: ignore[misc]

    def version(self) -> str:
        """Unknown: the plugin never loaded."""
        return ""

    def available(self) -> str | None:
        """Why the plugin cannot run: its load error."""
        return self.reason


class Supervisor:
    """Runs the pending pairs of one run folder to completion."""

    def __init__(self, config: RunConfig, log: TextIO = sys.stderr) -> None:
        self.config = config
        self.log = log
        self.registry: Registry = load_registry()
        self._lock: protocol.FolderLock | None = None

    # -- set-up -------------------------------------------------------------------------------
    def _take_folder(self, run_dir: Path) -> None:
        """Lock a run folder for this supervisor, refusing while another supervisor or any worker still uses it."""
        lock = protocol.FolderLock(run_dir / protocol.SUPERVISOR_LOCK)
        if not lock.try_exclusive():
            raise UserError(f"run folder {run_dir} is in use by another attnbench run: wait for it to end or stop it first")
        workers = protocol.FolderLock(run_dir / protocol.WORKERS_LOCK)
        # Orphaned workers of a killed supervisor die with it (parent-death signal), but not at once.
        if not workers.try_exclusive(wait_s=_ORPHAN_WAIT_S):
            lock.release()
            raise UserError(f"run folder {run_dir} still has live workers of an earlier attempt "
                            f"(they hold {run_dir / protocol.WORKERS_LOCK}): stop them, then resume")
        workers.release()
        self._lock = lock

    def _backend_for(self, name: str, manifest: dict[str, Any]) -> Backend:
        broken = manifest.get("broken", {})
        return _Unloadable(name, broken[name]) if name in broken else self.registry.get(name)

    def _prepare_run_dir(self) -> tuple[Path, dict[str, Any]]:
        config = self.config
        if config.resume is not None:
            run_dir = Path(config.resume)
            manifest_path = run_dir / MANIFEST
            if not manifest_path.exists():
                raise UserError(f"cannot resume {run_dir}: no {MANIFEST} there (is it a run folder?)")
            manifest = json.loads(manifest_path.read_text())
            self._worker_slots(manifest["device"])  # reject impossible worker options before locking
            self._take_folder(run_dir)
            return run_dir, manifest
        device = config.device or detect_device()
        if device not in ("cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: expected cpu or cuda")
        if device == "cuda" and detect_device() != "cuda":
            raise UserError("--device cuda asked for, but torch sees no CUDA device")
        self._worker_slots(device)
        suite, suite_arg = _resolve_suite(config, device)
        names = config.backends or (list(suite.backends) if suite.backends else self.registry.names())
        broken: dict[str, str] = {}
        for name in names:
            try:
                self.registry.get(name)
            except UserError as exc:
                if name not in self.registry:
                    raise
                # A plugin that failed to load is listed, with its error, as unsupported rows: it never stops the run.
                broken[name] = str(exc)
                self.log.write(f"attnbench: {exc}\n")
        keys = [k for k in (pair_key(c, b) for c, b in suite.pairs(names)) if all(o in k for o in config.only)]
        if not keys:
            raise UserError(f"--only {','.join(config.only)} matches no pair of suite {suite.name!r}" if config.only else f"suite {suite.name!r} has no pairs")
        run_id = validate_run_id(config.run_id or new_run_id(suite.name))
        run_dir = Path(config.out) / run_id
        if run_dir.exists() and any(run_dir.iterdir()):
            if not config.force:
                raise UserError(f"run folder {run_dir} already exists: pass --force to overwrite it or --resume {run_dir} to finish it")
            self._take_folder(run_dir)  # never delete a folder that live workers still write to
            shutil.rmtree(run_dir)
            self._release()
        run_dir.mkdir(parents=True, exist_ok=True)
        self._take_folder(run_dir)
        suite_copy = None
        if Path(suite_arg).suffix == ".toml":
            # Workers and a later --resume read this frozen copy, whatever happens to the user's file.
            shutil.copyfile(suite_arg, run_dir / SUITE_COPY)
            suite_copy = SUITE_COPY
        manifest = {
            "run_id": run_id, "suite": suite.name, "suite_arg": suite_arg, "suite_copy": suite_copy, "device": device,
            "backends": names, "broken": broken, "pairs": keys, "check": config.check,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
        env = {"before": fingerprint(device), "telemetry_before": gpu_telemetry() if device == "cuda" else None}
        (run_dir / "env.json").write_text(json.dumps(env, indent=1, default=str))
        # The device's own ceilings, measured before any worker starts so nothing competes with them.
        write_peaks(run_dir, device, sorted({c.dtype for c in suite.cases}))
        return run_dir, manifest

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @staticmethod
    def _suite_arg(run_dir: Path, manifest: dict[str, Any]) -> str:
        copy = manifest.get("suite_copy")
        return str(run_dir / copy) if copy else manifest["suite_arg"]

    def _pairs(self, run_dir: Path, manifest: dict[str, Any]) -> dict[str, tuple[Case, str]]:
        suite = load_suite(self._suite_arg(run_dir, manifest)).on_device(manifest["device"])
        return {pair_key(c, b): (c, b) for c, b in suite.pairs(manifest["backends"])}

    @staticmethod
    def _recorded(run_dir: Path, repair: bool = False) -> list[dict[str, Any]]:
        """The records so far; with `repair` (only while no worker runs) a truncated last line is cut off the file."""
        if not (run_dir / RECORDS).exists():
            return []
        result = read_records(run_dir / RECORDS)
        if result.dropped_partial_line and repair:
            _drop_partial_line(run_dir / RECORDS)
        return result.records

    # -- running ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Run every pair of the run that has no record yet; return the summary."""
        started = time.monotonic()
        run_dir, manifest = self._prepare_run_dir()
        try:
            return self._run(run_dir.resolve(), manifest, started)
        finally:
            self._release()

    def _record_failure(self, writer: RunWriter, pairs: dict[str, tuple[Case, str]], key: str, worker: str,
                        manifest: dict[str, Any], status: str, reason: str) -> None:
        case, backend = pairs[key]
        options = Options(run_id=manifest["run_id"], worker=worker)
        writer.append({**base_record(case, self._backend_for(backend, manifest), options), "status": status, "reason": reason})

    def _run(self, run_dir: Path, manifest: dict[str, Any], started: float) -> RunSummary:
        pairs = self._pairs(run_dir, manifest)
        done = {pair_key_of(r) for r in self._recorded(run_dir, repair=True)}
        total = len(manifest["pairs"])
        writer = RunWriter(run_dir)
        broken = manifest.get("broken", {})
        for key in manifest["pairs"]:
            if key not in done and pairs[key][1] in broken:
                self._record_failure(writer, pairs, key, "supervisor", manifest, "unsupported", broken[pairs[key][1]])
                done.add(key)
        pending = [k for k in manifest["pairs"] if k not in done]
        claims = run_dir / protocol.CLAIMS
        shutil.rmtree(claims, ignore_errors=True)  # claims of an earlier attempt: their pairs have no record
        claims.mkdir()
        (run_dir / protocol.PENDING).write_text("".join(f"{k}\n" for k in pending))
        slots = self._worker_slots(manifest["device"])[: max(1, len(pending))]
        progress = _Progress(total, len(done), self.log if self.config.progress else None)
        active: dict[str, _Worker] = {}
        fruitless: dict[str, int] = {}
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            if pending:
                for slot in slots:
                    active[slot.name] = self._spawn(slot, run_dir, manifest)
            while active:
                time.sleep(0.2)
                progress.update(_count_lines(run_dir / RECORDS))
                for name, worker in list(active.items()):
                    outcome = worker.poll(self.config.case_timeout_s)
                    if outcome is None:
                        continue
                    del active[name]
                    restart, consumed = self._settle(worker, outcome, writer, pairs, manifest, run_dir)
                    fruitless[name] = 0 if consumed else fruitless.get(name, 0) + 1
                    unclaimed = any(not protocol.claim_path(run_dir, k).exists() for k in pending)
                    if restart and unclaimed and fruitless[name] <= _MAX_FRUITLESS_RESTARTS:
                        active[name] = self._spawn(worker.slot, run_dir, manifest, attempt=worker.attempt + 1)
        except KeyboardInterrupt:
            for worker in active.values():
                worker.kill()
            self.log.write(f"\ninterrupted: finished rows are in {run_dir}; finish with: attnbench run --resume {run_dir}\n")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous_term)
        progress.update(_count_lines(run_dir / RECORDS), final=True)
        missing = set(manifest["pairs"]) - {pair_key_of(r) for r in self._recorded(run_dir)}
        for key in [k for k in manifest["pairs"] if k in missing]:  # a worker that gave up without a trace still leaves a row
            self._record_failure(writer, pairs, key, "supervisor", manifest, "error", "no worker ran this pair (a worker failed outside any pair; see the worker-*.log files)")
        write_csv(run_dir)
        env_path = run_dir / "env.json"
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
        env["telemetry_after"] = gpu_telemetry() if manifest["device"] == "cuda" else None
        env_path.write_text(json.dumps(env, indent=1, default=str))
        counts: dict[str, int] = {}
        for record in self._recorded(run_dir):
            counts[record["status"]] = counts.get(record["status"], 0) + 1
        return RunSummary(run_dir, counts, total, time.monotonic() - started)

    def _settle(self, worker: "_Worker", outcome: str, writer: RunWriter, pairs: dict[str, tuple[Case, str]],
                manifest: dict[str, Any], run_dir: Path) -> tuple[bool, bool]:
        """Account for a worker that ended: (whether to restart it, whether it used up a pair on the way)."""
        rc = worker.returncode
        if outcome == "exited" and rc in _PYTEST_FINISHED:
            return False, True
        if outcome == "exited" and rc == protocol.EXIT_STICKY:
            return True, True  # it wrote the pair's `crashed` record itself before exiting
        failed_key = worker.current_pair()
        if failed_key and failed_key not in {pair_key_of(r) for r in self._recorded(run_dir)}:
            status, reason = worker.failure(outcome, self.config.case_timeout_s)
            self._record_failure(writer, pairs, failed_key, worker.slot.name, manifest, status, reason)
            return True, True
        self.log.write(f"\nworker {worker.slot.name} ended ({worker.describe_end(outcome)}) outside any pair; last lines of {worker.log_path}:\n")
        self.log.write(_tail(worker.log_path, 8))
        # A usage or internal error would only repeat itself; a signal (the kernel's OOM killer, say) may not.
        return outcome == "timeout" or (rc is not None and rc < 0), False

    def _worker_slots(self, device: str) -> list["_Slot"]:
        config = self.config
        if config.workers < 1:
            raise UserError(f"--workers must be at least 1, got {config.workers}")
        if not config.case_timeout_s > 0:
            raise UserError(f"--timeout must be a positive number of seconds, got {config.case_timeout_s}")
        if config.gpus is not None:
            if device != "cuda":
                raise UserError("--gpus needs --device cuda (on the CPU, use --workers N)")
            if len(set(config.gpus)) != len(config.gpus) or any(g < 0 for g in config.gpus):
                raise UserError(f"--gpus lists each GPU once, by index: got {','.join(map(str, config.gpus))}")
            return [_Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": str(g)}) for g in config.gpus]
        if device == "cuda" and config.workers > 1:
            raise UserError("--workers > 1 on CUDA would share one GPU between workers and disturb their timings: use --gpus all")
        if device == "cuda" and config.memory_limit is not None:
            raise UserError("--memory-limit caps CPU workers only (CUDA maps far more address space than it uses)")
        n = config.workers
        env = {}
        if n > 1:
            # Split the cores so that concurrent workers do not oversubscribe them.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
        return [_Slot(str(i), env) for i in range(n)]

    def _spawn(self, slot: "_Slot", run_dir: Path, manifest: dict[str, Any], attempt: int = 0) -> "_Worker":
        current = protocol.current_path(run_dir, slot.name)
        protocol.atomic_write(current, "")
        log_path = run_dir / f"worker-{slot.name}.log"
        command = [
            sys.executable, "-m", "pytest", str(SUITES_DIR / "test_bench.py"),
            "-p", "harness.run.pytest_plugin", "-p", "no:cacheprovider", "-q", "--no-header",
            "--rootdir", str(SUITES_DIR.parent),
            "--attnbench-suite", self._suite_arg(run_dir, manifest), "--attnbench-device", manifest["device"],
            "--attnbench-backends", ",".join(b for b in manifest["backends"] if b not in manifest.get("broken", {})),
            "--attnbench-run-dir", str(run_dir), "--attnbench-pairs", str(run_dir / protocol.PENDING),
            "--attnbench-share", "--attnbench-worker", slot.name, "--attnbench-parent-pid", str(os.getpid()),
            "--benchmark-json", str(run_dir / f"pytest-benchmark-{slot.name}-{attempt}.json"),
        ]
        if not manifest.get("check", True):
            command.append("--attnbench-no-check")
        if self.config.memory_limit is not None:
            command += ["--attnbench-memory-limit", str(self.config.memory_limit)]
        env = {**os.environ, **slot.env, **self.config.worker_env}
        log = open(log_path, "a")
        log.write(f"\n=== attempt {attempt}: {' '.join(command)}\n")
        log.flush()
        parent = os.getpid()
        # A session of its own, so that a kill reaches the worker's children too; and a parent-death
        # signal, so that a worker never outlives a supervisor killed with SIGKILL.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=SUITES_DIR.parent,
                                   start_new_session=True, preexec_fn=lambda: protocol.die_with_parent(parent))
        return _Worker(slot, process, current, log_path, log, attempt)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class _Slot:
    name: str
    env: dict[str, str]


class _Worker:
    """One pytest worker process and what it is doing."""

    def __init__(self, slot: _Slot, process: subprocess.Popen, current: Path, log_path: Path, log: TextIO, attempt: int) -> None:
        self.slot, self.process, self.current, self.log_path, self._log, self.attempt = slot, process, current, log_path, log, attempt
        self._pair = ""
        self._pair_since = time.monotonic()
        self.returncode: int | None = None

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
            return f"killed by signal {_signal_name(-rc)}"
        return f"exit code {rc}"

    def failure(self, outcome: str, timeout_s: float) -> tuple[str, str]:
        """The status and reason for the pair that was running when the worker ended."""
        if outcome == "timeout":
            return "timeout", f"killed after running past the {_fmt_s(timeout_s)} time limit (--timeout)"
        rc = self.returncode
        if rc is not None and rc < 0:
            return "crashed", f"worker killed by signal {_signal_name(-rc)} while running this pair (log: {self.log_path.name})"
        return "crashed", f"worker exited with code {rc} while running this pair (log: {self.log_path.name})"

    def kill(self) -> None:
        """Kill the worker's whole process group."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:g} s"


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "".join(f"  {line}\n" for line in text[-lines:])


def pair_key_of(record: dict[str, Any]) -> str:
    """The pair key of a record."""
    return f"{record['case_id']}-{record['backend']}"


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _drop_partial_line(path: Path) -> None:
    """Cut a truncated last line (a kill mid-write) so that appends start on a fresh line."""
    raw = path.read_bytes()
    cut = raw.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())


class _Progress:
    """A one-line progress bar with ETA, drawn only on a terminal."""

    def __init__(self, total: int, already: int, stream: TextIO | None) -> None:
        self.total, self.already, self.stream = total, already, stream
        self.started = time.monotonic()
        self.last = -1

    def update(self, done: int, final: bool = False) -> None:
        """Redraw when the count changes."""
        if self.stream is None or (done == self.last and not final):
            return
        self.last = done
        elapsed = time.monotonic() - self.started
        new = done - self.already
        rate = new / elapsed if elapsed > 0 and new > 0 else 0
        eta = (self.total - done) / rate if rate else None
        width = 30
        filled = int(width * done / max(1, self.total))
        eta_text = f"ETA {int(eta // 60)}:{int(eta % 60):02d}" if eta is not None else "ETA --:--"
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {eta_text} ")
        if final:
            self.stream.write("\n")
        self.stream.flush()
