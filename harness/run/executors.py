"""Which executor runs a run's pairs: the local supervisor's worker processes, or tasks on a Ray cluster.

Chosen here, outside both supervisors, so that the base class never builds its subclass and the
Ray executor (an optional extra) is imported only when asked for.
"""

from __future__ import annotations

from typing import TextIO

from harness.errors import UserError
from harness.run.supervisor import RunConfig, Supervisor

EXECUTORS = ("local", "ray")


def supervisor_for(config: RunConfig, log: TextIO | None = None) -> Supervisor:
    """The supervisor of the executor the config names: harness.run.supervisor's for `local`, harness.run.ray_executor's for `ray`."""
    if config.executor not in EXECUTORS:
        raise UserError(f"unknown executor {config.executor!r}: expected {' or '.join(EXECUTORS)}")
    if config.ray_address is not None and config.executor != "ray":
        raise UserError("--ray-address goes with --executor ray")
    if config.executor == "ray":
        from harness.run.ray_executor import RaySupervisor, become_driver  # Ray is an optional extra: imported only when asked for

        become_driver(config)  # this process turns Ray driver here, once: its environment is set before Ray is imported
        return RaySupervisor(config, log)
    return Supervisor(config, log)
