"""`attnbench run`: the supervisor that runs a suite's pairs in pytest worker processes.

Each worker says which pair it is about to run (a `.current` file) and appends one record per
pair. A worker that dies costs only that pair, recorded `crashed` with its signal or exit code;
a pair that overruns its time limit is killed and recorded `timeout`; the worker is restarted on
what is left. Workers share nothing but the run folder, so the same scheme spreads over GPUs.
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
from typing import Any, Callable, TextIO

from harness.backends.registry import Registry, load_registry
from harness.cases import Case
from harness.env import fingerprint, gpu_telemetry
from harness.errors import UserError
from harness.results import RECORDS, RunWriter, read_records, validate_run_id, write_csv
from harness.runner import Options, base_record
from harness.roofline import write_peaks
from harness.suite import Suite, load_suite, pair_key

MANIFEST = "manifest.json"
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


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


class Supervisor:
    """Runs the pending pairs of one run folder to completion."""

    def __init__(self, config: RunConfig, log: TextIO = sys.stderr) -> None:
        self.config = config
        self.log = log
        self.registry: Registry = load_registry()

    # -- set-up -------------------------------------------------------------------------------
    def _prepare_run_dir(self) -> tuple[Path, dict[str, Any]]:
        config = self.config
        if config.resume is not None:
            run_dir = Path(config.resume)
            manifest_path = run_dir / MANIFEST
            if not manifest_path.exists():
                raise UserError(f"cannot resume {run_dir}: no {MANIFEST} there (is it a run folder?)")
            return run_dir, json.loads(manifest_path.read_text())
        device = config.device or detect_device()
        if device not in ("cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: expected cpu or cuda")
        if device == "cuda" and detect_device() != "cuda":
            raise UserError("--device cuda asked for, but torch sees no CUDA device")
        suite, suite_arg = _resolve_suite(config, device)
        names = config.backends or (list(suite.backends) if suite.backends else self.registry.names())
        for name in names:
            self.registry.get(name)
        keys = [k for k in (pair_key(c, b) for c, b in suite.pairs(names)) if all(o in k for o in config.only)]
        if not keys:
            raise UserError(f"--only {','.join(config.only)} matches no pair of suite {suite.name!r}" if config.only else f"suite {suite.name!r} has no pairs")
        run_id = validate_run_id(config.run_id or new_run_id(suite.name))
        run_dir = Path(config.out) / run_id
        if run_dir.exists() and any(run_dir.iterdir()):
            if not config.force:
                raise UserError(f"run folder {run_dir} already exists: pass --force to overwrite it or --resume {run_dir} to finish it")
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        manifest = {
            "run_id": run_id, "suite": suite.name, "suite_arg": suite_arg, "device": device, "backends": names,
            "pairs": keys, "check": config.check,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
        env = {"before": fingerprint(device), "telemetry_before": gpu_telemetry() if device == "cuda" else None}
        (run_dir / "env.json").write_text(json.dumps(env, indent=1, default=str))
        # The device's own ceilings, measured before any worker starts so nothing competes with them.
        write_peaks(run_dir, device, sorted({c.dtype for c in suite.cases}))
        return run_dir, manifest

    def _pairs(self, manifest: dict[str, Any]) -> dict[str, tuple[Case, str]]:
        suite = load_suite(manifest["suite_arg"]).on_device(manifest["device"])
        return {pair_key(c, b): (c, b) for c, b in suite.pairs(manifest["backends"])}

    @staticmethod
    def _recorded(run_dir: Path) -> list[dict[str, Any]]:
        if not (run_dir / RECORDS).exists():
            return []
        result = read_records(run_dir / RECORDS)
        if result.dropped_partial_line:
            _drop_partial_line(run_dir / RECORDS)
        return result.records

    # -- running ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Run every pair of the run that has no record yet; return the summary."""
        started = time.monotonic()
        run_dir, manifest = self._prepare_run_dir()
        run_dir = run_dir.resolve()
        pairs = self._pairs(manifest)
        done = {pair_key_of(r) for r in self._recorded(run_dir)}
        pending = [k for k in manifest["pairs"] if k not in done]
        total = len(manifest["pairs"])
        writer = RunWriter(run_dir)
        options = Options(run_id=manifest["run_id"])
        workers = self._worker_slots(manifest["device"])
        shards = [pending[i :: len(workers)] for i in range(len(workers))]
        progress = _Progress(total, len(done), self.log if self.config.progress else None)
        active: dict[str, _Worker] = {}
        for slot, shard in zip(workers, shards):
            if shard:
                active[slot.name] = self._spawn(slot, shard, run_dir, manifest)
        try:
            while active:
                time.sleep(0.2)
                progress.update(_count_lines(run_dir / RECORDS))
                for name, worker in list(active.items()):
                    outcome = worker.poll(self.config.case_timeout_s)
                    if outcome is None:
                        continue
                    del active[name]
                    finished = {pair_key_of(r) for r in self._recorded(run_dir)}
                    failed_key = worker.current_pair()
                    if outcome != "exited" or worker.returncode not in (0, 1, 5):
                        if failed_key and failed_key not in finished:
                            status, reason = worker.failure(outcome)
                            case, backend = pairs[failed_key]
                            writer.append({**base_record(case, self.registry.get(backend), Options(run_id=manifest["run_id"], worker=name)), "status": status, "reason": reason})
                            finished.add(failed_key)
                        elif outcome == "exited":
                            self.log.write(f"\nworker {name} exited with code {worker.returncode}; see {worker.log_path}\n")
                    rest = [k for k in worker.shard if k not in finished]
                    if rest and (failed_key or outcome != "exited"):
                        active[name] = self._spawn(worker.slot, rest, run_dir, manifest, attempt=worker.attempt + 1)
        except KeyboardInterrupt:
            for worker in active.values():
                worker.kill()
            self.log.write(f"\ninterrupted: finished rows are in {run_dir}; finish with: attnbench run --resume {run_dir}\n")
            raise
        progress.update(_count_lines(run_dir / RECORDS), final=True)
        records = self._recorded(run_dir)
        missing = set(manifest["pairs"]) - {pair_key_of(r) for r in records}
        for key in sorted(missing):  # a worker that gave up without a trace still leaves a row
            case, backend = pairs[key]
            writer.append({**base_record(case, self.registry.get(backend), options), "status": "error", "reason": "worker ended without running this pair (see worker logs)"})
        write_csv(run_dir)
        env_path = run_dir / "env.json"
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
        env["telemetry_after"] = gpu_telemetry() if manifest["device"] == "cuda" else None
        env_path.write_text(json.dumps(env, indent=1, default=str))
        counts: dict[str, int] = {}
        for record in self._recorded(run_dir):
            counts[record["status"]] = counts.get(record["status"], 0) + 1
        return RunSummary(run_dir, counts, total, time.monotonic() - started)

    def _worker_slots(self, device: str) -> list["_Slot"]:
        config = self.config
        if device == "cuda" and config.gpus:
            return [_Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": str(g)}) for g in config.gpus]
        n = max(1, config.workers)
        env = {}
        if n > 1 and device == "cpu":
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
        return [_Slot(str(i), env) for i in range(n)]

    def _spawn(self, slot: "_Slot", shard: list[str], run_dir: Path, manifest: dict[str, Any], attempt: int = 0) -> "_Worker":
        pairs_file = run_dir / f"worker-{slot.name}.pairs"
        pairs_file.write_text("\n".join(shard) + "\n")
        current = run_dir / f"worker-{slot.name}.current"
        current.write_text("")
        log_path = run_dir / f"worker-{slot.name}.log"
        command = [
            sys.executable, "-m", "pytest", str(SUITES_DIR / "test_bench.py"),
            "-p", "harness.pytest_plugin", "-p", "no:cacheprovider", "-q", "--no-header",
            "--rootdir", str(SUITES_DIR.parent),
            "--attnbench-suite", manifest["suite_arg"], "--attnbench-device", manifest["device"],
            "--attnbench-backends", ",".join(manifest["backends"]),
            "--attnbench-run-dir", str(run_dir), "--attnbench-pairs", str(pairs_file),
            "--attnbench-worker", slot.name,
            "--benchmark-json", str(run_dir / f"pytest-benchmark-{slot.name}-{attempt}.json"),
        ]
        if not manifest.get("check", True):
            command.append("--attnbench-no-check")
        env = {**os.environ, **slot.env, **self.config.worker_env}
        log = open(log_path, "a")
        log.write(f"\n=== attempt {attempt}: {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=SUITES_DIR.parent, start_new_session=True)
        return _Worker(slot, shard, process, current, log_path, log, attempt)


@dataclass
class _Slot:
    name: str
    env: dict[str, str]


class _Worker:
    """One pytest worker process and what it is doing."""

    def __init__(self, slot: _Slot, shard: list[str], process: subprocess.Popen, current: Path, log_path: Path, log: TextIO, attempt: int) -> None:
        self.slot, self.shard, self.process, self.current, self.log_path, self._log, self.attempt = slot, shard, process, current, log_path, log, attempt
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

    def failure(self, outcome: str) -> tuple[str, str]:
        """The status and reason for the pair that was running when the worker ended."""
        if outcome == "timeout":
            return "timeout", f"killed after running past the {_fmt_s(time.monotonic() - self._pair_since)} time limit"
        rc = self.returncode
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            return "crashed", f"worker killed by signal {name}"
        return "crashed", f"worker exited with code {rc} while running this pair (log: {self.log_path.name})"

    def kill(self) -> None:
        """Kill the worker's whole process group."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s"


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
