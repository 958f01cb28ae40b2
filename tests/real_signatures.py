"""A library's real functions from its source text, for a test where the library cannot be imported.

`signature_from_source` builds the `inspect.Signature` of a top-level function with `ast` (the
defaults are placeholders: binding needs only the names, kinds and which have defaults);
`function_from_source` runs one top-level function's own code alone, its decorators dropped, for a
pure check (a validator) whose module imports what this machine lacks (a GPU toolchain).
"""

from __future__ import annotations

import ast
import inspect
import tarfile
from pathlib import Path
from typing import Any, Callable


class SourceDefault:
    """A parameter's default as its source spells it (never evaluated)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _function(source: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no top-level function {name!r} in the source")


def signature_from_source(source: str, name: str) -> inspect.Signature:
    """The signature of top-level function `name` in `source`, parameters in order with their kinds."""
    args = _function(source, name).args
    P = inspect.Parameter
    params: list[inspect.Parameter] = []
    positional = args.posonlyargs + args.args
    # ast keeps positional defaults right-aligned against the positional parameters.
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=P.empty if default is None else SourceDefault(ast.unparse(default))))
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if default is None else SourceDefault(ast.unparse(default))))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def function_from_source(source: str, name: str, namespace: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Top-level function `name` of `source`, compiled alone (no decorators) with `namespace` as its globals."""
    node = _function(source, name)
    node.decorator_list = []
    module = ast.Module(body=[node], type_ignores=[])
    scope: dict[str, Any] = dict(namespace or {})
    exec(compile(module, f"<{name} from source>", "exec"), scope)
    return scope[name]


def read_members(archive_or_dir: Path, relatives: tuple[str, ...]) -> dict[str, str]:
    """The texts of `relatives` in an sdist (.tar.gz, under its top folder) or an unpacked tree, read in one pass; absent ones left out."""
    found: dict[str, str] = {}
    if archive_or_dir.is_dir():
        for relative in relatives:
            path = next((m for m in [archive_or_dir / relative, *archive_or_dir.glob(f"*/{relative}")] if m.is_file()), None)
            if path:
                found[relative] = path.read_text()
        return found
    with tarfile.open(archive_or_dir) as tar:  # one sequential read: a .tar.gz has no index to seek by
        for member in tar:
            relative = member.name.split("/", 1)[-1]
            if member.isfile() and relative in relatives:
                handle = tar.extractfile(member)
                found[relative] = handle.read().decode() if handle else ""
                if len(found) == len(relatives):
                    break
    return found
