"""The `db add`, `db list` and `regress` subcommands: runs kept in the results database, and the newest run of each machine judged against the one before.

Kept light on purpose, as harness/cli/report.py is: SQLAlchemy and pandas are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DB_HELP = "results database: an SQLite file (default results/attnbench.sqlite) or a postgresql:// URL"


def cmd_db_add(args: argparse.Namespace) -> int:
    """Read every run folder first (a bad one refuses them all), then add each, one line per run."""
    from harness.history.database import open_database
    from harness.history.ingest import read_run

    ingested = [read_run(Path(run)) for run in args.runs]
    for run in ingested:
        for warning in run.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    with open_database(args.db) as db:
        if not args.replace:  # a run that cannot be added refuses them all, before any is written
            for run in ingested:
                db.check_add(run)
        for run in ingested:
            uuid8, run_id = run.run["run_uuid"][:8], run.run["run_id"]
            if not db.add_run(run, replace=args.replace):
                print(f"already in {db.name}: {run_id} (unchanged)")
            elif db.last_action == "updated":
                print(f"updated {run_id} ({uuid8}, {len(run.rows)} rows, {run.run['device_model']}): a later state of the run stored "
                      "(resumed since it was added), so its rows were replaced")
            elif db.last_action == "replaced":
                print(f"replaced {run_id} ({uuid8}, {len(run.rows)} rows, {run.run['device_model']}) with this copy (--replace)")
            else:
                print(f"added {run_id} ({uuid8}, {len(run.rows)} rows, {run.run['device_model']})")
    return 0


#: The run columns `db list --json` prints (the stored documents are left out: `site` and `export` read those).
LIST_COLUMNS = ("run_uuid", "run_id", "suite", "device_type", "device_model", "host", "harness_version", "harness_commit", "harness_dirty",
                "torch", "torch_cuda", "python", "created_utc", "added_utc", "source_path", "pairs", "rows", "rows_ok", "content_sha256")


def _cell(value):
    """A frame's cell as JSON holds it (NaN and pandas' missing values → None, numpy numbers → Python's)."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _nodes_text(per_node: dict[str, int] | None) -> str:
    """`  rows per node: 10.0.0.1 12, 10.0.0.2 6` for a Ray run's line of `db list`; '' for a run whose rows name no node."""
    if not per_node:
        return ""
    return "  rows per node: " + ", ".join(f"{node} {n}" for node, n in sorted(per_node.items()))


def cmd_db_list(args: argparse.Namespace) -> int:
    """One line per run in the database, oldest first; --json prints them as a JSON list."""
    from harness.history.database import open_database

    with open_database(args.db, create=False) as db:
        runs = db.runs_frame()
        per_node = db.rows_per_node()
    if args.json:
        from harness.results.strict_json import dumps

        print(dumps([{**{k: _cell(r[k]) for k in LIST_COLUMNS}, "rows_per_node": per_node.get(r["run_uuid"])} for _, r in runs.iterrows()]))
        return 0
    if runs.empty:
        print(f"{db.name} holds no runs: add runs with attnbench db add RUN")
    for _, r in runs.iterrows():
        commit = str(r["harness_commit"] or "")[:8] or "?"
        dirty = "+dirty" if _cell(r["harness_dirty"]) else ""
        print(f"{str(r['created_utc'] or '?')[:10]}  {r['run_id']}  {r['suite']}  {r['device_model']}  "
              f"attnbench {r['harness_version'] or '?'}/{commit}{dirty}  torch {r['torch'] or '?'}  {int(r['rows_ok'])}/{int(r['rows'])} ok"
              + _nodes_text(per_node.get(r["run_uuid"])))
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    """Per (suite, device model): the newest run against the one before, by compare's rule; exit 1 on a regression, 3 when nothing was judged."""
    from harness.analysis.compare import parse_min_judged, parse_threshold
    from harness.history.database import open_database
    from harness.history.regress import print_regression, regress, regression_markdown

    threshold, min_judged = parse_threshold(args.fail_above), parse_min_judged(args.min_judged)
    with open_database(args.db, create=False) as db:
        regression = regress(db, threshold, min_judged)
    if args.md:
        print(regression_markdown(regression))
    else:
        print_regression(regression, sys.stdout)
    return regression.outcome()[0]


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `db add`, `db list` and `regress` on the CLI's subparsers."""
    p = sub.add_parser("db", help="the results database of runs (SQLite or PostgreSQL): db add RUN..., db list")
    db_sub = p.add_subparsers(dest="db_command", metavar="{add,list}", required=True)
    q = db_sub.add_parser("add", help="add run folders to the results database (adding one twice changes nothing)")
    q.add_argument("runs", nargs="+", metavar="RUN", help="run folder, e.g. results/<run-id>")
    q.add_argument("--db", metavar="FILE|URL", help=DB_HELP)
    q.add_argument("--replace", action="store_true",
                   help="replace a stored run by this copy of it even when it is not a later state of it (an earlier or edited copy)")
    q.set_defaults(func=cmd_db_add, measures=False)
    q = db_sub.add_parser("list", help="one line per run in the results database, oldest first")
    q.add_argument("--db", metavar="FILE|URL", help=DB_HELP)
    q.add_argument("--json", action="store_true", help="print the runs as a JSON list instead")
    q.set_defaults(func=cmd_db_list, measures=False)
    p = sub.add_parser("regress", help="per suite and device: the newest run in the database against the one before; exit 1 on a regression")
    p.add_argument("--db", metavar="FILE|URL", help=DB_HELP)
    p.add_argument("--fail-above", default="5%", metavar="PCT",
                   help="a row slower by compare's rule and by more than this fails (default 5%%)")
    from harness.cli.report import add_md_argument, add_min_judged_argument

    add_min_judged_argument(p)
    add_md_argument(p, "the verdict, then per group the judged and not-judged counts, geometric means, top regressions and improvements")
    p.set_defaults(func=cmd_regress, measures=False)
