"""Commands that publish a run beyond attnbench: `export` writes it in another tool's format.

Kept light: nothing is imported until a command runs, and none of these needs torch (`measures=False`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run as pytest-benchmark JSON or flashinfer-bench trace JSONL, and say how many rows went in."""
    from harness.history.export import export_run

    result = export_run(Path(args.run), args.format, Path(args.out), force=args.force)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.format == "pytest-benchmark":
        print(f"exported {result.exported} benchmarks ({len(result.left_out)} rows not ok left out) to {args.out}")
    else:  # an ok row of a kind flashinfer-bench has no definition for is left out too
        print(f"exported {result.exported} traces ({len(result.left_out)} rows not ok or of no flashinfer-bench kind left out) "
              f"to {args.out}")
    return 0


def add_export_command(sub: argparse._SubParsersAction) -> None:
    """Register `export RUN --format {pytest-benchmark,flashinfer-bench} --out FILE [--force]` on the CLI's subparsers."""
    from harness.history.export import FORMATS

    p = sub.add_parser("export", help="write a run's ok rows as pytest-benchmark JSON (pytest-benchmark compare, github-action-benchmark) "
                                      "or flashinfer-bench trace JSONL")
    p.add_argument("run", metavar="RUN", help="run folder, e.g. results/<run-id>")
    p.add_argument("--format", required=True, choices=FORMATS, help="pytest-benchmark or flashinfer-bench")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write (never inside a run folder)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists (default: refuse)")
    p.set_defaults(func=cmd_export, measures=False)


def cmd_site(args: argparse.Namespace) -> int:
    """Build the static site of every run in the database, and say where its index is."""
    from harness.errors import UserError
    from harness.history.database import DEFAULT_PATH, open_database  # lazily: the database module is optional until a command runs
    from harness.history.site import build_site, check_site_out

    out = check_site_out(Path(args.out))  # before the database is opened: a site that cannot be kept is not built
    target = str(DEFAULT_PATH if args.db is None else args.db)  # the default every database command shares
    if "://" not in target and Path(target).resolve().is_relative_to(out):
        raise UserError(f"--db {target} lies inside --out {args.out}: the site replaces that folder whole; give an --out beside it")
    with open_database(target, create=False) as db:
        runs, rows = db.runs_frame(), db.rows_frame()
    index = build_site(runs, rows, Path(args.out))
    print(f"site written: {index}")
    return 0


def add_site_command(sub: argparse._SubParsersAction) -> None:
    """Register `site [--db FILE|URL] --out DIR` on the CLI's subparsers."""
    from harness.cli.history import DB_HELP

    p = sub.add_parser("site", help="write a static site of every run in the results database: index by device, trends, winners, CSVs")
    p.add_argument("--db", metavar="FILE|URL", help=DB_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="folder the site is written as (new, empty, or an earlier site, which is replaced whole)")
    p.set_defaults(func=cmd_site, measures=False)
