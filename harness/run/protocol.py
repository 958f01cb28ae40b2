"""The files through which a supervisor and its workers share one run folder (the protocol is described in harness.run.supervisor).

Everything here is plain files and POSIX calls, so workers need no channel to the supervisor but
the run folder: the same workers can run under a cluster scheduler on a shared file system.
"""

from __future__ import annotations

import fcntl
import os
import re
import resource
import socket
import time
from pathlib import Path
from urllib.parse import quote

#: Held exclusively by the supervisor for as long as it runs the folder.
SUPERVISOR_LOCK = "supervisor.lock"
#: Held shared by every worker for as long as it lives; a supervisor starts only when it can take it exclusively.
WORKERS_LOCK = "workers.lock"
#: One empty-named file per pair a worker has taken (created with O_EXCL: exactly one worker wins).
CLAIMS = "claims"
#: The pair keys still to run, one per line, in the run's order (the manifest's, harness.run.order; the same file for every worker).
PENDING = "pending.txt"
#: The folder of a run where `--traces` puts one Chrome trace per pair.
TRACES = "traces"
#: The pairs a sweep measures again at its end (harness.run.remeasure), each with its first row's evidence: a JSON
#: object {key: evidence}, which the workers stamp on the new rows as `remeasured_from`; removed when the run ends.
REMEASURE = "remeasure.json"
#: `worker-<name>.current` holds the key of the pair that worker is running, empty between pairs.
CURRENT_SUFFIX = ".current"

#: A worker exits with this code on purpose after a pair that left the process unusable (sticky CUDA error).
EXIT_STICKY = 70
#: A worker exits with harness.process.children.EXIT_ORPHANED (71) when the supervisor that started it has gone.
#: A worker exits with this code when it cannot append a row (disk full, file size limit): nothing after it could be kept.
EXIT_CANNOT_WRITE = 74


def current_path(run_dir: Path, worker: str) -> Path:
    """The file where worker `worker` says which pair it is running."""
    return Path(run_dir) / f"worker-{worker}{CURRENT_SUFFIX}"


def atomic_write(path: Path, text: str) -> None:
    """Replace a small file's content in one step, so a reader never sees it half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def claim_path(run_dir: Path, key: str) -> Path:
    """The claim file of one pair."""
    return Path(run_dir) / CLAIMS / quote(key, safe="")


def try_claim(run_dir: Path, key: str, worker: str) -> bool:
    """Take pair `key` for `worker`; False when another worker already has it."""
    try:
        fd = os.open(claim_path(run_dir, key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"{worker} pid={os.getpid()} host={socket.gethostname()} t={time.time():.3f}\n".encode())
    finally:
        os.close(fd)
    return True


class FolderLock:
    """An advisory `flock` on a file of the run folder; released by the kernel when its holder dies, even by SIGKILL."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def try_exclusive(self, wait_s: float = 0.0) -> bool:
        """Take the lock exclusively, retrying for up to `wait_s` seconds; False if others still hold it."""
        self._open()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)

    def shared(self) -> None:
        """Take the lock shared, waiting while someone holds it exclusively."""
        self._open()
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        """Give the lock up."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from `2GiB`, `512MiB`, `1.5G`, `4096`: binary multiples with or without the `i`."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (expected e.g. 2GiB, 512MiB or a number of bytes)")
    number, unit, _ = match.groups()
    value = int(float(number) * 1024 ** " KMGT".index(unit.upper() or " "))
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def machine_memory_bytes() -> int | None:
    """Physical memory plus swap: more address space than a worker could ever use; None where /proc/meminfo is not there."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2] and line.split()[1].isdigit()}
    except OSError:
        return None
    if "MemTotal" not in fields:
        return None
    return fields["MemTotal"] + fields.get("SwapTotal", 0)


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmSize not in /proc/self/status")


def limit_address_space(headroom_bytes: int) -> int:
    """Cap this process's address space (RLIMIT_AS) at its present size plus `headroom_bytes`; return the cap.

    torch's intra-op thread pool is started first, so its stacks count in the present size rather
    than against the headroom. An allocation past the cap fails with ENOMEM (torch raises its
    "can't allocate memory" error, which the runner records as `oom`).
    """
    import torch

    warm = torch.ones(256, 256)
    for _ in range(3):
        warm = warm @ warm / 256
    del warm
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_size_bytes() + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
