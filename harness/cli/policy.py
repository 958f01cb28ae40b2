"""The `policy` subcommand: measured runs → a backend policy a framework loads (harness/policy), and its check on runs it was not built from.

Kept light, as harness/cli/report.py is: pandas is imported only when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UserError

DB_HELP = "read the runs from this results database (SQLite file or postgresql:// URL): RUNs are then run ids in it, and none means every run"


def _is_policy(path: Path) -> bool:
    """Whether a file is a policy attnbench wrote (the one kind of existing file `--out` replaces)."""
    import json

    from harness.policy.build import POLICY_KIND

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("kind") == POLICY_KIND
    except (OSError, ValueError, AttributeError):
        return False


def _load(names: list[str], db: str | None):
    """The named runs (folders, or run ids in --db), and what the policy's `source` records."""
    from harness.history.database import policy_runs
    from harness.policy.sources import load_folders

    if db is not None:
        runs, name = policy_runs(db, names)
        return runs, {"db": name, "runs": [run.run_id for run in runs]}
    if not names:
        raise UserError("give at least one run folder (or --db FILE|URL)")
    return load_folders(names), {"runs": [str(n) for n in names]}


def _variation_cv(path: str | None, runs) -> float:
    """The CV of --variation (0 without it), refused when measured on another device than the runs'."""
    if path is None:
        return 0.0
    from harness.analysis.difference import read_variation

    variation = read_variation(path)
    for run in runs:
        if any(device != variation.device_name for device in run.devices):
            raise UserError(f"--variation {path} was measured on {variation.device_name!r} but {run.run_id} ran on "
                            f"{', '.join(map(repr, run.devices))}: measure the variation on the same device")
    print(variation.describe())
    return variation.cv


def cmd_policy(args: argparse.Namespace) -> int:
    """Build the policy of the runs and write it (--out), and/or check it on another run (--validate RUN_B, or leave-one-run-out)."""
    from harness.cli.report import check_output_file
    from harness.policy.build import build_policy, summary_lines
    from harness.policy.validate import Validation, check_same_device, judge, leave_one_run_out
    from harness.results import strict_json
    from harness.results.store import write_file

    if args.out is None and args.validate is None:
        raise UserError("give --out FILE to write the policy, or --validate [RUN_B] to check it (or both)")
    out = check_output_file(Path(args.out), "a policy", "JSON", _is_policy) if args.out else None
    runs, source = _load(list(args.runs), args.db)
    if args.validate == "" and len(runs) < 2:  # before any work: leave-one-run-out of one run has nothing to build from
        raise UserError("--validate without RUN_B leaves one run out at a time: give two runs or more (or name the run to validate on)")
    if not runs:
        raise UserError("the runs hold no rows: nothing to build a policy from")
    cv = _variation_cv(args.variation, runs)
    policy = build_policy(runs, interpolate=args.interpolate, source=source, cv=cv)
    for line in summary_lines(policy):
        print(line)
    if out is not None:
        try:
            write_file(out, strict_json.dumps(policy, indent=1) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"policy: {args.out}")
    if args.validate is not None:
        if args.validate:
            built = {run.run_id for run in runs}
            result = Validation()
            for run in _load([args.validate], args.db)[0]:
                if run.run_id in built:
                    raise UserError(f"--validate {args.validate}: run {run.run_id} is one the policy was built from; validate on another run "
                                    "(or give no RUN_B to leave each run out in turn)")
                check_same_device(policy, run)
                result.folds.append((run.run_id, "the policy of " + ", ".join(sorted(built))))
                judge(policy, run, result, cv)
        else:
            result = leave_one_run_out(runs, interpolate=args.interpolate, cv=cv)
        for line in result.lines():
            print(line)
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `policy` on the CLI's subparsers."""
    p = sub.add_parser("policy", help="measured runs → a JSON backend policy per device and shape bucket, with its evidence (docs/policy.md)")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run folders (with --db: run ids in the database; none: every run)")
    p.add_argument("--db", metavar="FILE|URL", help=DB_HELP)
    p.add_argument("--out", metavar="FILE", help="write the policy here (JSON, schema_version 1; read it with harness/policy/reader.py)")
    p.add_argument("--interpolate", action="store_true",
                   help="fill a never-measured log2 step whose measured neighbours agree, marked interpolated (default: listed as a gap)")
    p.add_argument("--validate", nargs="?", const="", metavar="RUN_B",
                   help="check the policy on RUN_B, a run of the same device it was not built from: the share of cases where its choice "
                        "was the fastest trusted row or within the rule's noise of it, misses named; without RUN_B, leave one run out")
    p.add_argument("--variation", metavar="FILE",
                   help="widen every interval by the run-to-run variation `attnbench stability --out FILE` measured on the runs' device, "
                        "as compare --variation does: margins and --validate's 'within noise' then allow for fresh processes' spread")
    p.set_defaults(func=cmd_policy, measures=False)
