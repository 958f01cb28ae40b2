"""The run folder: its manifest, its lock, what has been recorded, and the environment and peaks written beside the rows.

A folder is a run's when its `manifest.json` reads as an attnbench manifest (typed: `Manifest`, with
`harness: "attnbench"` and a random `run_uuid` since they were added) whose run id is the folder's
name. `--force` replaces only such a folder, and only when everything in it is a file a run writes
(`RUN_FILES`): another tool's folder that happens to hold a `manifest.json` is never deleted, nor a
folder holding the suite file the new run reads. A run folder's files are written in place and never
through a symbolic link (`store.write_file`), so a link planted in a folder cannot redirect a write.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from harness.env import fingerprint
from harness.telemetry.nvml import gpu_telemetry
from harness.errors import UserError
from harness.telemetry import peaks as device_peaks
from harness.telemetry.peaks_reuse import reused_peaks
from harness.measure.timing import Budget
from harness.results.documents import ENV, HARNESS, MANIFEST, PEAKS, Environment, Manifest, read_document
from harness.backends.matrix import MATRIX_FILE
from harness.results.record import Record
from harness.results.store import RECORDS, RECORDS_CSV, ReadResult, link_refusal, read_records, write_file
from harness.run import manifest_pairs, protocol
from harness.process.children import child_command, run_child
from harness.run.progress import RecordsTail
from harness.suite import batch_files
from harness.suite.cases import Case

SUITE_COPY = "suite.toml"
#: Every name a run writes in its folder (patterns for the per-worker files); `--force` deletes nothing else.
RUN_FILES = (MANIFEST, SUITE_COPY, RECORDS, RECORDS_CSV, ENV, PEAKS, MATRIX_FILE, protocol.PENDING, protocol.REMEASURE, protocol.CLAIMS, "traces", batch_files.FROZEN,
             protocol.SUPERVISOR_LOCK, protocol.WORKERS_LOCK, f"worker-*{protocol.CURRENT_SUFFIX}", "worker-*.log",
             "pytest-benchmark-*.json", f".{MANIFEST}.*.tmp", f".{ENV}.*.tmp", f".{MATRIX_FILE}.*.tmp")
#: The files a run writes again on resume: none may be a symbolic link.
_REWRITTEN = (MANIFEST, RECORDS, RECORDS_CSV, ENV, PEAKS, protocol.PENDING, protocol.REMEASURE, protocol.CLAIMS, "traces",
              protocol.SUPERVISOR_LOCK, protocol.WORKERS_LOCK)
#: How long a new supervisor waits for orphaned workers of a killed one to die (they get SIGKILL at once on Linux).
ORPHAN_WAIT_S = 5.0


def new_run_id(suite_name: str) -> str:
    """A sortable, unique-enough run id: UTC time, suite name and process id."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{suite_name}-{os.getpid()}"


@dataclass
class RunFolder:
    """One run folder and its manifest (typed), locked for one supervisor while it is open."""

    path: Path
    document: Manifest
    _lock: protocol.FolderLock | None = None
    _pairs: dict[str, tuple[Case, str]] | None = field(default=None, repr=False)
    _tail: RecordsTail | None = field(default=None, repr=False)

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as its JSON object (what the workers' command line and `repro` are built from)."""
        return self.document.to_dict()

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, manifest: dict[str, Any], *, force: bool, suite_file: str | None,
               pairs: dict[str, tuple[Case, str]] | None = None) -> "RunFolder":
        """Make a new run folder (replacing an earlier run's folder only with `force`) and write its manifest.

        `pairs`: the run's pairs as the caller built them (the manifest's `pair_specs` in its order), kept so that
        the process that made the folder uses its own Cases instead of rebuilding them from the manifest it just wrote."""
        path = Path(path)
        if path.is_symlink():
            raise UserError(f"run folder {path} is a symbolic link: a new run is written only into a folder of its own")
        if path.exists() and not path.is_dir():
            raise UserError(f"run folder {path} exists and is not a folder")
        if path.exists() and any(path.iterdir()):
            if not force:
                raise UserError(f"run folder {path} already exists: pass --force to overwrite it or --resume {path} to finish it")
            _check_replaceable(path, suite_file)
            old = cls(path, Manifest())
            old.lock()  # never delete a folder that live workers still write to
            _remove_run_files(path)
            old.unlock()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create run folder {path}: {exc.strerror or exc}") from None
        manifest = {**manifest, "harness": HARNESS, "run_uuid": uuid.uuid4().hex}
        if suite_file is not None:
            manifest["suite_copy"] = SUITE_COPY
        cases = [case for case, _ in (pairs or {}).values()]
        frozen = _lengths_to_freeze(manifest.get("suite_arg"), suite_file, cases) if pairs is not None else None
        if frozen:
            manifest["batches"] = [entry for entry, _ in frozen]
        folder = cls(path, Manifest.from_dict(manifest, where=path / MANIFEST), _pairs=pairs)
        folder.lock()
        if suite_file is not None:
            # A copy of the suite file as it was, for `repro` and for a reader; the pairs themselves are in the manifest.
            write_file(path / SUITE_COPY, Path(suite_file).read_bytes())
        if frozen:
            # The lengths files as the cases were drawn from them: a file edited or deleted later changes no rebuilt case.
            (path / batch_files.FROZEN).mkdir(exist_ok=True)
            for entry, raw in frozen:
                write_file(path / batch_files.FROZEN / entry["copy"], raw)
            # A file changed between the suite's reading and this copy would leave copies the cases were not drawn from.
            batch_files.check_cases(path, manifest["batches"], cases, str(path / MANIFEST))
        folder.write_manifest()
        return folder

    @classmethod
    def open(cls, path: Path) -> "RunFolder":
        """An existing run folder, to resume (not yet locked)."""
        path = Path(path)
        manifest_path = path / MANIFEST
        if not os.path.lexists(manifest_path):
            raise UserError(f"cannot resume {path}: no {MANIFEST} there (is it a run folder?)")
        manifest = read_run_manifest(path, "cannot resume")
        for name in _REWRITTEN:
            if (path / name).is_symlink():
                raise UserError(link_refusal(path / name))
        if os.path.lexists(path / ENV):  # read again at the end: a damaged one is named now, not after the last pair
            try:
                read_document(path / ENV, Environment)
            except UserError as exc:
                raise UserError(f"cannot resume {path}: {exc}") from None
        folder = cls(path, manifest)
        # What the workers read: a damaged pair or budget (or an older folder's changed suite) is named now, before any starts.
        folder.pairs()
        folder.budget
        return folder

    @classmethod
    def read(cls, path: Path) -> "RunFolder | None":
        """The run folder at `path` as a worker sees it (not locked, nothing checked beyond its manifest), or None without one."""
        path = Path(path)
        if not os.path.lexists(path / MANIFEST):
            return None
        return cls(path, read_run_manifest(path, "cannot run pairs of"))

    def write_manifest(self) -> None:
        """Write the manifest (atomically: a kill never leaves half a manifest)."""
        protocol.atomic_write(self.path / MANIFEST, json.dumps(self.manifest, indent=1))

    # -- locking ----------------------------------------------------------------------------------
    def lock(self) -> None:
        """Lock the folder for this supervisor, refusing while another supervisor or any worker still uses it."""
        lock = protocol.FolderLock(self.path / protocol.SUPERVISOR_LOCK)
        if not lock.try_exclusive():
            raise UserError(f"run folder {self.path} is in use by another attnbench run: wait for it to end or stop it first")
        workers = protocol.FolderLock(self.path / protocol.WORKERS_LOCK)
        # Orphaned workers of a killed supervisor die with it (parent-death signal), but not at once.
        if not workers.try_exclusive(wait_s=ORPHAN_WAIT_S):
            lock.release()
            raise UserError(f"run folder {self.path} still has live workers of an earlier attempt "
                            f"(they hold {self.path / protocol.WORKERS_LOCK}): stop them, then resume")
        workers.release()
        self._lock = lock

    def unlock(self) -> None:
        """Give the folder up."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- what the run is and what it has -----------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run's id (its folder's name when it was created)."""
        return self.document.run_id

    @property
    def device(self) -> str:
        """`cpu` or `cuda`."""
        return str(self.document.device)

    @property
    def suite_arg(self) -> str:
        """The suite as `repro` names it: the frozen copy of a TOML suite, else the suite's name."""
        copy = self.document.suite_copy
        return str(self.path / copy) if copy else str(self.document.suite_arg)

    @property
    def broken(self) -> dict[str, str]:
        """Backends whose plugin failed to load, with the error."""
        return self.document.broken

    def pairs(self) -> dict[str, tuple[Case, str]]:
        """Every pair of the run by key, in run order: from the manifest alone (a folder made before it held them: from its suite)."""
        if self._pairs is None:
            self._pairs = manifest_pairs.run_pairs(self.document, self.path, self.suite_arg)
        return self._pairs

    @property
    def budget(self) -> Budget:
        """The budget the run's pairs are measured under: the manifest's (a folder made before it held one: its suite's)."""
        return manifest_pairs.run_budget(self.document, self.path, self.suite_arg)

    def recorded(self, repair: bool = False) -> list[Record]:
        """The records so far (one per pair: a re-measure in place of its first row), the file read once; with `repair`
        (only while no worker runs) a truncated last line is cut off it."""
        return self.read_rows(repair).typed()

    def read_rows(self, repair: bool = False) -> ReadResult:
        """The records file as read (`recorded`'s rows, and the ones a re-measure superseded); empty before the first row."""
        path = self.path / RECORDS
        if not path.exists():
            return ReadResult([], False, path)
        result = read_records(path)
        if repair and result.dropped_partial_line:
            truncate_to(path, result.whole_bytes)
        return result

    def count_lines(self) -> int:
        """Whole lines in records.jsonl now, read from where the last look stopped."""
        return self._records_tail().count()

    def last_recorded_key(self) -> str | None:
        """The pair of the last whole line `count_lines` saw (what a progress line names), or None."""
        return self._records_tail().last_key()

    def recorded_keys(self) -> set[str]:
        """The pairs records.jsonl holds a row of now, read from where the last look stopped (never the whole file again)."""
        return self._records_tail().recorded_keys()

    def _records_tail(self) -> RecordsTail:
        if self._tail is None:
            self._tail = RecordsTail(self.path / RECORDS)
        return self._tail

    def add_attempt(self, started_utc: str, wall_s: float) -> None:
        """Note in the manifest one finished attempt (a run, or a resume) and its wall seconds, peaks and set-up included."""
        attempts = [*self.document.attempts, {"started_utc": started_utc, "wall_s": wall_s}]
        self.document = dataclasses.replace(self.document, attempts=attempts, given=self.document.given | {"attempts"})
        self.write_manifest()

    def clear_worker_files(self) -> None:
        """After the last pair: remove the claims, the pending list and the workers' `.current` files (the lock files stay).

        The two lock files stay on purpose: deleting a file another attnbench may be opening to lock
        would let two processes each lock a different file of the same name.
        """
        shutil.rmtree(self.path / protocol.CLAIMS, ignore_errors=True)
        (self.path / protocol.PENDING).unlink(missing_ok=True)
        (self.path / protocol.REMEASURE).unlink(missing_ok=True)
        for current in self.path.glob(f"worker-*{protocol.CURRENT_SUFFIX}"):
            current.unlink(missing_ok=True)

    # -- beside the rows ---------------------------------------------------------------------------
    def write_env_before(self) -> None:
        """The environment's fingerprint and, on a GPU, its clocks and temperatures before any pair."""
        write_env(self.path, {"before": fingerprint(self.device), "telemetry_before": gpu_telemetry() if self.device == "cuda" else None})

    def write_capabilities(self, registry: Any, names: Sequence[str]) -> None:
        """capabilities.txt: what the run's backends serve of each feature, per dtype, as this harness declares it (harness.backends.matrix)."""
        from harness.backends.matrix import capability_matrix, render

        text = render(capability_matrix(registry, names=names, availability=False), availability=False)
        protocol.atomic_write(self.path / MATRIX_FILE, text)

    def write_env_after(self) -> None:
        """The GPU's clocks and temperatures after the last pair, beside those from before."""
        env_path = self.path / ENV
        env = read_document(env_path, Environment).to_dict() if os.path.lexists(env_path) else {}
        write_env(self.path, {**env, "telemetry_after": gpu_telemetry() if self.device == "cuda" else None})

    def write_peaks(self, dtypes: list[str], cases: Sequence[Any] = (), threads: int | None = None, source: Path | None = None) -> Path:
        """Measure the device's ceilings into `peaks.json` (or take `source`'s), before any worker starts so nothing competes with them."""
        return write_peaks(self.path, self.device, dtypes, cases, threads, source)


def write_peaks(run_dir: Path, device: str, dtypes: list[str], cases: Sequence[Any] = (), threads: int | None = None,
                source: Path | None = None) -> Path:
    """Measure the device's matmul and copy ceilings into `run_dir/peaks.json`; a failed measurement leaves a file saying why.

    `source`: an earlier peaks.json to take instead where it matches this machine and run (harness.telemetry.peaks_reuse);
    where it does not, the ceilings are measured and the file says why the source was not taken.
    CUDA is measured in a child process so that the supervisor never holds a CUDA context (and
    its memory) while the workers run; the CPU measurement is short and runs in process.
    """
    path = Path(run_dir) / PEAKS
    refused = None
    if source is not None:
        reused, refused = reused_peaks(source, device, dtypes, threads)
        if reused is not None:
            write_file(path, json.dumps(reused, indent=1))
            return path
    if device != "cuda":
        measured = device_peaks.measure_peaks(device, dtypes, cases, threads)
    else:
        done = run_child(child_command("peaks", "--device", "cuda", "--dtypes", ",".join(dtypes), "--out", str(path)), timeout_s=600)
        if done.returncode != 0 or not path.exists():
            measured = {"device": "cuda", "matmul": {}, "copy": None, "errors": {"measure": f"peak measurement failed ({done.describe()})"}}
        else:
            measured = json.loads(path.read_text())
    if refused is not None:
        measured["reuse_refused"] = refused
    write_file(path, json.dumps(measured, indent=1))
    return path


def write_env(run_dir: Path, env: dict[str, Any]) -> None:
    """Write a run folder's env.json: the one writer, typed first and replaced atomically (a kill never leaves half of it)."""
    path = Path(run_dir) / ENV
    data = Environment.from_dict(json.loads(json.dumps(env, default=str)), where=path).to_dict()
    protocol.atomic_write(path, json.dumps(data, indent=1, default=str))


def truncate_to(path: Path, size: int) -> None:
    """Cut the records file to its first `size` bytes (its whole lines), so that appends start on a fresh line."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_run_manifest(path: Path, doing: str) -> Manifest:
    """The manifest of the run folder `path`, typed, and refused unless it is a run's ("{doing} {path}: why")."""
    try:
        manifest = read_document(path / MANIFEST, Manifest)
    except UserError as exc:  # named by its file name: the folder is already in the line
        raise UserError(f"{doing} {path}: {str(exc).replace(str(path / MANIFEST), MANIFEST, 1)}") from None
    problem = manifest.run_problem()
    if problem:
        raise UserError(f"{doing} {path}: its {MANIFEST} is not an attnbench run's ({problem})")
    return manifest


def _check_replaceable(path: Path, suite_file: str | None) -> None:
    """Refuse (UserError) to let --force replace `path` unless a run of the same id wrote it and nothing else is in it."""
    doing = "--force refuses to delete"
    if not os.path.lexists(path / MANIFEST):
        raise UserError(f"{doing} {path}: it holds no {MANIFEST}, so no run wrote it")
    manifest = read_run_manifest(path, doing)
    if manifest.run_id != path.name:
        raise UserError(f"{doing} {path}: its {MANIFEST} is run {manifest.run_id!r}'s, not the folder's own ({path.name!r})")
    foreign = sorted(entry.name for entry in path.iterdir() if not _is_run_file(entry.name))
    if foreign:
        raise UserError(f"{doing} {path}: {foreign[0]!r}{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''} "
                        "is not a file a run writes; move it out first")
    for lock in (path / protocol.SUPERVISOR_LOCK, path / protocol.WORKERS_LOCK):  # opened to lock it before anything is deleted
        if lock.is_symlink():
            raise UserError(link_refusal(lock))
    if suite_file is not None and Path(suite_file).resolve().is_relative_to(path.resolve()):
        raise UserError(f"{doing} {path}: the suite file {suite_file} is inside it; copy the suite elsewhere and pass that copy")


def _is_run_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_FILES)


def _remove_run_files(path: Path) -> None:
    """Delete what a run wrote in `path` (checked by `_check_replaceable`), links as links; the lock files stay (see README)."""
    for entry in path.iterdir():
        if entry.name in (protocol.SUPERVISOR_LOCK, protocol.WORKERS_LOCK):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _lengths_to_freeze(suite_arg: str | None, suite_file: str | None, cases: list[Case]) -> list[tuple[batch_files.Entry, bytes]] | None:
    """What a new run freezes of the lengths files its cases were drawn from (entry, bytes): from the suite file's lengths
    folder, or from the run folder whose pairs it runs (a repro); None when neither says where they are."""
    source = Path(suite_arg or "")
    if suite_file is not None:
        return batch_files.freeze(cases, batch_files.suite_sources(batch_files.lengths_folder(Path(suite_file))))
    if not (suite_arg and source.is_dir() and (source / MANIFEST).is_file()):
        return None
    entries = read_document(source / MANIFEST, Manifest).batches
    # A run made before lengths files were frozen has none to pass on; its cases still carry their lengths.
    return None if entries is None else batch_files.freeze(cases, batch_files.run_sources(source, entries, str(source / MANIFEST)))
