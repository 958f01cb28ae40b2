"""The documents of a run folder beside its records (manifest.json, env.json, peaks.json), typed and read one way.

Every reader goes through `read_document`: it opens only regular files (`open()` on a FIFO blocks
until a writer comes, which may be never), refuses JSON that is truncated or nested past the
parser's depth, and type-checks the fields attnbench reads, naming the file and the field, as
`Record.from_dict` does for records. Fields nobody reads are kept as they are (`extra`), so a newer
writer's or the Ray executor's additions pass through to `to_dict()` untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

from harness.env import DEVICE_KEYS, IDENTITY_KEYS, VERSION_KEYS
from harness.errors import UserError
from harness.files import MAX_DOCUMENT_BYTES, parse_json, read_regular
# The field checks live apart, in harness.results.field_checks, so that the run options check theirs the same way.
from harness.results.field_checks import (Check, _boolean, _count, _device, _number, _object, _plain_name, _positive, _scalar,
                                    _string, fields_of, list_of, object_of, optional)
from harness.results.run_options import TIMERS, RunOptions  # noqa: F401 - TIMERS re-exported: run --timer's choices

MANIFEST = "manifest.json"
ENV = "env.json"
PEAKS = "peaks.json"
#: What each of a run's backends serves, per feature and dtype, with every refusal's reason (harness.backends.matrix writes it).
CAPABILITIES = "capabilities.txt"
#: What a manifest written by attnbench says in its `harness` field (runs written before it existed have none).
HARNESS = "attnbench"
# -- the documents ----------------------------------------------------------------------------------------------------

D = TypeVar("D", bound="Document")


@dataclass
class Document:
    """A run folder's JSON object: the fields a reader uses, typed; the others in `extra`."""

    extra: dict[str, Any] = field(default_factory=dict)
    #: The typed fields the file itself had (the others hold their defaults and are not written back).
    given: frozenset[str] = frozenset()

    #: Fields a document of this kind always has.
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls: type[D], data: Any, where: Path | str) -> D:
        """The document from its parsed JSON; UserError naming `where` and the field of anything mistyped."""
        where = str(where)
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected a JSON object, got {_json_kind(data)}")
        missing = [name for name in cls.REQUIRED if name not in data]
        if missing:
            raise UserError(f"{where}: field {missing[0]!r} is missing")
        checks = cls.checks()
        values = {name: checks[name](value, where, name) for name, value in data.items() if name in checks}
        return cls(**values, extra={k: v for k, v in data.items() if k not in checks}, given=frozenset(values))

    @classmethod
    def checks(cls) -> dict[str, Check]:
        """Each typed field's check, by the field's name (declared once, with `typed`); a field left out of the file keeps its default."""
        return {f.name: f.metadata["check"] for f in fields(cls) if "check" in f.metadata}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object as read: the typed fields the file had, then the rest."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in self.given}
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


def typed(check: Check, default: Any = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A document field read from its JSON through `check`: its name is the attribute's, written once."""
    if factory is not None:
        return field(default_factory=factory, metadata={"check": check})
    return field(default=default, metadata={"check": check})


def _json_kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")


_CAPABILITIES = object_of(object_of(_boolean))
_ATTEMPT = fields_of(started_utc=_string, wall_s=_number)


#: The most fresh processes `attnbench stability` starts, and so the most medians a variation document holds.
MAX_VARIATION_PROCESSES = 1_000


@dataclass
class Manifest(Document):
    """manifest.json: what the run is (suite, device, backends, pairs) and who wrote it."""

    run_id: str = typed(_string, "")
    suite: str | None = typed(optional(_string))
    suite_arg: str | None = typed(optional(_string))
    suite_copy: str | None = typed(optional(_plain_name))
    device: str | None = typed(optional(_device))
    backends: list[str] = typed(list_of(_string), factory=list)
    broken: dict[str, str] = typed(object_of(_string), factory=dict)
    capabilities: dict[str, dict[str, bool]] = typed(_CAPABILITIES, factory=dict)
    pairs: list[str] = typed(list_of(_string), factory=list)
    #: What shapes the pairs' measurement (check, timer, energy, profile, traces, cool-down, order seed, budget), read
    #: from the keys RunOptions stores them under; those keys stay in `extra`, written back as they were.
    options: RunOptions = field(default_factory=RunOptions)
    created_utc: str | None = typed(optional(_string))
    attempts: list[dict[str, Any]] = typed(list_of(_ATTEMPT), factory=list)
    #: `attnbench` in every manifest written since it was added, and a random id given at creation.
    harness: str | None = typed(optional(_string))
    run_uuid: str | None = typed(optional(_string))
    #: Every pair as data, in the order of `pairs`: its case's fields (`Case.fields()`) and its backend. A folder
    #: made before they were recorded has none, and its pairs are rebuilt from its suite (harness.run.rundir).
    pair_specs: list[dict[str, Any]] | None = typed(optional(list_of(fields_of(case=_object, backend=_string))))
    #: What measured them.
    harness_version: str | None = typed(optional(_string))
    harness_commit: str | None = typed(optional(_string))
    harness_dirty: bool | None = typed(optional(_boolean))
    #: The interpreter that ran the run.
    python: str | None = typed(optional(_string))
    #: The lengths files its cases were drawn from, frozen in the folder: {file, source, sha256, copy} (harness.suite.batch_files).
    batches: list[dict[str, Any]] | None = typed(optional(list_of(fields_of(file=_string, source=_string, sha256=_string,
                                                                             copy=_plain_name))))
    #: How a CPU run given no `--threads` chose its thread count (harness.measure.threads.choose_threads): the count,
    #: torch's default, the cores and how many other work kept busy as the run started, and the rule. None: given, or CUDA.
    threads_chosen: dict[str, Any] | None = typed(optional(_object))

    REQUIRED = ("run_id",)
    #: What a run needs from its manifest to be resumed (or replaced by --force): every manifest a run ever wrote has them.
    RUN_FIELDS = ("suite_arg", "device", "backends", "pairs")

    @classmethod
    def from_dict(cls, data: Any, where: Path | str) -> "Manifest":
        """As `Document.from_dict`, with the run options read (and checked, naming `where` and the key) into `options`."""
        manifest = super().from_dict(data, where)
        manifest.options = RunOptions.from_manifest(data, where)
        return manifest

    def run_problem(self) -> str | None:
        """Why this manifest cannot be a run's (another tool's, or a run's without what resuming needs), or None."""
        if self.harness is not None and self.harness != HARNESS:
            return f"field 'harness' is {self.harness!r}, not {HARNESS!r}"
        missing = [name for name in self.RUN_FIELDS if name not in self.given or getattr(self, name) is None]
        return f"it lacks {', '.join(missing)}" if missing else None


def _telemetry(value: Any, where: str, name: str) -> Any:
    """NVML's readings per GPU (a list of objects), or an object saying why there are none."""
    if isinstance(value, list):
        return list_of(fields_of(index=optional(_count)))(value, where, name)
    return _object(value, where, name)


_TELEMETRY = optional(_telemetry)
# The fields the readers compare and show, typed (the names are harness.env's): strings, the identity's flag, scalars.
_FINGERPRINT = fields_of(**{k: optional(_string) for k in DEVICE_KEYS + IDENTITY_KEYS[:2]}, harness_dirty=optional(_boolean),
                         **{k: optional(_scalar) for k in VERSION_KEYS})


@dataclass
class Environment(Document):
    """env.json: the environment's fingerprint (`before`, read by reports and compare) and the GPU telemetry around the run.

    The fingerprint is taken once, before the first pair; what may change during a run (clocks, temperatures) is
    the telemetry, read again after the last pair.
    """

    # A null fingerprint reads as an empty one: every reader asks it for fields with .get().
    before: dict[str, Any] = typed(lambda v, where, name: {} if v is None else _FINGERPRINT(v, where, name), factory=dict)
    telemetry_before: list[dict[str, Any]] | dict[str, Any] | None = typed(_TELEMETRY)
    telemetry_after: list[dict[str, Any]] | dict[str, Any] | None = typed(_TELEMETRY)
    nodes: dict[str, dict[str, Any]] = typed(object_of(_object), factory=dict)


#: What a ceiling ran under, read by the analysis: a ceiling measured while contended is not called a bound, and a GPU
#: row's share is also read at its own SM clock against the clock its ceiling ran at.
_CEILING_STATE = {"contended": optional(_boolean), "sm_clock_mhz": optional(_positive), "mem_clock_mhz": optional(_positive)}
_MATMUL = fields_of(n=optional(_count), tflops=optional(_positive), tflops_median=optional(_positive), product=optional(_string), **_CEILING_STATE)
_COPY = fields_of(bytes=_count, gbps=optional(_positive), gbps_median=optional(_positive), **_CEILING_STATE)


@dataclass
class Peaks(Document):
    """peaks.json: the device's measured matmul ceilings per dtype and its copy bandwidth, or why they are missing."""

    device: str | None = typed(optional(_string))
    matmul: dict[str, dict[str, Any]] = typed(object_of(_MATMUL), factory=dict)
    copy: dict[str, Any] | None = typed(optional(_COPY))
    errors: dict[str, str] = typed(object_of(_string), factory=dict)


def read_document(path: Path | str, kind: type[D]) -> D:
    """The document at `path`, typed as `kind`; UserError (one line naming the file and the field) for anything else."""
    return kind.from_dict(parse_json(read_regular(path, "JSON document", MAX_DOCUMENT_BYTES), path), where=path)


def read_optional(path: Path | str, kind: type[D]) -> D | None:
    """As `read_document`, but None when there is no such file (older runs lack peaks.json, say)."""
    if not os.path.lexists(path):
        return None
    return read_document(path, kind)
