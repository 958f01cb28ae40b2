"""`attnbench stability`'s command line: the case named by id or flags, and the variation document written at --out.

The measuring is harness/checks/stability.py's; the case arguments are shared with `attnbench profile`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UserError
from harness.suite.cases import Case, parse_case_id

if TYPE_CHECKING:  # the parser imports this module: the check's engine (and pandas, through harness.analysis) only when it runs
    from harness.checks.stability import StabilityResult


def check_variation_out(path: Path) -> Path:
    """Refuse (UserError) a variation path inside a run folder or over a file that is not a variation; return it resolved."""
    from harness.analysis.difference import MAX_VARIATION_BYTES, VARIATION_KIND
    from harness.cli.report import check_output_file
    from harness.files import parse_json, read_regular

    def is_variation(target: Path) -> bool:
        # The document reader, not read_text(): a huge file is not read whole, nesting past the parser's depth is no traceback.
        try:
            doc = parse_json(read_regular(target, "variation document", MAX_VARIATION_BYTES), target)
        except UserError:
            return False
        return isinstance(doc, dict) and doc.get("kind") == VARIATION_KIND

    return check_output_file(path, "a variation", "JSON", is_variation)


def write_variation(result: StabilityResult, path: Path) -> None:
    """Write `result`'s run-to-run variation as JSON at `path` (checked by `check_variation_out`)."""
    import json

    from harness.env import fingerprint
    from harness.results.store import write_file

    result.refuse_if_contended()  # before the device is fingerprinted: nothing of a refused variation is written or looked up
    target = check_variation_out(path)
    document = result.variation(fingerprint(result.case.device)["device_name"]).to_dict()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, json.dumps(document, indent=1) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The ways to name one case on the command line: a case id, or shape flags."""
    parser.add_argument("case", nargs="?", help="a case id such as B1-Sq1024-Skv1024-H8-Hkv8-dk64-fp32 (or give the flags below)")
    group = parser.add_argument_group("case by flags")
    sizes = {
        "B": "Case.B: the batch size, in sequences (required with flags)",
        "S": "Case.S_q and Case.S_kv both: the sequence length, in tokens (or give --S-q and --S-kv)",
        "S-q": "Case.S_q: the query length, in tokens (with --S-kv, instead of --S)",
        "S-kv": "Case.S_kv: the key/value length, in tokens (with --S-q, instead of --S)",
        "H": "Case.H: the number of query heads (required with flags)",
        "H-kv": "Case.H_kv: the number of key/value heads (default: --H, i.e. MHA)",
        "d-k": "Case.d_k: the query/key head dimension, in elements (required with flags)",
        "d-v": "Case.d_v: the value head dimension, in elements (default: --d-k)",
        "window": "Case.window: each query sees this many keys, ending at its own position (default: no window)",
    }
    for flag, help_ in sizes.items():
        group.add_argument(f"--{flag}", type=int, dest=f"case_{flag.replace('-', '_')}", help=help_)
    group.add_argument("--dtype", dest="case_dtype", help="Case.dtype: the inputs' element type, e.g. fp32, bf16, fp16 (default: fp32)")
    group.add_argument("--mode", dest="case_mode", help="Case.mode: the pass timed, fwd, bwd or fwd_bwd (default: fwd)")
    group.add_argument("--causal", action="store_true", dest="case_causal", help="Case.causal: a causal mask, aligned bottom-right")
    group.add_argument("--padding", action="store_true", dest="case_padding",
                       help="Case.padding: per-sequence key lengths drawn from the seed (a right-padded batch)")


def case_from_args(args: argparse.Namespace, device: str) -> Case:
    """The case named by `add_case_arguments`' arguments, on `device`."""
    flags = {k[5:]: v for k, v in vars(args).items() if k.startswith("case_") and v is not None and v is not False}
    if args.case:
        if flags:
            raise UserError("give a case id or case flags, not both")
        return parse_case_id(args.case, device)
    if "B" not in flags or "H" not in flags or "d_k" not in flags:
        raise UserError("give a case id, or at least --B, --S (or --S-q and --S-kv), --H and --d-k")
    s = flags.pop("S", None)
    if s is not None and ("S_q" in flags or "S_kv" in flags):
        raise UserError("give either --S or --S-q/--S-kv, not both")
    if s is None and ("S_q" not in flags or "S_kv" not in flags):
        raise UserError("give --S, or both --S-q and --S-kv")
    fields = {"S_q": s, "S_kv": s, **flags} if s is not None else flags
    fields.setdefault("H_kv", fields["H"])
    fields.setdefault("d_v", fields["d_k"])
    return Case(device=device, **fields)
