"""The environment fingerprint of a run: versions, device, CPU, and GPU clocks/thermals before and after."""

from __future__ import annotations

import functools
import os
import platform
import re
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


# The oldest torch attnbench is tested with (the H200 box runs 2.11, CI 2.13); pyproject.toml says the same.
OLDEST_TORCH = (2, 11)
_NEEDS = f"attnbench needs torch >= {'.'.join(map(str, OLDEST_TORCH))}"


def torch_version_problem(version: str) -> str | None:
    """Why a torch of this version string cannot run attnbench (older than OLDEST_TORCH, or unreadable), or None."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return f"cannot read the installed torch's version {version!r}; {_NEEDS}"
    if (int(match[1]), int(match[2])) < OLDEST_TORCH:
        return f"torch {version} is installed; {_NEEDS}"
    return None


def require_supported_torch() -> None:
    """Raise a UserError naming the installed and the required torch when torch is missing or too old."""
    from harness.errors import UserError

    try:
        import torch
    except ImportError as exc:
        raise UserError(f"torch does not import ({exc}); {_NEEDS}") from None
    problem = torch_version_problem(str(torch.__version__))
    if problem is not None:
        raise UserError(problem)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The checkout attnbench runs from: its git commit is what measured a run.
HARNESS_ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def harness_identity(root: Path = HARNESS_ROOT) -> dict[str, Any]:
    """What measured a run: attnbench's version, and the git commit of `root` with whether its tracked files differ from it.

    Commit and dirty are None, never an error, when `root` is not a git checkout's top (an installed
    copy, an unpacked archive) or git is missing or fails. Untracked files do not make a tree dirty:
    a stray results file is not a change to the code that measured.
    """
    from harness import __version__

    commit = _git(root, "rev-parse", "--verify", "HEAD")
    toplevel = _git(root, "rev-parse", "--show-toplevel")
    if commit is None or toplevel is None or Path(toplevel).resolve() != Path(root).resolve():
        return {"harness_version": __version__, "harness_commit": None, "harness_dirty": None}
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"harness_version": __version__, "harness_commit": commit, "harness_dirty": None if status is None else bool(status)}


def _git(root: Path, *args: str) -> str | None:
    """git's stripped output in `root`, or None when git is missing, fails or takes too long."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # a status must never take the index lock
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


#: /proc/cpuinfo flags of an instruction set that computes in bf16 (x86 AVX-512 BF16, AMX; Arm's BF16 extension).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags (x86 `flags`, Arm `Features`) from `path`; None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return None


def cpu_capability(flags: set[str] | None = None) -> dict[str, Any]:
    """The instruction set torch's CPU kernels use (`torch.backends.cpu.get_cpu_capability()`: DEFAULT, AVX2, AVX512...) and whether bf16 is native.

    Without native bf16 (an AVX2-only CPU) torch's bf16 matmul takes a one-thread fallback GEMM,
    8-60x slower than fp32 as the operands' layout goes: the report says so beside such rows. `cpu_bf16_native` is
    None when the flags cannot be read.
    """
    import torch

    flags = cpu_flags() if flags is None else flags
    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {
        "cpu_capability": getter() if getter is not None else None,
        "cpu_bf16_native": None if flags is None else any(flag in flags for flag in BF16_CPU_FLAGS),
    }


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


#: The fingerprint's fields, each named once here: `fingerprint` writes them, env.json's reader types them
#: (harness.results.documents), compare judges them (harness.analysis.compare) and the report lists them in this order.
#: Fields whose difference makes two runs measure different things (compare refuses without --force).
DEVICE_KEYS = ("device_type", "device_name")
#: Fields whose difference is worth a warning (a version upgrade is often the point of comparing).
VERSION_KEYS = ("torch", "torch_cuda", "cudnn", "python", "xformers", "flash_attn", "cpu_model", "torch_threads", "host")
#: What measured a run (`harness_identity`'s fields).
IDENTITY_KEYS = ("harness_version", "harness_commit", "harness_dirty")
#: The fields only a CUDA machine's fingerprint has (torch's device properties).
CUDA_KEYS = ("device_capability", "device_memory_bytes", "device_sm_count", "device_l2_bytes", "device_count")
#: Every field `fingerprint` writes, in the order a reader is shown them.
FINGERPRINT_KEYS = (*IDENTITY_KEYS, "time_utc", "host", "device_type", "device_name", *CUDA_KEYS, "cpu_model", "cpu_count",
                    "torch_threads", "cpu_capability", "cpu_bf16_native", "cuda_available", "python", "platform", "torch",
                    "torch_cuda", "cudnn", "numpy", "pandas", "pytest_benchmark", "xformers", "flash_attn")


def fingerprint(device: str = "cpu") -> dict[str, Any]:
    """Versions, device and host facts that decide whether two runs are comparable (FINGERPRINT_KEYS, in that order)."""
    import torch

    info: dict[str, Any] = {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "numpy": _package_version("numpy"),
        "pandas": _package_version("pandas"),
        "pytest_benchmark": _package_version("pytest-benchmark"),
        "xformers": _package_version("xformers"),
        "flash_attn": _package_version("flash-attn") or _package_version("flash_attn"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device_type": device,
        "cuda_available": torch.cuda.is_available(),
        **harness_identity(),
    }
    info.update(cpu_capability())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update({
            "device_name": props.name,
            "device_capability": f"{props.major}.{props.minor}",
            "device_memory_bytes": props.total_memory,
            "device_sm_count": props.multi_processor_count,
            "device_l2_bytes": getattr(props, "L2_cache_size", None),
            "device_count": torch.cuda.device_count(),
        })
    else:
        info["device_name"] = cpu_model()
    # In FINGERPRINT_KEYS' order; a field missing from it is still kept (and tests/test_identity.py names it).
    return {**{key: info[key] for key in FINGERPRINT_KEYS if key in info}, **info}


def detect_device() -> str:
    """`cuda` when torch sees a GPU, else `cpu`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(requested: str | None) -> str:
    """The device a command runs on: the one asked for (cpu or cuda, checked), else cuda when torch sees a GPU."""
    from harness.errors import UserError

    if requested is None:
        return detect_device()
    if requested not in ("cpu", "cuda"):
        raise UserError(f"unknown device {requested!r}: expected cpu or cuda")
    if requested == "cuda" and detect_device() != "cuda":
        raise UserError("--device cuda asked for, but torch sees no CUDA device")
    return requested
