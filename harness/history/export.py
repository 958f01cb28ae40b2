"""A run folder exported in another tool's format: pytest-benchmark's JSON, or flashinfer-bench's trace JSONL.

The run is read with `harness.history.ingest.read_run` (every check a run's readers make); each `ok` row with raw samples
becomes one benchmark (or trace), and every other row is left out and counted, never dropped silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.history.export_rows import Export, left_out, pair_name, refuse_empty, run_records

FORMATS = ("pytest-benchmark", "flashinfer-bench")
#: The project name pytest-benchmark's commit_info carries (its `get_project_name` is the checkout's folder name).
PROJECT = "attnbench"


def has_samples(record: dict[str, Any]) -> bool:
    """An ok row carrying its raw per-call samples: the only kind of row a benchmark can be computed from."""
    return record.get("status") == "ok" and bool(record.get("sample_ms"))


def case_params(record: dict[str, Any]) -> dict[str, Any]:
    """The row's backend and its case's fields, as the benchmark's params."""
    from harness.suite.cases import CASE_FIELDS

    return {"backend": record["backend"], **{name: record.get(name) for name in CASE_FIELDS if name in record}}


def machine_info(env: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """pytest-benchmark's machine_info keys, filled from the run's env.json where it says them, else null; attnbench's own after."""
    before = env.get("before") or {}
    platform = before.get("platform") or ""
    system = platform.split("-", 1)[0] or None
    return {
        "node": before.get("host"), "processor": before.get("cpu_model"), "machine": None, "python_compiler": None,
        "python_implementation": None, "python_implementation_version": before.get("python"),
        "python_version": before.get("python"), "python_build": None, "release": None, "system": system,
        # pytest-benchmark's `cpu` is py-cpuinfo's dict: brand_raw and count are the keys env.json can fill.
        "cpu": {"brand_raw": before.get("cpu_model"), "count": before.get("cpu_count")},
        "platform": platform or None, "torch": before.get("torch"), "torch_cuda": before.get("torch_cuda"),
        "cudnn": before.get("cudnn"), "device_type": run.get("device_type"), "device_name": before.get("device_name"),
        "device_capability": before.get("device_capability"), "device_model": run.get("device_model"),
        "libraries": json.loads(run.get("libraries_json") or "{}"),
    }


def commit_info(run: dict[str, Any]) -> dict[str, Any]:
    """pytest-benchmark's commit_info keys from the harness commit the run recorded; null where attnbench does not know."""
    return {"id": run.get("harness_commit") or "unknown", "time": None, "author_time": None,
            "dirty": run.get("harness_dirty"), "project": PROJECT, "branch": None,
            "harness_version": run.get("harness_version")}


def benchmark(record: dict[str, Any], suite: str) -> dict[str, Any]:
    """One ok row as a pytest-benchmark benchmark: its stats computed by pytest-benchmark's own `Stats` from the raw samples."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for sample in record["sample_ms"]:
        stats.update(sample / 1e3)  # pytest-benchmark's durations are seconds per iteration; sample_ms is ms per call
    name = pair_name(record)
    extra = ("agree", "tflops", "gbps", "contended", "suspect", "latency_ms_median")
    return {
        "group": record["case_id"], "name": name, "fullname": f"{suite}::{name}", "params": case_params(record),
        "param": record["backend"], "extra_info": {key: record.get(key) for key in extra},
        "options": {"timer": record.get("timer"), "warmup": record.get("warmup_s"), "stopped_by": record.get("stopped_by")},
        "stats": {**stats.as_dict(), "data": list(stats.data), "iterations": record.get("iterations") or 1},
    }


def pytest_benchmark_export(run_dir: Path | str) -> Export:
    """The run as the JSON pytest-benchmark's --benchmark-json writes (what `pytest-benchmark compare` reads)."""
    import pytest_benchmark

    run, manifest, env, records, warnings = run_records(run_dir)
    suite = run.get("suite") or "attnbench"
    benchmarks = [benchmark(r, suite) for r in records if has_samples(r)]
    skipped = [left_out(r, None if r.get("status") != "ok" else "no raw samples recorded") for r in records if not has_samples(r)]
    refuse_empty(run_dir, benchmarks)
    document = {"machine_info": machine_info(env, run), "commit_info": commit_info(run), "benchmarks": benchmarks,
                "datetime": run.get("created_utc"), "version": pytest_benchmark.__version__,
                # Not pytest-benchmark's: readers ignore it, and the rows left out stay on record beside the ones kept.
                "attnbench_run": {"run_id": run.get("run_id"), "run_uuid": run.get("run_uuid"), "suite": suite},
                "attnbench_skipped": skipped}
    return Export(json.dumps(document, indent=1, default=str) + "\n", len(benchmarks), skipped, warnings)


def build_export(run_dir: Path | str, fmt: str) -> Export:
    """The export of a run in format `fmt` (one of FORMATS)."""
    if fmt == "pytest-benchmark":
        return pytest_benchmark_export(run_dir)
    if fmt == "flashinfer-bench":
        from harness.history.export_flashinfer import flashinfer_export

        return flashinfer_export(run_dir)
    raise UserError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")


def check_export_out(out: Path, force: bool) -> Path:
    """Refuse (UserError) an --out inside a run folder, not a plain file, or an existing file without --force; return it resolved."""
    from harness.results.outputs import check_output_file

    return check_output_file(out, "an export", "export", force=force)


def export_run(run_dir: Path | str, fmt: str, out: Path | str, force: bool = False) -> Export:
    """Export a run into `out` (refused in a run folder, or over a file without `force`) and say what went in."""
    from harness.results.store import write_file

    target = check_export_out(Path(out), force)  # before the reading: a run of thousands of rows is not read for nothing
    result = build_export(run_dir, fmt)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, result.text)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    return result


__all__ = ["FORMATS", "Export", "build_export", "export_run", "pytest_benchmark_export"]
