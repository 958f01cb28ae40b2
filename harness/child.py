"""`python -m harness.child JOB [args]`: the one entry point of every child process the harness starts.

A job is a function of its own argv that returns an exit code; the parent builds the command with
`harness.run.children.child_command(job, *args)`. A usage error (an unknown job, a bad option)
prints one line and exits 2, as the `attnbench` command does; anything else a job raises is a
bug, and its traceback is what the parent shows as the child's tail.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

#: Job name → (module, function). Named, not imported: a child imports only its own job's module,
#: and run/children.py can check a job's name without importing the commands that start children.
JOBS: dict[str, tuple[str, str]] = {
    "gpu-check": ("harness.cli.gpu_check", "backend_job"),      # one backend's check cases, for `attnbench gpu-check`
    "profile-ncu": ("harness.cli.profile", "ncu_job"),          # one pair's steps under Nsight Compute, for `profile --ncu`
    "stability": ("harness.cli.stability", "measurement_job"),  # one fresh measurement, for `attnbench stability`
    "peaks": ("harness.telemetry.peaks", "main"),                 # the CUDA ceilings into peaks.json, for the run folder
    "worker": ("harness.run.worker", "worker_job"),             # the worker loop (claim → execute → append), for `attnbench run`
}


def job_function(job: str) -> Callable[[Sequence[str]], int]:
    """The function that runs `job`; KeyError for a name that is not in JOBS."""
    module, name = JOBS[job]
    return getattr(importlib.import_module(module), name)


def job_parser(job: str, description: str) -> argparse.ArgumentParser:
    """The argument parser of one job: its usage errors are one line and exit 2, like the `attnbench` command's."""
    from harness.cli.arguments import UsageParser

    return UsageParser(prog=f"python -m harness.child {job}", description=description)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job named by argv[0] with the rest of argv; exit 2 with one line on a usage error."""
    from harness.cli.main import exit_status
    from harness.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)

    def run_job() -> int:
        if not argv or argv[0] not in JOBS:
            named = f"unknown job {argv[0]!r}" if argv else "no job named"
            raise UserError(f"{named}: python -m harness.child JOB [args], JOB one of {', '.join(JOBS)}")
        return job_function(argv[0])(argv[1:])

    return exit_status(run_job, prog="attnbench child")


if __name__ == "__main__":
    sys.exit(main())
