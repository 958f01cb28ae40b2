"""The `report`, `compare` and `recommend` subcommands: argument parsing here, the work in analysis/report/compare.

Kept light on purpose: nothing heavy (pandas, matplotlib) is imported until a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from harness.errors import UserError


def _variation(args: argparse.Namespace):
    """The run-to-run variation named by --variation, or None."""
    from harness.analysis.difference import read_variation

    return read_variation(args.variation) if args.variation else None


def cmd_report(args: argparse.Namespace) -> int:
    """Write reports/<run-id>/index.html and its CSVs, and print the page's path."""
    from harness.report import build_report

    path = build_report([Path(r) for r in args.runs], out_root=Path(args.out), baseline=args.baseline, variation=_variation(args))
    print(f"report: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare two runs row by row; exit 1 when --fail-above is given and some row regressed past it."""
    from harness.analysis.compare import (EXIT_REGRESSION, EXIT_UNDECIDED, compare_runs, comparison_document, parse_min_judged, parse_threshold,
                                          print_comparison)
    from harness.results.store import write_file

    threshold = parse_threshold(args.fail_above) if args.fail_above is not None else None
    base, new = Path(args.base), Path(args.new)
    out = Path(args.out) if args.out else Path("reports") / f"compare-{base.name}-vs-{new.name}.csv"
    _check_comparison_out(out)  # before any work: nothing is printed for a comparison that cannot be kept
    result = compare_runs(base, new, threshold, force=args.force, variation=_variation(args), min_judged=parse_min_judged(args.min_judged))
    if not args.json:
        print_comparison(result, base.name, new.name, sys.stdout)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out, result.table.to_csv(index=False))
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps({**comparison_document(result, base.name, new.name), "csv": str(out)}, indent=1, default=str))
    else:
        print(f"csv: {out}")
    return EXIT_REGRESSION if result.failed else (EXIT_UNDECIDED if result.undecided else 0)


#: How a comparison CSV starts (`compare_frames`' first columns): the one kind of existing file `compare --out` replaces.
_COMPARISON_HEADER = b"case_id,backend,status_base,status_new,"


def _check_comparison_out(out: Path) -> None:
    """Refuse (UserError) a comparison CSV path in a run folder, or over a file that is not an earlier comparison."""

    def is_comparison(target: Path) -> bool:
        with open(target, "rb") as f:
            return f.read(len(_COMPARISON_HEADER)) == _COMPARISON_HEADER

    check_output_file(out, "a comparison", "CSV", is_comparison)


def check_output_file(out: Path, what: str, kind: str, ours: Callable[[Path], bool]) -> Path:
    """Refuse (UserError) an --out path for `what` ("a comparison") in a run folder, not a plain file, or over a non-empty file `ours` does not recognise; return it resolved."""
    from harness.results.store import resolved, run_folder_of

    target = resolved(out, "--out")
    if target.is_dir():
        raise UserError(f"--out {out} is a folder: give the path of the {kind} file to write")
    held = run_folder_of(target.parent)
    if held is not None:
        raise UserError(f"--out {out} is inside the run folder {held}: {what} is never written into a run; give a path outside it")
    if out.is_symlink() or (target.exists() and not target.is_file()):
        raise UserError(f"--out {out} is not a plain file: give the path of the {kind} file to write")
    if target.exists() and target.stat().st_size and not ours(target):
        raise UserError(f"--out {out} exists and is not {what} attnbench wrote: give another path, or remove it first")
    return target


def cmd_recommend(args: argparse.Namespace) -> int:
    """Answer which backend to use for a shape, from the run's measured rows only."""
    from harness import analysis
    from harness.suite.cases import canonical_dtype

    query: dict = {"B": args.B, "S": args.seq, "H": args.H, "H_kv": args.H_kv, "d_k": args.d_k,
                   "dtype": canonical_dtype(args.dtype) if args.dtype else None, "causal": args.causal, "batch": args.batch}
    label = ""
    if args.model:
        shape = analysis.model_shape(args.model)
        for name in ("H", "H_kv", "d_k"):
            if query[name] is not None and query[name] != shape[name]:
                raise UserError(f"--{name.replace('_', '-').lower()} {query[name]} contradicts --model {args.model} ({name}={shape[name]})")
            query[name] = shape[name]
        label = f"{args.model} (H={shape['H']}, H_kv={shape['H_kv']}, d_k={shape['d_k']}): "
    if all(v is None for v in query.values()):
        raise UserError("say which shape: --model NAME and/or --seq, --B, --H, --H-kv, --d-k, --dtype, --causal, --batch")
    from harness.analysis.difference import check_variation_device

    variation = _variation(args)
    data = analysis.load([Path(args.run)])
    check_variation_device(variation, list(data.env.values()), args.run)
    answer = analysis.recommend(data.frame, query, variation.cv if variation else 0.0)
    if args.json:
        print(json.dumps({"model": args.model, "query": {k: v for k, v in query.items() if v is not None}, **answer.to_dict()},
                         indent=1, default=str))
    else:
        print("\n".join(answer.lines(label)))
    return 0 if answer.best or any(c.winner for c in answer.cases) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register report, compare and recommend on the CLI's subparsers."""
    p = sub.add_parser("report", help="write reports/<run-id>/index.html (self-contained) and CSVs from one or more runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder(s), e.g. results/<run-id>")
    p.add_argument("--out", default="reports", help="parent folder of report folders (default: reports)")
    p.add_argument("--baseline", default=None, help="backend the speedups are against (default: the one that declares itself the baseline, sdpa-math)")
    add_variation_argument(p)
    p.set_defaults(func=cmd_report, measures=False)

    p = sub.add_parser("compare", help="compare two runs per (case, backend); --fail-above 5%% gates on slowdowns")
    p.add_argument("base", metavar="BASE", help="the reference run folder")
    p.add_argument("new", metavar="NEW", help="the run folder to judge")
    p.add_argument("--fail-above", metavar="PCT", help="exit 1 if a row is slower by the difference rule and by more than PCT (e.g. 5%%), or stopped running; "
                                                       "a pair contended or suspect in either run is not judged; exit 3 when no pair could be judged")
    p.add_argument("--out", help="CSV to write (default: reports/compare-BASE-vs-NEW.csv)")
    add_min_judged_argument(p)
    p.add_argument("--force", action="store_true", help="compare even when the runs measured different devices")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document (rows, per-backend summary, gate) instead of text")
    add_variation_argument(p)
    p.set_defaults(func=cmd_compare, measures=False)

    p = sub.add_parser("recommend", help="the fastest agreeing backend (and layout) for a shape, from a run's measured rows without contended or suspect ones")
    p.add_argument("run", metavar="RUN", help="run folder")
    p.add_argument("--model", help="a model preset, e.g. llama3-8b (sets H, H_kv, d_k)")
    p.add_argument("--seq", type=int, help="sequence length S (S_q = S_kv = S)")
    p.add_argument("--B", type=int, help="batch size")
    p.add_argument("--H", type=int, help="query heads")
    p.add_argument("--H-kv", dest="H_kv", type=int, help="key/value heads")
    p.add_argument("--d-k", dest="d_k", type=int, help="head dimension")
    p.add_argument("--dtype", help="fp32, fp16, bf16 or fp64")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="causal (or --no-causal); default: either")
    p.add_argument("--batch", help="only rows of this serving batch, as the run recorded it: a mixed batch ('2x2048 + 32x1@1024') or a "
                                   "length distribution ('uniform(64,512)')")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON document (the overall answer, each case's, the rows left out)")
    add_variation_argument(p)
    p.set_defaults(func=cmd_recommend, measures=False)


def add_min_judged_argument(parser: argparse.ArgumentParser) -> None:
    """--min-judged N|P%: the judged pairs a gate (compare --fail-above, regress) needs to pass."""
    from harness.analysis.compare import DEFAULT_MIN_JUDGED

    parser.add_argument("--min-judged", default=DEFAULT_MIN_JUDGED, metavar="N|P%",
                        help="with a gate: pass only when at least N pairs, or P%% of the pairs both runs measured ok, were judged "
                             f"(not contended, suspect or throttled); fewer exit 3 with the share (default {DEFAULT_MIN_JUDGED.replace('%', '%%')})")


def add_variation_argument(parser: argparse.ArgumentParser) -> None:
    """--variation FILE: the run-to-run variation `attnbench stability` wrote, which widens every interval the rule compares."""
    parser.add_argument("--variation", metavar="FILE", help="run-to-run variation written by `attnbench stability --out FILE`: "
                        "two latencies differ only if their 95%% intervals, widened by ±2·CV, do not overlap")
