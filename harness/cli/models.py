"""`attnbench models`: every model preset with what it runs (heads, head dims, layer kinds with their window, sinks, softcap and scale, MLA dims, TP degrees)."""

from __future__ import annotations

import argparse


def cmd_models(args: argparse.Namespace) -> int:
    """Print every preset, one block each (or one strict JSON list with --json)."""
    from harness.results.strict_json import dumps
    from harness.suite.presets import PRESETS, describe

    documents = [describe(preset) for preset in PRESETS.values()]
    if args.json:
        print(dumps(documents))
        return 0
    for d in documents:
        mla = f"; MLA latent d_c {d['d_c']} + d_rope {d['d_rope']}" if d["mla"] else ""
        layers = f", {d['layers']} layers" if d["layers"] else ""
        print(f"{d['name']}: H {d['H']}, H_kv {d['H_kv']}, d_k {d['d_k']}, d_v {d['d_v']}, D {d['D']}, context {d['context']:,}{layers}{mla}")
        for k in d["layer_kinds"]:
            parts = [f"window {k['window']}" if k["window"] else "no window", *(["sinks"] if k["sinks"] else []),
                     *([f"softcap {k['softcap']:g}"] if k["softcap"] else []), f"scale {k['scale']:.4g}" if k["scale"] else "scale 1/√d_k"]
            where = f"{k['layers']} layers: {k['which']}" if k["layers"] else k["which"]
            print(f"  {k['name']} ({where}): {', '.join(parts)}")
        print("  TP: " + "; ".join(f"{tp}: H {h['H']}, H_kv {h['H_kv']} per GPU" for tp, h in d["tp"].items()))
        if d["note"]:
            print(f"  note: {d['note']}")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `models` on the CLI's subparsers."""
    p = sub.add_parser("models", help="list every model preset with what it runs: heads, layer kinds (window, sinks, softcap, scale), MLA dims, TP degrees")
    p.add_argument("--json", action="store_true", help="print one JSON list, one object per preset")
    p.set_defaults(func=cmd_models, measures=False)
