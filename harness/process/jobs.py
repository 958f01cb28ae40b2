"""The jobs of `python -m harness.child JOB [args]`: each a function of its own argv that returns an exit code."""

from __future__ import annotations

import argparse
import importlib
from typing import Callable, Sequence

from harness.process.usage import UsageParser

#: Job name → (module, function). Named, not imported: a child imports only its own job's module,
#: and process/children.py can check a job's name without importing the commands that start children.
JOBS: dict[str, tuple[str, str]] = {
    "gpu-check": ("harness.checks.gpu", "backend_job"),              # one backend's check cases, for `attnbench gpu-check`
    "profile-ncu": ("harness.run.profile_pair", "ncu_job"),         # one pair's steps under Nsight Compute, for `profile --ncu`
    "stability": ("harness.checks.stability", "measurement_job"),   # one fresh measurement, for `attnbench stability`
    "peaks": ("harness.telemetry.peaks", "main"),                   # the CUDA ceilings into peaks.json, for the run folder
    "load-backends": ("harness.run.plugin_probe", "load_backends_job"),  # the registry as a worker loads it, before `attnbench run`
    "worker": ("harness.run.worker", "worker_job"),                 # the worker loop (claim → execute → append), for `attnbench run`
    "template": ("harness.process.template_process", "template_job"),     # imports the worker's modules, then forks CPU workers
}


def job_function(job: str) -> Callable[[Sequence[str]], int]:
    """The function that runs `job`; KeyError for a name that is not in JOBS."""
    module, name = JOBS[job]
    return getattr(importlib.import_module(module), name)


def run_job(argv: Sequence[str]) -> int:
    """Run the job named by argv[0] with the rest of argv, as `python -m harness.child` does: its exit status, 2 with one
    line on a usage error (a forked worker runs its job through here too, harness.process.forkserver)."""
    from harness.errors import UserError
    from harness.process.usage import exit_status

    argv = list(argv)

    def job() -> int:
        if not argv or argv[0] not in JOBS:
            named = f"unknown job {argv[0]!r}" if argv else "no job named"
            raise UserError(f"{named}: python -m harness.child JOB [args], JOB one of {', '.join(JOBS)}")
        return job_function(argv[0])(argv[1:])

    return exit_status(job, prog="attnbench child")


def job_parser(job: str, description: str) -> argparse.ArgumentParser:
    """The argument parser of one job: its usage errors are one line and exit 2, like the `attnbench` command's."""
    return UsageParser(prog=f"python -m harness.child {job}", description=description)
