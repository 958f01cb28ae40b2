"""Where a suite's `file:` lengths are read from, for a suite file or a run folder's frozen copy of one."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.files import MAX_DOCUMENT_BYTES, parse_json, read_regular

#: How many frozen copies `lengths_folder` follows back (a repro of a repro of ...) before it calls the chain a loop.
MAX_SUITE_COPIES = 64


def lengths_folder(path: Path) -> Path:
    """Where a suite's relative `file:` paths are read from: the suite file's folder, or, for a run folder's frozen copy
    of a suite, the folder of the suite it was first copied from (the manifest's `suite_arg`, followed back through
    the frozen copies a chain of repros made), where the lengths files are."""
    seen: set[Path] = set()
    while len(seen) < MAX_SUITE_COPIES:
        seen.add(path.resolve())
        manifest = path.parent / "manifest.json"
        if not manifest.is_file():
            return path.parent
        try:
            # Bounded, and nesting past the parser's depth is a UserError (not a RecursionError) like any bad JSON.
            data = parse_json(read_regular(manifest, "manifest", MAX_DOCUMENT_BYTES), manifest)
        except UserError as exc:
            # Refused, not guessed past: which folder the `file:` lengths come from (so which cases run) depends on it.
            raise UserError(f"{path}: the manifest beside it cannot be read ({exc})") from None
        if not (isinstance(data, dict) and data.get("suite_copy") == path.name and isinstance(data.get("suite_arg"), str)):
            return path.parent
        source = Path(data["suite_arg"])
        if source.resolve() in seen:
            raise UserError(f"{path}: its manifest's suite_arg leads back to a suite copy already followed ({source})")
        path = source
    raise UserError(f"{path}: more than {MAX_SUITE_COPIES} frozen suite copies in a row; cannot tell where its lengths files are")
