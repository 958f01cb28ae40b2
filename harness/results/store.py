"""Records: one per (case, backend), appended to `results/<run-id>/records.jsonl` and loaded into pandas.

The schema is versioned; `upgrade()` brings older records forward on load (pyperf's habit).
Numbers are stored at full precision; only reports round.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from harness.suite.cases import CASE_FIELDS, CASE_FIELDS_ADDED, OPTIONAL_FLOAT_FIELDS
from harness.env import harness_identity
from harness.errors import UserError
from harness.files import MAX_RECORD_BYTES, lines_of, open_regular
from harness.results.record import COLUMNS, RAW_COLUMNS, SCHEMA_VERSION, Record

if TYPE_CHECKING:  # pandas is imported where frames are built, not by every writer of a record
    import pandas as pd

RECORDS = "records.jsonl"
RECORDS_CSV = "records.csv"


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version to the current one (version 1 is the first)."""
    version = record.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UserError(f"record has schema_version {version!r}, expected a positive integer")
    if version > SCHEMA_VERSION:
        raise UserError(f"record has schema version {version}, newer than this attnbench ({SCHEMA_VERSION}): upgrade attnbench")
    if "case_id" in record and "B" in record and "layout" not in record:
        # Written before batches of requests existed: a dense case, whose layout fields are all unset.
        record = {**record, "layout": "dense", **{name: None for name in LAYOUT_FIELDS if name not in record}}
    return record


#: The case fields a batch of requests added; a record written before them is a dense case without them.
LAYOUT_FIELDS = ("page_size", "length_dist", "seq_lens_q", "seq_lens_kv")


def write_file(path: Path | str, data: str | bytes) -> None:
    """Write a file whole beside `path` and rename it over `path`: a reader never sees half of it, and no other name of the old
    file changes (a hard link to it keeps its bytes). Never through a symbolic link at `path` (it could point at any file)."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(link_refusal(path))
    mode = 0o644
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)  # a replaced file keeps its permissions
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def link_refusal(path: Path) -> str:
    """The one line that refuses to write through the symbolic link at `path`."""
    return (f"{path} is a symbolic link: attnbench writes its files in place, never through a link "
            "(it may point at any file); replace it with a copy of its target, or write elsewhere")


def resolved(path: Path | str, flag: str) -> Path:
    """`path` made absolute with its links followed; UserError naming `flag` for a link loop."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # Python < 3.13 raises RuntimeError("Symlink loop …")
        raise UserError(f"{flag} {path}: cannot follow its symbolic links ({exc})") from None


def run_folder_of(path: Path) -> Path | None:
    """The run folder that `path` (absolute) is or lies inside, or None.

    A run folder holds records.jsonl, or a manifest.json that reads as an attnbench run's: results a
    report or a comparison must never write into.
    """
    from harness.results.documents import MANIFEST, Manifest, read_document

    for folder in (path, *path.parents):
        if os.path.lexists(folder / RECORDS):
            return folder
        if os.path.isfile(folder / MANIFEST):
            try:
                if read_document(folder / MANIFEST, Manifest).run_problem() is None:
                    return folder
            except UserError:
                continue  # another tool's manifest.json
    return None


class RunWriter:
    """Appends records to a run's JSONL one line at a time, flushed and fsynced, so a kill loses nothing finished."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS

    def append(self, record: Record) -> None:
        """Write one record as one line, saying what measured it; O_APPEND keeps lines from concurrent workers whole."""
        for name, value in harness_identity().items():
            if getattr(record, name) is None:
                setattr(record, name, value)
        line = json.dumps(record.to_dict(), separators=(",", ":"), default=str) + "\n"
        # Never through a link (ELOOP): the supervisor refuses linked files up front with a clearer line.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        data = line.encode()
        try:
            written = os.write(fd, data)
            if written != len(data):  # a file size limit or a full disk cut the line: say so, never carry on silently
                raise OSError(errno.EFBIG, f"only {written} of {len(data)} bytes of a record could be written")
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ReadResult:
    """Records read from a JSONL file, and whether a truncated last line was dropped."""

    records: list[dict[str, Any]]
    dropped_partial_line: bool
    #: The file read (None when built by hand).
    path: Path | None = None
    #: Each record as the `Record` its check built (None for one that carries only its keys, as a hand-written one may).
    built: tuple[Record | None, ...] = ()
    #: The length of the file's whole lines: what is left after a truncated last line is cut off.
    whole_bytes: int = 0
    #: Rows of the file that a re-measure of their pair replaced (or a failed re-measure that left the first row
    #: standing): kept in the file as evidence, left out of `records` so that every reader sees one row per pair.
    superseded: tuple[dict[str, Any], ...] = ()

    def remeasured_keys(self) -> set[str]:
        """The pairs (`<case id>-<backend>`) the file holds a re-measure of, whether or not it replaced the first row."""
        return {f"{r.get('case_id')}-{r.get('backend')}" for r in (*self.records, *self.superseded) if r.get("remeasured_from")}

    def typed(self) -> list[Record]:
        """The records as `Record`s, each built once when it was read; UserError naming the file and record of one that is not whole."""
        built = self.built or (None,) * len(self.records)
        return [record if record is not None else Record.from_dict(data, where=f"{self.path}: record {i}")
                for i, (data, record) in enumerate(zip(self.records, built), start=1)]

    @property
    def dropped_message(self) -> str | None:
        """One line for the user when a truncated last line was dropped, else None."""
        if not self.dropped_partial_line:
            return None
        return f"{self.path or RECORDS}: dropped a truncated last line (a run stopped mid-write); resume the run to redo that pair"


#: Record fields that, when present (always, in a record attnbench writes), are strings: what compare and report join and print on.
KEY_FIELDS = ("case_id", "backend", "status")


def _checked(record: dict[str, Any]) -> tuple[str | None, Record | None]:
    """What is wrong with a record (in words naming the field) or None, and the Record it makes, built once.

    Key fields are non-empty strings. The case's fields are all there or none is (a record written by hand,
    for a test, may carry only its keys: it makes no Record); a whole record has every field of the type
    `Record` declares, and its case fields together make a valid Case.
    """
    for name in KEY_FIELDS:
        if name in record and (not isinstance(record[name], str) or not record[name]):
            return f"field {name!r} has value {record[name]!r}, expected a non-empty string", None
    present = [name for name in CASE_FIELDS if name in record]
    if not present:
        return None, None
    missing = [name for name in CASE_FIELDS if name not in record and name not in CASE_FIELDS_ADDED]
    if missing:
        return f"record has no field {missing[0]!r} (a record carries all its case's fields: {', '.join(CASE_FIELDS)})", None
    for name in OPTIONAL_FLOAT_FIELDS:  # NaN means "unset" only in a CSV; a record says unset with null
        value = record.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            return f"field {name!r} is {value!r}, not a finite number (an unset {name} is null)", None
    try:
        return None, Record.from_dict(record, where="record")  # every column's type, and its case, as the one Record definition declares them
    except UserError as exc:
        return str(exc).removeprefix("record: "), None


def record_problem(record: dict[str, Any]) -> str | None:
    """What a records file's reader would refuse in this parsed record (in words naming the field), or None: the check every
    reader of records makes, wherever the record was kept (a records file, the results database)."""
    try:
        record = upgrade(record)
    except UserError as exc:
        return str(exc)
    return _checked(record)[0]


def read_records(path: Path | str) -> ReadResult:
    """Read a records file, one row per pair and run (a re-measure replaces its first row: `superseded_positions`); a truncated
    last line (a kill mid-write) is dropped, any other bad line is an error naming it.

    An empty file has no records (a run killed before its first one). A line must be a JSON object whose
    case_id, backend and status are strings and whose case fields are typed as a Case's; the error says
    file:line and the field. The file is streamed: a line longer than MAX_RECORD_BYTES is refused (dropped when it is the
    cut last one: a crash can leave gigabytes of NUL bytes in a preallocated file) without ever being held whole.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS
    if not path.exists():
        raise UserError(f"no records file at {path}")
    records: list[dict[str, Any]] = []
    built: list[Record | None] = []
    dropped = False
    whole_bytes = 0
    with open_regular(path, "records file") as f:
        try:
            for number, (line, size, ended) in enumerate(lines_of(f, MAX_RECORD_BYTES), start=1):
                if isinstance(line, str) and ended:
                    raise UserError(f"{path}:{number}: corrupt record ({line})")
                record = None if isinstance(line, str) else _record_of_line(line, path, number, cut=not ended)
                if record is None and not ended and (isinstance(line, str) or line.strip()):
                    dropped = True  # the last line, cut short by a kill mid-write: that pair is redone on resume
                    break
                if ended:
                    whole_bytes += size
                if record is not None:
                    problem, typed = _checked(record)
                    if problem is not None:
                        raise UserError(f"{path}:{number}: {problem}")
                    records.append(record)
                    built.append(typed)
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    shown, gone = superseded_positions(records)
    kept = [shown[slot] for slot in sorted(shown)]
    return ReadResult([records[i] for i in kept], dropped, path, tuple(built[i] for i in kept), whole_bytes,
                      tuple(records[i] for i in sorted(gone)))


def _record_of_line(line: bytes, path: Path, number: int, cut: bool) -> dict[str, Any] | None:
    """The record a line holds, upgraded; None for a blank line, or for the cut last line (`cut`) that is no JSON."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; absurd nesting a RecursionError
        if cut:
            return None
        reason = exc if isinstance(exc, ValueError) else "nested too deep"
        raise UserError(f"{path}:{number}: corrupt record ({reason})") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}:{number}: corrupt record (a {type(record).__name__}, not a JSON object)")
    try:
        return upgrade(record)
    except UserError as exc:
        raise UserError(f"{path}:{number}: {exc}") from None


def superseded_positions(records: list[dict[str, Any]]) -> tuple[dict[int, int], set[int]]:
    """Which row each pair's place shows, and the rows set aside: one row per pair and run for every reader.

    A row carrying `remeasured_from` (a pair measured again at the end of its sweep, harness.run.remeasure) takes the
    place of the row of its run and pair before it when it is `ok` or that row is not, so readers keep the run's order;
    a re-measure that failed (a crash, an oom) leaves the measured row standing and is itself set aside. Rows of a pair
    with no re-measure are all kept, as they always were (a report over several runs chooses among them:
    harness.analysis.frame.one_row_per_pair). Returns {place: position of the row shown there} and the set-aside positions.
    """
    place_of: dict[tuple[Any, Any, Any], int] = {}
    shown: dict[int, int] = {}
    gone: set[int] = set()
    for position, record in enumerate(records):
        key = (record.get("run_id"), record.get("case_id"), record.get("backend"))
        place = place_of.get(key)
        if record.get("remeasured_from") and place is not None:
            if record.get("status") == "ok" or records[shown[place]].get("status") != "ok":
                gone.add(shown[place])
                shown[place] = position
            else:
                gone.add(position)
        else:
            place_of[key] = shown[position] = position
    return shown, gone


def load_run(*run_dirs: Path | str) -> pd.DataFrame:
    """Load one or more runs into one pandas DataFrame, with every column of the schema present.

    `frame.attrs["dropped_partial_lines"]` lists the records files whose truncated last line was dropped
    (`ReadResult.dropped_message` words it), so that a report can say so.
    """
    results = [read_records(run_dir) for run_dir in run_dirs]
    frame = records_frame([record for result in results for record in result.typed()])
    frame.attrs["dropped_partial_lines"] = [str(result.path) for result in results if result.dropped_partial_line]
    return frame


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    """Typed records as one pandas DataFrame, every column of the schema present, in the schema's order."""
    import pandas as pd

    frame = pd.DataFrame([record.to_dict() for record in records])
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    return frame[[*COLUMNS, *[c for c in frame.columns if c not in COLUMNS]]]


def as_csv_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its structured columns as JSON text, as every CSV of records writes them: notes, the sequence lengths."""
    frame = frame.copy()
    for column in ("notes", "remeasured_from"):
        if column in frame.columns:
            frame[column] = frame[column].map(lambda n: json.dumps(n, sort_keys=True) if isinstance(n, dict) else n)
    for column in ("seq_lens_q", "seq_lens_kv"):  # JSON lists, as the JSONL has them
        if column in frame.columns:
            frame[column] = frame[column].map(lambda n: json.dumps(list(n)) if isinstance(n, (list, tuple)) else n)
    return frame


def write_csv(run_dir: Path | str, records: Iterable[Record] | None = None) -> Path:
    """Write `records.csv` beside the JSONL: the flat columns, raw samples left out (they stay in the JSONL).

    `records`: the folder's records where the caller has just read them (else the JSONL is read here).
    """
    run_dir = Path(run_dir)
    frame = load_run(run_dir) if records is None else records_frame(records)
    frame = as_csv_cells(frame.drop(columns=[c for c in RAW_COLUMNS if c in frame.columns]))
    out = run_dir / RECORDS_CSV
    write_file(out, frame.to_csv(index=False))
    return out


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: A folder name stops at 255 bytes on Linux, macOS and Windows file systems.
RUN_ID_MAX_BYTES = 255


def validate_run_id(run_id: str) -> str:
    """A run id is a plain folder name: letters, digits, dot, dash, underscore; starting with a letter or digit
    (so never '.', '..' or a hidden folder), no '/', at most 255 bytes."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        shown = repr(run_id) if len(repr(run_id)) <= 80 else repr(run_id)[:77] + "..."
        raise UserError(f"invalid run id {shown}: use letters, digits, '.', '-' and '_', starting with a letter or digit")
    if len(run_id.encode()) > RUN_ID_MAX_BYTES:
        raise UserError(f"invalid run id {run_id[:40]!r}... ({len(run_id.encode())} bytes): a folder name has at most {RUN_ID_MAX_BYTES}")
    return run_id
