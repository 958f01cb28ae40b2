"""Before a run: does a worker process load the plugin backends this process loaded?

A worker loads its backends itself (harness.run.worker), in a process started from the checkout's root with the
environment `harness.process.children` gives it. A plugin this process found on a path that child cannot see
(a folder put on `sys.path` by hand rather than through PYTHONPATH, say) would make every one of its rows an
`error`. One child that loads the registry exactly as a worker does, started exactly as a worker is (forked from the
run's worker template on a CPU, which its workers then reuse; a fresh interpreter on CUDA), finds that before the
run folder exists, and only when a plugin is asked for: built-in backends come with `harness` itself, which a child always imports from this checkout.
"""

from __future__ import annotations

import argparse
from typing import Mapping, Sequence

from harness.backends.registry import BUILTIN_CLASSES, Registry, load_registry
from harness.errors import UserError
from harness.process import forkserver
from harness.process.children import ROOT, emit

#: How long the probe may take to start Python, import torch and load the plugins (a loaded node's file system is slow).
PROBE_TIMEOUT_S = 300.0


def plugin_backends(registry: Registry, names: Sequence[str]) -> list[str]:
    """Those of `names` that `registry` loaded from a plugin (not a built-in, not one that failed to load here)."""
    loaded = {backend.name: backend for backend in registry}
    return [name for name in names if name in loaded and type(loaded[name]) not in BUILTIN_CLASSES]


def check_workers_load(registry: Registry, names: Sequence[str], env: Mapping[str, str], fork: bool = False) -> None:
    """Raise a UserError naming each plugin backend of `names` that a worker started with `env` cannot load, and why.

    `fork`: the run's workers are forked from a template (CPU runs), so the probe is too, from the same one, which the
    workers then reuse; otherwise, or where no template starts (nor will the workers'), it is a fresh interpreter.
    """
    plugins = plugin_backends(registry, names)
    if not plugins:
        return
    result = forkserver.run_job(["load-backends", *plugins], env, PROBE_TIMEOUT_S, fork=fork)
    if not result.ok:
        raise UserError(f"a worker process could not load the plugin backend(s) {', '.join(plugins)}: {result.describe()}")
    answer = result.objects[-1]
    missing = [name for name in plugins if name not in answer["loaded"]]
    if not missing:
        return
    here = registry.failures()
    reasons = [reason for label, reason in answer["failed"].items() if here.get(label) != reason]
    why = "; ".join(reasons) or "no plugin there registers it"
    raise UserError(f"backend {', '.join(missing)} loads in this process but not in a worker process (started in {ROOT}): {why} "
                    f"(a worker sees PYTHONPATH, installed packages and the folder `python -m` ran in, not a path added to sys.path by hand)")


def load_backends_job(argv: list[str]) -> int:
    """harness.child's `load-backends` job: load the registry as a worker does and say which of the named backends loaded."""
    from harness.process.jobs import job_parser

    parser = job_parser("load-backends", "Load the backends as a worker does; print which of NAMES loaded and what failed.")
    parser.add_argument("names", nargs="*", help="backend names to look for")
    args: argparse.Namespace = parser.parse_args(argv)
    registry = load_registry()
    loaded = {backend.name for backend in registry}
    emit({"loaded": [name for name in args.names if name in loaded], "failed": registry.failures()})
    return 0
