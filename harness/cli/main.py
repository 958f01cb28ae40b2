"""The `attnbench` command line: builds plain config objects and hands them to the library.

User mistakes (unknown backend or suite, bad shapes, existing run folder) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from harness.cli.arguments import comma_list, dtype_list, gpu_list, memory_limit, mode_list, non_negative_int
from harness.errors import UserError
from harness.process.usage import UsageParser, exit_status
from harness.results import strict_json
from harness.results.record import NOT_FAILURES, Status
from harness.results.run_options import TIMERS, RunOptions
from harness.telemetry.peaks_reuse import PEAKS_ENV, peaks_source

#: Worker processes per CPU core `run --workers` allows: beyond a few, workers only disturb each other's timings.
MAX_WORKERS_PER_CPU = 4


def cmd_backends(args: argparse.Namespace) -> int:
    """List every registered backend, available or not, and why."""
    from harness.backends.registry import load_registry

    registry = load_registry()
    if args.matrix:
        from harness.backends.matrix import capability_matrix, render

        matrix = capability_matrix(registry)
        print(strict_json.dumps([row.to_dict() for row in matrix]) if args.json else render(matrix).rstrip("\n"))
        return 0
    rows = registry.describe()
    if args.json:
        print(strict_json.dumps([row.__dict__ for row in rows]))
        return 0
    # Each column as wide as its longest value: a fixed width broke on families such as flash-attn and flashinfer.
    name_width, family_width = max(len(r.name) for r in rows), max(len(r.family) for r in rows)
    for row in rows:
        state = f"available  {row.version or ''}".rstrip() if row.available else f"unavailable: {row.reason}"
        print(f"{row.name:<{name_width}}  {row.family:<{family_width}}  {state}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment fingerprint a run would record."""
    from harness.env import detect_device, fingerprint
    from harness.telemetry.nvml import gpu_telemetry

    device = detect_device()
    info = {"fingerprint": fingerprint(device), "gpu_telemetry": gpu_telemetry() if device == "cuda" else None}
    print(strict_json.dumps(info))
    return 0


def cmd_stability(args: argparse.Namespace) -> int:
    """Measure one case in several fresh processes and print the spread of their medians."""
    from harness.checks.stability import run_stability
    from harness.cli.stability import case_from_args, check_variation_out, write_variation
    from harness.env import resolve_device
    from harness.results.run_options import check_threads
    from harness.suite.budget import MAX_BUDGET_S

    if not 0 < args.measure_s <= MAX_BUDGET_S:  # named here: a child given 1e308 s would be blamed on the backend
        raise UserError(f"--measure-s must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got {args.measure_s}")
    check_threads(args.threads)
    case = case_from_args(args, resolve_device(args.device))
    check_variation_out(Path(args.out))  # before the measuring: minutes of it are not lost to a path that cannot be written
    result = run_stability(case, args.backend, args.processes, args.measure_s, log=sys.stderr if sys.stderr.isatty() else None,
                           threads=args.threads)
    print(result.report(), flush=True)  # each process's evidence stands above a refusal to write the variation
    write_variation(result, Path(args.out))
    print(f"variation: {args.out} (give it to compare, recommend or report as --variation {args.out})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a suite (or resume a run) under the supervisor of the chosen executor and print where the results are."""
    from harness.run.executors import supervisor_for
    from harness.run.supervisor import RunConfig

    if args.model is not None:
        if args.suite is not None:
            raise UserError("give --suite or --model, not both")
        args.suite = f"model:{args.model}" + (f":{args.seq}" if args.seq else "") + (f":tp={args.tp}" if args.tp else "")
    elif args.seq is not None or args.tp is not None:
        raise UserError(f"{'--seq' if args.seq is not None else '--tp'} goes with --model")
    if args.resume is None and args.suite is None:
        raise UserError("give --suite NAME or --model PRESET (or --resume RUN_DIR)")
    options = RunOptions.from_flags(RunOptions.flag_values(args))  # refuses --traces without --profile, a bad --cooldown
    if args.run_id is not None:
        from harness.results.store import validate_run_id

        validate_run_id(args.run_id)  # '' too: an empty id is a mistake, not a request for the default
    max_workers = MAX_WORKERS_PER_CPU * (os.cpu_count() or 1)
    if args.workers > max_workers:  # checked before any slot is built: 10^12 slots would fill memory first
        raise UserError(f"--workers {args.workers} is more than {MAX_WORKERS_PER_CPU} per CPU of this machine ({max_workers}): "
                        "each worker is a process timing on these cores; use fewer")
    if args.resume is not None:
        # A resumed run is the run its manifest describes: these would silently be ignored.
        fixed = {"--suite/--model": args.suite, "--backends": args.backends, "--force": args.force or None, "--run-id": args.run_id,
                 "--device": args.device, "--only": args.only, "--case": args.case, "--peaks": args.peaks}
        clash = [flag for flag, value in fixed.items() if value is not None] + RunOptions.given_flags(args)
        if clash:
            raise UserError(f"--resume finishes the run as its manifest describes it; {', '.join(clash)} cannot change it (start a new run instead)")
    config = RunConfig(
        suite=args.suite or "", device=args.device, backends=args.backends, out=Path(args.out), run_id=args.run_id,
        workers=args.workers, gpus=gpu_list(args.gpus), force=args.force,
        resume=Path(args.resume) if args.resume else None, options=options,
        case_timeout_s=args.timeout, only=args.only or [], progress=not args.quiet,
        memory_limit=memory_limit(args.memory_limit), executor=args.executor, ray_address=args.ray_address,
        cases=args.case or [], peaks=None if args.resume is not None else peaks_source(args.peaks),
    )
    summary = supervisor_for(config).run()
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary.counts.items()))
    if summary.undecided:  # said on the line a user reads last, not only deep in the report
        counts += "; " + ", ".join(f"{n} {why}" for why, n in summary.undecided.items()) + ": their medians decide no answer"
    print(f"{sum(summary.counts.values())} of {summary.total} pairs recorded ({counts}) in {summary.wall_s:.0f} s")
    if summary.remeasured:
        from harness.run.remeasure import summary_text

        print(summary_text(summary.remeasured))
    print(f"results: {summary.run_dir}")
    if args.report is not None:
        from harness.report import build_report

        # Beside the run's --out unless a folder is named: a run into /data/exp/results reports into /data/exp/reports.
        out = Path(args.resume).parent if args.resume is not None else Path(args.out)  # a resumed run's --out is its folder's
        reports = Path(args.report) if args.report else out.parent / "reports"
        print(f"report: {build_report([summary.run_dir], out_root=reports)}")
    return _run_status(summary.counts)


def _run_status(counts: dict[str, int]) -> int:
    """0, or 1 when not one pair was measured and some failed (every worker died, say): a sweep that measured nothing failed.

    Failures beside measured rows are part of a sweep's answer (the top of `default` runs out of memory),
    and a run whose pairs are all honestly unsupported answered too.
    """
    failed = {status: n for status, n in counts.items() if n and status not in {s.value for s in NOT_FAILURES}}
    if failed and not counts.get(Status.OK.value):
        print(f"attnbench: no pair was measured ({', '.join(f'{n} {s}' for s, n in sorted(failed.items()))}): see the rows' reasons",
              file=sys.stderr)
        return 1
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Check agreement alone (no timing); exit 1 when an available backend disagrees."""
    from harness.cli.check import run_cli

    return run_cli(suite=args.suite, backends=args.backends, dtypes=args.dtype, modes=args.mode, device=args.device, only=args.only,
                   as_json=args.json)


def cmd_gpu_check(args: argparse.Namespace) -> int:
    """Every backend on gpu-check's small grid, each in a child process; exit 1 when a pair fails or disagrees."""
    from harness.cli.gpu_check import run_cli

    return run_cli(args.cpu, args.backends, args.rows)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from harness import running_version

    parser = UsageParser(prog="attnbench", description="Benchmark and profile attention backends.")
    parser.add_argument("--version", action="version", version=f"attnbench {running_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)

    p = sub.add_parser("backends", help="list backends, available or not and why")
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, family, available, reason, version}")
    p.add_argument("--matrix", action="store_true",
                   help="what each backend serves of each feature (score variants, layouts, backward, determinism, FP8 KV cache) "
                        "per device and dtype, with every refusal's reason, from the declarations: no GPU needed "
                        "(--json: per backend its cells {device, feature, value, dtype, status, reasons, case_id})")
    p.set_defaults(func=cmd_backends)

    p = sub.add_parser("env", help="print the environment fingerprint")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("run", help="run a suite and write results/<run-id>/")
    p.add_argument("--suite", help="built-in suite (quick, default, …), 'auto' (by device), a .toml file, or a run folder (its pairs as its manifest holds them: what a row's repro runs)")
    p.add_argument("--model", help="a published model's attention instead of a suite (harness/suite/presets.py: llama3-405b, mistral-7b, deepseek-v3, …)")
    p.add_argument("--seq", help="with --model: comma-separated sequence lengths (default 1024,4096,16384; CPU: 128)")
    p.add_argument("--tp", help="with --model: tensor-parallel degrees such as 1,2,4,8: each GPU's shapes (H/TP query heads, "
                               "H_kv/TP KV heads, one replicated where H_kv < TP; default 1)")
    p.add_argument("--device", choices=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--backends", type=comma_list, help="comma-separated backend names (default: the suite's, else all)")
    p.add_argument("--out", default="results", help="parent folder of run folders (default: results)")
    p.add_argument("--run-id", help="name of the run folder (default: time-suite-pid)")
    p.add_argument("--workers", type=int, default=1, help="worker processes on CPU (default 1)")
    p.add_argument("--gpus", help="'all' or a list like 0,1: one worker per GPU")
    p.add_argument("--force", action="store_true", help="overwrite an existing run folder")
    p.add_argument("--resume", metavar="RUN_DIR", help="finish a run: only pairs without a record are run")
    p.add_argument("--only", type=comma_list, help="run only pairs whose key (<case id>-<backend>) contains each of these substrings")
    p.add_argument("--case", type=comma_list, metavar="ID[,ID]", help="run only the cases of these exact ids (a record's case_id)")
    p.add_argument("--order-seed", type=non_negative_int, metavar="N",
                   help="seed of the order of each case's backends (seeded Latin-square blocks; default 0, recorded in the manifest)")
    p.add_argument("--cooldown", nargs="?", const="auto", metavar="SECONDS|auto",
                   help="CUDA: before each pair wait until the GPU is back within 3 °C of its idle temperature, "
                        "at most SECONDS (auto: 60); the row records cooldown_s")
    p.add_argument("--no-check", action="store_true", help="skip the agreement check against float64")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one pair may run before it is killed (default 600)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch's intra-op CPU threads in each worker while timing (default on a CPU: torch's, the core count, less the "
                        "cores other work keeps busy as the run starts, at least 1; the manifest's threads_chosen says how); "
                        "fewer are slower on an idle machine but far less disturbed by other work; rows record it")
    p.add_argument("--peaks", metavar="FILE",
                   help="take the device ceilings (%% of peak's yardstick) from an earlier run's folder or peaks.json instead of "
                        f"measuring them (seconds a run); default ${PEAKS_ENV}. Taken only where device, host, CPU/GPU model, torch, "
                        "threads and dtypes match and nothing was contended; otherwise measured, and peaks.json says why")
    p.add_argument("--no-remeasure", action="store_true",
                   help="do not measure again, at the end of the sweep, the rows left contended, suspect or throttled (by default "
                        "each is measured once more, cheapest first, for at most half the sweep's time; the new row replaces it)")
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="CPU only: cap each worker's address space (RLIMIT_AS) at its start-up size plus SIZE, e.g. 2GiB; "
                        "a pair that allocates past it is recorded oom")
    p.add_argument("--profile", action="store_true",
                   help="one torch.profiler pass per pair after its timed samples: kernels/operators per step, their time, launch/gap share, time per category")
    p.add_argument("--traces", action="store_true", help="with --profile: also write one Chrome trace per pair under RUN/traces/")
    p.add_argument("--energy", action="store_true",
                   help="energy per call: after each pair's check, calls back to back on NVML's energy counter (GPU) or RAPL (CPU) "
                        "for 0.3-1 s (GPU) or 0.1-0.3 s a pair; without a counter the rows say why")
    p.add_argument("--timer", choices=TIMERS,
                   help="what a row's latency is: events (default: device time between CUDA events; perf_counter on CPU), "
                        "kernels (torch.profiler's kernel time per call), graph (CUDA-graph replay, forward only); named in the row's timer column")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="who runs the pairs: local worker processes (default), or tasks on a Ray cluster (pip install 'attnbench[ray]'; docs/ray.md)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="with --executor ray: the cluster's head (what `ray start --head` prints) or 'auto'; default RAY_ADDRESS, else a local Ray")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (a bar on a terminal; elsewhere, as in a CI log, a line every 5 s with done/total and the last pair)")
    p.add_argument("--report", nargs="?", const="", metavar="DIR",
                   help="then write DIR/<run-id>/index.html and print its path last (DIR default: reports beside --out)")
    p.set_defaults(func=cmd_run)

    from harness.cli.stability import add_case_arguments

    p = sub.add_parser("stability", help="run one case in fresh processes; print the coefficient of variation of their medians")
    add_case_arguments(p)
    p.add_argument("--processes", type=int, default=5, help="fresh processes, one measurement each (default 5)")
    p.add_argument("--backend", default="sdpa", help="backend to measure (default sdpa)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    p.add_argument("--measure-s", type=float, default=0.5, help="seconds of timed samples per process (default 0.5)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch's intra-op CPU threads in each process (default: torch's, the core count); recorded in the variation")
    p.add_argument("--out", default="reports/stability.json", help="JSON file for the measured variation, read by --variation (default: reports/stability.json)")
    p.set_defaults(func=cmd_stability)

    from harness.cli.profile import add_arguments as add_profile_arguments, cmd_profile

    p = sub.add_parser("profile", help="one pair under torch.profiler: kernels/operators per step against the median, memory peak, a trace file")
    add_profile_arguments(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("gpu-check", help="CUDA: every backend on a small grid, fwd/bwd, checked and timed (--cpu: tiny, on the CPU); exit 2 without CUDA")
    p.add_argument("--cpu", action="store_true", help="run on the CPU with tiny shapes (to test the command)")
    p.add_argument("--backends", type=comma_list, help="comma-separated backend names (default: every registered one)")
    p.add_argument("--rows", metavar="FILE", help="also write every (backend, case) row to this CSV, appended as each backend ends")
    p.set_defaults(func=cmd_gpu_check)

    p = sub.add_parser("check", help="check every backend against a float64 reference (no timing); exit 1 on a disagreement")
    p.add_argument("--suite", help="built-in suite, 'auto' or a .toml file (default: a small built-in check grid)")
    p.add_argument("--backends", type=comma_list, help="comma-separated backend names (default: the suite's, else all)")
    p.add_argument("--dtype", type=dtype_list, help="check only cases of these dtypes (e.g. fp32,bf16)")
    p.add_argument("--mode", type=mode_list, help="check only cases of these modes (fwd, bwd, fwd_bwd)")
    p.add_argument("--device", help="move every case to this device (cpu or cuda)")
    p.add_argument("--only", type=comma_list, help="check only pairs whose key (<case id>-<backend>) contains each of these substrings")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {case_id, backend, dtype, mode, status, verdict, agree, max_abs_err, err_bound, rel_err, "
                        "reason, failed}, one per pair; the rest goes to stderr; same exit status")
    p.set_defaults(func=cmd_check)
    from harness.cli.report import add_commands

    add_commands(sub)  # report, compare, recommend
    from harness.cli.models import add_command as add_models_command

    add_models_command(sub)
    from harness.cli.policy import add_command as add_policy_command

    add_policy_command(sub)
    from harness.cli.history import add_commands as add_history_commands
    from harness.cli.publish import add_export_command, add_site_command

    add_history_commands(sub)  # db add, db list, regress
    add_export_command(sub)
    add_site_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `attnbench` console script and of `python -m harness`."""
    parser = build_parser()
    this_process_is_the_command = argv is None  # not main([...]) called by a notebook, a script or a test
    argv = list(sys.argv[1:] if argv is None else argv)

    def command() -> int:
        from harness.env import require_supported_torch

        args = parser.parse_args(argv)
        if getattr(args, "measures", True):  # report, compare and recommend read rows: they need no torch (seconds of import)
            require_supported_torch()
            if this_process_is_the_command:
                from harness.process import command_image

                command_image.mark()  # a CPU run's worker template may be a fork of this process, not a second torch import
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)

    return exit_status(command)

if __name__ == "__main__":
    sys.exit(main())
