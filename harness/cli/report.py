"""The `report`, `compare` and `recommend` subcommands: argument parsing here, the work in analysis/report/compare.

Kept light on purpose: nothing heavy (pandas, matplotlib) is imported until a command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from harness.errors import UserError


def _variation(args: argparse.Namespace):
    """The run-to-run variation named by --variation, or None."""
    from harness.analysis.difference import read_variation

    return read_variation(args.variation) if args.variation else None


def cmd_report(args: argparse.Namespace) -> int:
    """Write reports/<run-id>/index.html and its CSVs, and print the page's path; with --md, print the Markdown summary instead."""
    from harness.report import build_report

    if args.md:
        from harness.report import report_markdown

        print(report_markdown([Path(r) for r in args.runs], baseline=args.baseline, variation=_variation(args)))
        return 0
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
    if args.json and args.md:
        raise UserError("give --json or --md, not both: each is the whole of stdout")
    result = compare_runs(base, new, threshold, force=args.force, variation=_variation(args), min_judged=parse_min_judged(args.min_judged))
    if args.md:
        from harness.analysis.markdown import comparison_markdown

        print(comparison_markdown(result, base.name, new.name))
    elif not args.json:
        print_comparison(result, base.name, new.name, sys.stdout)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out, result.table.to_csv(index=False))
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    if args.json:
        print_json({**comparison_document(result, base.name, new.name), "csv": str(out)})
    elif args.md:
        print(f"\nEvery row: `{out}`")
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
    """Refuse (UserError) an --out path for `what` in a run folder, not a plain file, or over a file `ours` does not recognise
    (the one rule every writer follows: harness.results.outputs); return it resolved."""
    from harness.results.outputs import check_output_file as check

    return check(out, what, kind, ours)


def _variant_query(args: argparse.Namespace) -> dict:
    """What a custom shape's scores compute, from --window, --softcap, --sinks and --scale (none given: plain attention)."""
    for name, low in (("window", 1), ("softcap", 0), ("scale", 0)):
        value = getattr(args, name)
        if value is not None and not (value >= low if name == "window" else value > low):
            raise UserError(f"--{name} must be {'a positive number of tokens' if name == 'window' else 'a positive number'}, got {value:g}")
    return {"window": args.window, "softcap": args.softcap, "sinks": bool(args.sinks), "alibi": False, "scale": args.scale}


def cmd_recommend(args: argparse.Namespace) -> int:
    """Answer which backend to use for a shape, or for a model's attention at a TP degree, from the run's measured rows only."""
    from harness import analysis
    from harness.suite.cases import canonical_dtype

    query: dict = {"B": args.B, "S": args.seq, "H": args.H, "H_kv": args.H_kv, "d_k": args.d_k,
                   "dtype": canonical_dtype(args.dtype) if args.dtype else None, "causal": args.causal, "batch": args.batch}
    variant_flags = [f"--{n}" for n in ("window", "softcap", "scale") if getattr(args, n) is not None] + (["--sinks"] if args.sinks else [])
    label = ""
    if args.model:
        from harness.analysis.recommend import model_label
        from harness.suite.presets import get_preset, tp_heads

        tp = 1 if args.tp is None else args.tp
        preset = get_preset(args.model.strip().lower())
        heads = dict(zip(("H", "H_kv"), tp_heads(preset, tp)), d_k=preset.d_k)
        for name in ("H", "H_kv", "d_k"):
            if query[name] is not None and query[name] != heads[name]:
                raise UserError(f"{flag_of(name)} {query[name]} contradicts --model {args.model} at TP {tp} ({name}={heads[name]})")
        if variant_flags:
            raise UserError(f"{', '.join(variant_flags)} describe a custom shape; --model {args.model} answers for its own layers' window, softcap, "
                            "sinks and scale (see `attnbench models`): give one or the other")
        label = model_label(preset.name, tp)
    else:
        if args.tp is not None:
            raise UserError("--tp goes with --model (a custom shape gives its per-GPU heads with --H and --H-kv)")
        query["variant"] = _variant_query(args)
        if all(v is None for k, v in query.items() if k != "variant"):
            raise UserError("say which shape: --model NAME [--tp N] and/or --seq, --B, --H, --H-kv, --d-k, --dtype, --causal, --batch "
                            "(with --window, --softcap, --sinks, --scale for a score variant)")
    from harness.analysis.difference import check_variation_device

    variation = _variation(args)
    data = analysis.load([Path(args.run)])
    check_variation_device(variation, list(data.env.values()), args.run)
    cv = variation.cv if variation else 0.0
    if args.model:
        answer = analysis.recommend_model(data.frame, preset.name, tp, query, cv)
    else:
        answer = analysis.recommend(data.frame, query, cv)
    if args.json:
        shown = {k: v for k, v in query.items() if v is not None}
        print_json({"model": args.model, "tp": tp if args.model else None, "query": shown, **answer.to_dict()})
    else:
        print("\n".join(answer.lines(label)))
    return 0 if answer.best or any(c.winner for c in answer.cases) else 1


def flag_of(dest: str) -> str:
    """The flag a user typed for the argument stored as `dest` (`H_kv` → `--H-kv`): the case of `--H` and `--B` is the flag's."""
    return "--" + dest.replace("_", "-")


def print_json(document: Any) -> None:
    """Print one strict JSON document (`harness.results.strict_json`): NaN and infinities as null, never as `NaN`."""
    from harness.results.strict_json import dumps

    print(dumps(document))


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register report, compare and recommend on the CLI's subparsers."""
    p = sub.add_parser("report", help="write reports/<run-id>/index.html (self-contained) and CSVs from one or more runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder(s), e.g. results/<run-id>")
    p.add_argument("--out", default="reports", help="parent folder of report folders (default: reports)")
    p.add_argument("--baseline", default=None, help="backend the speedups are against (default: the one that declares itself the baseline, sdpa-math)")
    add_md_argument(p, "cases answered, rows judged and left out, wins and geometric-mean speed-up per backend, the winners and the cases "
                       "with no answer; writes no page")
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
    add_md_argument(p, "the verdict, judged and not-judged counts, per-backend geometric means, the top regressions and improvements")
    add_variation_argument(p)
    p.set_defaults(func=cmd_compare, measures=False)

    p = sub.add_parser("recommend", help="the fastest agreeing backend (and layout) for a shape, from a run's measured rows without contended or suspect ones")
    p.add_argument("run", metavar="RUN", help="run folder")
    p.add_argument("--model", help="a model preset (attnbench models lists them): answers only from the cases of its layers' attention "
                                   "(heads, window, softcap, sinks, scale, MLA), one answer per layer kind where they differ")
    p.add_argument("--tp", type=int, help="with --model: the tensor-parallel degree it runs at (each GPU's heads: H/TP, H_kv/TP; default 1)")
    p.add_argument("--seq", type=int, help="sequence length S (S_q = S_kv = S)")
    p.add_argument("--B", type=int, help="batch size")
    p.add_argument("--H", type=int, help="query heads")
    p.add_argument("--H-kv", dest="H_kv", type=int, help="key/value heads")
    p.add_argument("--d-k", dest="d_k", type=int, help="head dimension")
    p.add_argument("--dtype", help="fp32, fp16, bf16 or fp64")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None, help="causal (or --no-causal); default: either")
    p.add_argument("--window", type=int, metavar="W", help="a custom shape with a sliding window of W tokens (default: none)")
    p.add_argument("--softcap", type=float, metavar="C", help="a custom shape with a logit softcap C (default: none)")
    p.add_argument("--sinks", action="store_true", help="a custom shape with attention sinks (default: none)")
    p.add_argument("--scale", type=float, metavar="S", help="a custom shape with softmax scale S (default: 1/√d_k); without any of these "
                                                          "four, only plain cases are read: a variant is never ranked with another")
    p.add_argument("--batch", help="only rows of this serving batch, as the run recorded it: a mixed batch ('2x2048 + 32x1@1024') or a "
                                   "length distribution ('uniform(64,512)')")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON document (the overall answer, each case's, the rows left out)")
    add_variation_argument(p)
    p.set_defaults(func=cmd_recommend, measures=False)


def add_min_judged_argument(parser: argparse.ArgumentParser) -> None:
    """--min-judged N|P%: the judged pairs a gate (compare --fail-above, regress) needs to pass."""
    from harness.analysis.gate import DEFAULT_MIN_JUDGED

    parser.add_argument("--min-judged", default=DEFAULT_MIN_JUDGED, metavar="N|P%",
                        help="with a gate: pass only when at least N pairs, or P%% of the pairs both runs measured ok, were judged "
                             f"(not contended, suspect or throttled); fewer exit 3 with the share (default {DEFAULT_MIN_JUDGED.replace('%', '%%')})")


def add_md_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--md: print GitHub-flavoured Markdown (for a pull request's comment) instead of text."""
    parser.add_argument("--md", action="store_true", help=f"print GitHub-flavoured Markdown for a pull request's comment instead of text: {what}; "
                                                          "same exit status")


def add_variation_argument(parser: argparse.ArgumentParser) -> None:
    """--variation FILE: the run-to-run variation `attnbench stability` wrote, which widens every interval the rule compares."""
    parser.add_argument("--variation", metavar="FILE", help="run-to-run variation written by `attnbench stability --out FILE`: "
                        "two latencies differ only if their 95%% intervals, widened by ±2·CV, do not overlap")
