"""Nsight Compute: the command line that runs a pair under `ncu` with a small metric set, and a reader of its CSV.

Never run here (no GPU on the CI machines): `ncu_command` and `parse_ncu_csv` are tested on the
documented CSV format only, and the wgmma metric's name (`sm__pipe_tensor_op_gmma_cycles_active`) has not
been asked of an ncu on a Hopper GPU by this harness yet.
"""

from __future__ import annotations

import csv
import io
import shutil
from dataclasses import dataclass
from typing import Sequence

#: Tensor-pipe utilisation of mma.sync (HMMA), the only tensor instructions before Hopper.
HMMA_TENSOR_METRIC = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
#: Hopper's warpgroup MMA (wgmma, what cuDNN's and FlashAttention 3's kernels issue) has its own pipe, which the HMMA metric misses.
GMMA_TENSOR_METRIC = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
#: The small metric set `--ncu` collects everywhere: SM and DRAM throughput, HMMA tensor-pipe utilisation, achieved occupancy.
NCU_METRICS = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    HMMA_TENSOR_METRIC,
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
#: What `ncu_readings` reports per kernel, in order, and the metrics each reading is taken from.
NCU_READINGS = {
    "SM throughput": (NCU_METRICS[0],),
    "DRAM throughput": (NCU_METRICS[1],),
    "tensor pipes": (HMMA_TENSOR_METRIC, GMMA_TENSOR_METRIC),
    "achieved occupancy": (NCU_METRICS[3],),
}


def ncu_metrics(capability: tuple[int, int] | None) -> tuple[str, ...]:
    """The metric set for a device of compute `capability`: on Hopper (9.x) the wgmma pipe's metric too.

    Asked only where the pipe exists, since ncu refuses a metric the device does not have. Blackwell's
    tcgen05 pipe is not covered (its metric is unverified): there the tensor reading is HMMA's alone.
    """
    if capability is not None and capability[0] == 9:
        return (*NCU_METRICS, GMMA_TENSOR_METRIC)
    return NCU_METRICS


def current_capability() -> tuple[int, int] | None:
    """The compute capability of the current CUDA device, or None without one."""
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def ncu_available() -> str | None:
    """None if Nsight Compute's `ncu` is on PATH, else the one-line reason it cannot run."""
    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not on PATH: no per-kernel hardware metrics"
    return None


def ncu_command(
    argv: Sequence[str],
    metrics: Sequence[str] | None = None,
    *,
    ncu: str = "ncu",
    kernel_regex: str | None = None,
    launch_skip: int = 0,
    launch_count: int | None = None,
    profile_from_start: bool = True,
) -> list[str]:
    """The command line that runs `argv` (a python command) under ncu with `metrics` (default: the current device's set), CSV on stdout.

    ncu replays every kernel once per metric pass, so a whole run is slow: limit it with
    `launch_skip`/`launch_count`, a kernel-name regex, or `profile_from_start=False`, which profiles
    only between `torch.cuda.profiler.start()` and `stop()` in the child.
    """
    if not argv:
        raise ValueError("ncu_command needs the command to profile")
    if metrics is None:
        metrics = ncu_metrics(current_capability())
    cmd = [ncu, "--csv", "--page", "details", "--target-processes", "all", "--metrics", ",".join(metrics)]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    if not profile_from_start:
        cmd += ["--profile-from-start", "off"]
    return cmd + list(argv)


@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel launch from ncu's CSV: its launch id, name, and metric values (None if unreadable)."""

    launch_id: int | None
    kernel: str
    metrics: dict[str, float | None]
    units: dict[str, str]


def _ncu_number(text: str) -> float | None:
    """A metric value as ncu prints it (thousands separators, "n/a"), or None when it is not a number.

    Commas are read as thousands separators, ncu's default; a decimal-comma locale would be misread
    (unverified whether ncu follows the locale: run it with LC_ALL=C).
    """
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Per-launch metric dicts from `ncu --csv` output (the long details page or the wide raw page).

    Lines before the header (ncu's `==PROF==` lines, the program's own output) are skipped. Details
    page: one row per (launch, metric) with "ID", "Kernel Name", "Metric Name", "Metric Unit",
    "Metric Value". Raw page: one row per launch, a column per metric, and a row of units under the
    header.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and '"Kernel Name"' in line), None)
    if start is None:
        return []
    # The program's and ncu's own lines can come after the table too; a CSV row starts with a quote.
    rows = list(csv.reader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"')))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}

    def launch_id(row: list[str]) -> int | None:
        value = row[col["ID"]].strip() if "ID" in col and col["ID"] < len(row) else ""
        return int(value) if value.isdigit() else None

    launches: dict[tuple[int | None, str], NcuKernel] = {}
    if "Metric Name" in col and "Metric Value" in col:
        for row in body:
            if len(row) < len(header):
                continue
            key = (launch_id(row), row[col["Kernel Name"]])
            entry = launches.setdefault(key, NcuKernel(key[0], key[1], {}, {}))
            metric = row[col["Metric Name"]]
            entry.metrics[metric] = _ncu_number(row[col["Metric Value"]])
            if "Metric Unit" in col:
                entry.units[metric] = row[col["Metric Unit"]]
        return list(launches.values())
    metric_cols = [name for name in header if "__" in name]  # ncu metric names are unit__counter.rollup
    units: dict[str, str] = {}
    if body and (not body[0][col["Kernel Name"]].strip()):  # the units row has no kernel name
        units = {name: body[0][col[name]] for name in metric_cols if col[name] < len(body[0])}
        body = body[1:]
    result = []
    for row in body:
        if len(row) < len(header):
            continue
        result.append(NcuKernel(launch_id(row), row[col["Kernel Name"]],
                                {m: _ncu_number(row[col[m]]) for m in metric_cols}, dict(units)))
    return result



def ncu_readings(kernel: NcuKernel) -> dict[str, float | None]:
    """A kernel's readings by name (NCU_READINGS order); the tensor pipes' is the busier of HMMA and wgmma where both were read."""
    readings = {}
    for name, metrics in NCU_READINGS.items():
        values = [kernel.metrics[m] for m in metrics if kernel.metrics.get(m) is not None]
        readings[name] = max(values) if values else None
    return readings
