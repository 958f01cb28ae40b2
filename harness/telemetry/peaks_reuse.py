"""Ceilings measured once and taken by later runs on the same machine: `run --peaks FILE` (or ATTNBENCH_PEAKS).

Measuring a CPU's ceilings costs a few seconds a run (a sweep of products, harness.telemetry.products); a GPU's, a
few more. Runs that share one measurement also share the yardstick of their "% of peak". A measurement is taken only
when it can be this machine's today: the same device, host, CPU or GPU model, torch and (CPU) thread count, every
dtype the run needs measured without error. Otherwise the run measures its own and its peaks.json says why the given
one was not taken (`reuse_refused`); a taken one says where it came from (`reused_from`), so a reader never mistakes a
copy for a measurement of this run, and keeps its `contended` flags, so a ceiling measured beside other work is read
as such (harness.analysis.roofline calls it no bound) in every run that takes it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Sequence

from harness.errors import UserError
from harness.results.documents import PEAKS, Peaks, read_document

#: Where a run takes its ceilings from when `run --peaks` is not given: a peaks.json, or a run folder holding one.
PEAKS_ENV = "ATTNBENCH_PEAKS"


def machine(device: str) -> dict[str, str]:
    """What a measured ceiling belongs to beyond its device kind: this host and its CPU model (and GPU's name on CUDA)."""
    from harness.env import cpu_model

    here = {"host": socket.gethostname(), "cpu": cpu_model()}  # as env.json's fingerprint names them
    if device == "cuda":
        import torch

        here["gpu"] = torch.cuda.get_device_name()
    return here


def peaks_source(flag: str | None) -> Path | None:
    """The peaks.json a new run was pointed at (`--peaks`, else ATTNBENCH_PEAKS), or None; a folder means its peaks.json.

    A path that is neither a file nor a folder holding peaks.json, or a file that is no peaks.json, is refused in one
    line: a mistyped path must not quietly cost the measurement it was meant to save, nor pass for one."""
    text = flag if flag is not None else os.environ.get(PEAKS_ENV) or None
    if text is None:
        return None
    where = "--peaks" if flag is not None else PEAKS_ENV
    path = Path(text)
    if path.is_dir():
        path = path / PEAKS
    if not path.is_file():
        raise UserError(f"{where} {text}: no peaks.json there (give a run folder or its peaks.json)")
    read_document(path, Peaks)  # damaged or foreign: one line now, before a run folder is made
    return path


def _mismatch(stored: dict[str, Any], device: str, dtypes: Sequence[str], threads: int | None) -> str | None:
    """Why the stored ceilings are not this run's to take, or None when they are."""
    import torch

    if stored.get("device") != device:
        return f"measured on {stored.get('device')!r}, this run is on {device!r}"
    if stored.get("torch") != torch.__version__:
        return f"measured under torch {stored.get('torch')}, this run has {torch.__version__}"
    if stored.get("machine") != machine(device):
        return f"measured on {stored.get('machine') or 'an unnamed machine'}, this is {machine(device)}"
    wanted = threads if threads is not None else torch.get_num_threads()
    if device == "cpu" and stored.get("torch_threads") != wanted:
        return f"measured with {stored.get('torch_threads')} threads, this run times with {wanted}"
    if stored.get("errors"):
        return f"its measurement failed in part ({', '.join(sorted(stored['errors']))})"
    missing = [d for d in dtypes if d not in stored.get("matmul", {})]
    if missing:
        return f"it holds no {', '.join(missing)} ceiling"
    if stored.get("reused_from"):
        return "it is itself a copy: give the run folder that measured it"
    return None


def reused_peaks(source: Path, device: str, dtypes: Sequence[str], threads: int | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the ceilings to store, None) when `source` can be taken for this run; (None, why not) when it cannot."""
    stored = read_document(source, Peaks).to_dict()  # a damaged or foreign file is one line naming it, never a half-read ceiling
    why = _mismatch(stored, device, dtypes, threads)
    if why is not None:
        return None, f"{source}: {why}"
    return {**stored, "reused_from": {"path": str(source.resolve()), "measured_utc": stored.get("measured_utc")}}, None
