"""`python -m harness.child JOB [args]`: the one entry point of every child process the harness starts.

A job is a function of its own argv that returns an exit code (the table is harness/process/jobs.py);
the parent builds the command with `harness.process.children.child_command(job, *args)`. A usage
error (an unknown job, a bad option) prints one line and exits 2, as the `attnbench` command does;
anything else a job raises is a bug, and its traceback is what the parent shows as the child's tail.
"""

from __future__ import annotations

import sys
from typing import Sequence

from harness.process.jobs import run_job


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job named by argv[0] with the rest of argv; exit 2 with one line on a usage error."""
    return run_job(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    from harness.process.fast_exit import end_process

    end_process(main)
