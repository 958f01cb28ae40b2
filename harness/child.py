"""`python -m harness.child JOB [args]`: the one entry point of every child process the harness starts.

A job is a function of its own argv that returns an exit code (the table is harness/process/jobs.py);
the parent builds the command with `harness.process.children.child_command(job, *args)`. A usage
error (an unknown job, a bad option) prints one line and exits 2, as the `attnbench` command does;
anything else a job raises is a bug, and its traceback is what the parent shows as the child's tail.
"""

from __future__ import annotations

import sys
from typing import Sequence

from harness.errors import UserError
from harness.process.jobs import JOBS, job_function
from harness.process.usage import exit_status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job named by argv[0] with the rest of argv; exit 2 with one line on a usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def run_job() -> int:
        if not argv or argv[0] not in JOBS:
            named = f"unknown job {argv[0]!r}" if argv else "no job named"
            raise UserError(f"{named}: python -m harness.child JOB [args], JOB one of {', '.join(JOBS)}")
        return job_function(argv[0])(argv[1:])

    return exit_status(run_job, prog="attnbench child")


if __name__ == "__main__":
    sys.exit(main())
