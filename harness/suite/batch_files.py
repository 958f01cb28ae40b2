"""A run's lengths files frozen into its folder (`batches/<sha256 prefix>-<name>`), each recorded with its hash in the manifest,
and where a suite's `file:` lengths are read from, for a suite file or a run folder's frozen copy of one (`lengths_folder`).

A case drawn from a user's lengths file carries the lengths drawn, so its manifest rebuilds it; but only the file says that
they are what the file draws from the seed, as a seeded batch's lengths are checked against its seed. The run's folder keeps
a copy of each file as it was when the run started, so that check, and a reader, never depend on the file staying put:
rebuilding a run's cases reads the copy, and a copy that is gone is named in one line, with what became of its file.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from harness.errors import UserError
from harness.files import MAX_DOCUMENT_BYTES, parse_json, read_regular
from harness.suite.batch import MAX_LENGTHS_FILE_BYTES, case_batch, parse_batch
from harness.suite.cases import Case

#: The run folder's subfolder of frozen lengths files.
FROZEN = "batches"
#: Hex digits of the SHA-256 a copy's name starts with, and that a message shows.
SHOWN = 12

Entry = dict[str, Any]


def file_names(case: Case) -> tuple[str, ...]:
    """The lengths files a case's batch draws from, as its text names them (none for a dense or seeded batch)."""
    if not case.ragged:
        return ()
    terms = case_batch(case.length_dist).terms
    return tuple(dict.fromkeys(d.params[0] for t in terms for d in (t.q, t.kv) if d is not None and d.kind == "file"))


def _digest(path: Path) -> str | None:
    """SHA-256 of the file at `path`, or None when it cannot be read as one (gone, a folder, a FIFO...)."""
    try:
        return hashlib.sha256(read_regular(path, "lengths file", MAX_LENGTHS_FILE_BYTES)).hexdigest()
    except UserError:
        return None


def freeze(cases: Iterable[Case], source_of: Callable[[str, Case], Path]) -> list[tuple[Entry, bytes]]:
    """Each lengths file the cases draw from, once: its manifest entry (name, source, sha256, copy) and its bytes."""
    frozen: dict[str, tuple[Entry, bytes]] = {}
    for case in cases:
        for name in file_names(case):
            if name not in frozen:
                source = source_of(name, case)
                raw = read_regular(source, "lengths file", MAX_LENGTHS_FILE_BYTES)
                sha = hashlib.sha256(raw).hexdigest()
                copy = f"{sha[:SHOWN]}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(name).name)}"
                frozen[name] = ({"file": name, "source": os.path.abspath(source), "sha256": sha, "copy": copy}, raw)
    return list(frozen.values())


def suite_sources(base: Path) -> Callable[[str, Case], Path]:
    """Where a TOML suite's `file:` names are read from: relative to `base` (its lengths folder), or absolute."""
    return lambda name, case: Path(name) if Path(name).is_absolute() else base / name


def run_sources(folder: Path, entries: list[Entry], where: str) -> Callable[[str, Case], Path]:
    """Where a run folder's `file:` names are read from, for a run of its pairs (a repro): its frozen copies, checked."""
    by_name = entries_by_name(entries, where)
    return lambda name, case: frozen_path(folder, _entry(by_name, name, case, where), case.id)


def entries_by_name(entries: list[Entry], where: str) -> dict[str, Entry]:
    """The manifest's frozen files by the name the cases give; UserError naming the field of one that lacks what is read."""
    for i, entry in enumerate(entries):
        missing = next((k for k in ("file", "source", "sha256", "copy") if not isinstance(entry.get(k), str)), None)
        if missing:
            raise UserError(f"{where}: field '{FROZEN}[{i}].{missing}' is not a string: the manifest is damaged")
    return {entry["file"]: entry for entry in entries}


def _entry(by_name: Mapping[str, Entry], name: str, case: Case, where: str) -> Entry:
    if name not in by_name:
        raise UserError(f"{where}: case {case.id} draws from lengths file {name}, which field '{FROZEN}' does not list: the manifest is damaged")
    return by_name[name]


def frozen_path(folder: Path, entry: Entry, case_id: str) -> Path:
    """The file to read a run's lengths file from: its frozen copy, else its source while that is as it was; else why not, in one line."""
    copy, source, then = Path(folder) / FROZEN / entry["copy"], Path(entry["source"]), entry["sha256"]
    copy_now = _digest(copy)
    if copy_now == then:
        return copy
    now = _digest(source)
    if now == then:
        return source
    shown = f"{FROZEN}/{entry['copy']}"
    if copy_now is not None:
        raise UserError(f"{folder}: the frozen copy {shown} of lengths file {source}, which case {case_id} was built from, has changed "
                        f"since the run (sha256 {then[:SHOWN]}… then, {copy_now[:SHOWN]}… now)")
    if now is None:
        raise UserError(f"{folder}: the run folder's frozen copy {shown} of lengths file {source}, which case {case_id} was built from, "
                        f"is missing, and {source} is gone too")
    raise UserError(f"{folder}: the lengths file {source} that case {case_id} was built from has changed since the run "
                    f"(sha256 {then[:SHOWN]}… then, {now[:SHOWN]}… now) and the run folder's frozen copy {shown} is missing")


def check_cases(folder: Path, entries: list[Entry], cases: Iterable[Case], where: str) -> None:
    """UserError unless every case drawn from a lengths file holds the lengths its frozen copy draws from its seed."""
    by_name = entries_by_name(entries, where)
    paths: dict[str, Path] = {}
    for case in dict.fromkeys(cases):
        names = file_names(case)
        for name in names:
            if name not in paths:
                paths[name] = frozen_path(folder, _entry(by_name, name, case, where), case.id)
        if names and parse_batch(case.length_dist, files=paths).draw(case.seed, case.B) != (case.seq_lens_q, case.seq_lens_kv):
            raise UserError(f"{where}: case {case.id} holds lengths that its frozen lengths files do not draw from seed {case.seed}: "
                            "the manifest is damaged")


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
