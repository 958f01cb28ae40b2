"""Suites: a named, readable declaration of a grid of cases and the backends to run on them.

Built-in suites are modules in the `suites` package that define `SUITE`; a user's own suite is a
TOML file with the same fields, validated with errors that name the field and the value.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import os
import pkgutil
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from harness.compat import tomllib
from harness.suite.batch_axes import check_axes, ragged_cases
from harness.suite.case_layout import DENSE_ONLY, DRAWN_FIELDS, RAGGED_FIELDS, RAGGED_LAYOUTS
from harness.suite.case_values import VALUE_CHECKS
from harness.suite.cases import CASE_FIELDS, Case, grid
from harness.errors import UserError
from harness.suite.budget import CUDA_BUDGET, QUICK_BUDGET, Budget, budget_from_fields
from harness.suite.batch_files import lengths_folder
from harness.files import read_regular
from harness.suite.presets import CPU_SEQ, DEFAULT_SEQ, get_preset, model_cases, tp_note


@dataclass(frozen=True)
class Suite:
    """A sweep: its cases, the backends it runs (None = every registered one) and its time budget."""

    name: str
    description: str
    cases: tuple[Case, ...]
    backends: tuple[str, ...] | None = None
    budget: Budget = QUICK_BUDGET
    tags: tuple[str, ...] = field(default_factory=tuple)
    #: The smaller grid the same suite runs on a CPU (None: `cases` on any device), and its budget there.
    cpu_cases: tuple[Case, ...] | None = None
    cpu_budget: Budget | None = None
    #: A suite whose cases mean something on a CUDA GPU only (`published`: each a figure measured on one): on a CPU its
    #: cases stay on CUDA, so each pair is answered unsupported with why (execution.execute.missing_device), never shrunk.
    cuda_only: bool = False

    @property
    def slug(self) -> str:
        """The suite's name made safe for a folder name or run id (see `suite_slug`): 'GQA sweep' → 'GQA-sweep'."""
        return suite_slug(self.name)

    def pairs(self, backend_names: Iterable[str]) -> list[tuple[Case, str]]:
        """Every (case, backend) pair in a stable order: cases outer, backends inner."""
        names = list(backend_names)
        return [(case, name) for case in self.cases for name in names]

    def backend_names(self, requested: Iterable[str] | None, registered: Iterable[str]) -> list[str]:
        """The backends to run: those asked for, else the suite's own list, else every registered one."""
        if requested:
            return list(requested)
        return list(self.backends) if self.backends else list(registered)

    def on_device(self, device: str) -> "Suite":
        """The same suite with every case moved to `device` (a `cuda_only` suite's stay); on the CPU, its `cpu_cases` when it has them."""
        cpu = device == "cpu"
        cases = self.cpu_cases if cpu and self.cpu_cases is not None else self.cases
        budget = self.cpu_budget if cpu and self.cpu_budget is not None else self.budget
        moved = cases if self.cuda_only else tuple(c.replace(device=device) for c in cases)
        return Suite(self.name, self.description, moved, self.backends, budget, self.tags, cuda_only=self.cuda_only)


#: The suite name that picks the suite for the device: `default` on a GPU, `quick` on a CPU.
AUTO = "auto"


def resolve_suite_name(name: str, device: str) -> str:
    """The suite `name` stands for on `device` (only `auto` depends on it)."""
    if name == AUTO:
        return "default" if device == "cuda" else "quick"
    return name


def suite_on_device(name: str, device: str) -> Suite:
    """The suite `name` (`auto` included) as it runs on `device`: on a CPU its CPU grid and budget where it has them.

    `run`, `check` and `pytest suites/` all pick a suite's cases here, so that none of them hands a CPU
    machine the CUDA grid of a built-in suite.
    """
    return load_suite(resolve_suite_name(name, device)).on_device(device)


#: The longest slug: a run id adds a timestamp and a process id, and a folder name stops at 255 bytes.
SLUG_MAX = 64
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def suite_slug(name: str) -> str:
    """A suite name as ASCII letters, digits, '.', '-' and '_', for a run id or a folder: never empty, at most SLUG_MAX characters.

    Accents are dropped (`Über` → `Uber`), every run of other characters becomes one '-', the slug starts with a
    letter or digit and does not end with '-' or '.' ('GQA sweep' → 'GQA-sweep', '../x' → 'x', '' → 'suite'):
    a valid run id on its own (`results.store.validate_run_id`).
    """
    ascii_name = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode("ascii")
    slug = _SLUG_UNSAFE.sub("-", ascii_name)[:SLUG_MAX].lstrip("-._").rstrip("-.")
    return slug or "suite"


def builtin_suites() -> list[str]:
    """Names of the suites shipped in the `suites` package (module `serving_quick` is the suite `serving-quick`)."""
    import suites

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(suites.__path__) if not m.name.startswith(("_", "test_", "conftest")))


def _tp_list(spec: str, text: str) -> tuple[int, ...]:
    """The tensor-parallel degrees of `tp=1,8` in a model suite's spec; UserError in one line for anything else."""
    try:
        tps = tuple(int(t) for t in text.removeprefix("tp=").split(","))
    except ValueError:
        tps = ()
    if not tps or any(t < 1 for t in tps):
        raise UserError(f"model suite {spec!r}: --tp takes positive integers such as 1,2,4,8, got {text.removeprefix('tp=')!r}")
    return tuple(dict.fromkeys(tps))


def model_suite(spec: str) -> Suite:
    """The suite `model:<name>[:<S>,<S>…][:tp=<N>,<N>…]`: a preset's prefill (fwd, causal) and decode cases in bf16 on CUDA.

    On a CPU the same heads run in fp32, at S = 128 by default or at the lengths given. With `tp=`, each degree's
    per-GPU shapes (H/TP query heads, H_kv/TP KV heads or one replicated: `presets.tp_heads`), said in the description.
    """
    parts = spec.split(":")
    tps = _tp_list(spec, parts.pop()) if len(parts) > 2 and parts[-1].startswith("tp=") else (1,)
    if len(parts) not in (2, 3) or parts[0] != "model":
        raise UserError(f"model suite {spec!r}: expected model:<name>[:<S>,<S>,…][:tp=<N>,…]")
    preset = get_preset(parts[1])
    notes = [tp_note(preset, tp) for tp in tps]  # refuses a TP that does not divide H, in one line, before any case is built
    seq, cpu_seq = DEFAULT_SEQ, CPU_SEQ
    if len(parts) == 3:
        try:
            seq = tuple(int(s) for s in parts[2].split(",") if s)
        except ValueError:
            raise UserError(f"model suite {spec!r}: sequence lengths must be integers") from None
        if not seq or any(s <= 0 for s in seq):
            raise UserError(f"model suite {spec!r}: give positive sequence lengths")
        too_long = [s for s in seq if s > preset.context]
        if too_long:
            raise UserError(f"model suite {spec!r}: {preset.name}'s context is {preset.context:,} tokens; "
                            f"{', '.join(f'{s:,}' for s in too_long)} is longer")
        cpu_seq = seq  # asked for by name: the CPU runs those lengths too, not its default
    tp_name = "" if tps == (1,) else "-tp" + "-".join(map(str, tps))
    tp_text = "" if tps == (1,) else "; per GPU: " + "; ".join(notes)
    return Suite(
        name=f"model-{preset.name}{tp_name}",
        description=f"{preset.name} ({preset.source}): prefill and decode at S {', '.join(map(str, seq))}{tp_text}",
        cases=tuple(dict.fromkeys(c for tp in tps for c in model_cases(preset, seq, device="cuda", tp=tp))),
        cpu_cases=tuple(dict.fromkeys(c for tp in tps for c in model_cases(preset, cpu_seq, dtype="fp32", device="cpu", tp=tp))),
        budget=CUDA_BUDGET, cpu_budget=QUICK_BUDGET,
    )


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, `model:<preset>[:<S>,…][:tp=<N>,…]` (harness.suite.presets), or a TOML file; UserError for anything else."""
    if name_or_path.startswith("model:"):
        return model_suite(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise UserError(f"no suite given (got {name_or_path!r}): name a built-in suite ({', '.join(builtin_suites())}) or a .toml file")
    path = Path(name_or_path)
    # A folder that happens to share a built-in suite's name is not a suite file; a folder named x.toml is refused by name.
    if path.suffix == ".toml" or path.is_file():
        return suite_from_toml(path)
    if name_or_path not in builtin_suites():
        raise UserError.unknown("suite", name_or_path, builtin_suites(), f"built-in suites are {', '.join(builtin_suites())}, or give a .toml file")
    module = importlib.import_module(f"suites.{name_or_path.replace('-', '_')}")
    suite = getattr(module, "SUITE", None)
    if not isinstance(suite, Suite):
        raise UserError(f"suites/{name_or_path}.py defines no SUITE")
    return suite


#: The most cases a TOML suite may declare (summed over its grids), and the largest suite file: each far past any real sweep.
MAX_SUITE_CASES = 100_000
MAX_SUITE_BYTES = 4 * 2**20

#: The fields a suite sets once for all its grids, beside its own (name, description, ...).
_SUITE_FIELDS = ("device", "seed")
_TOP_KEYS = {"name", "description", "backends", "budget", "grid", *_SUITE_FIELDS}
#: A [[grid]] table's axes are the Case's fields (and S for S_q = S_kv) but the suite's and a batch's;
#: a grid of batches of requests (harness.suite.batch) takes a batch instead of the fields its lengths set or a dense case's own.
_GRID_KEYS = {"S", *CASE_FIELDS} - {*_SUITE_FIELDS, "layout", *RAGGED_FIELDS}
_BATCH_KEYS = {"batch", *CASE_FIELDS} - {*_SUITE_FIELDS, *DRAWN_FIELDS, *DENSE_ONLY}
#: A field's type (its annotation's text) as a suite file writes its values; an optional field also takes "none"
#: (but page_size, whose None is the layout's: no pages).
_FIELD_TYPES = {f.name: f.type.removesuffix(" | None") for f in dataclasses.fields(Case)} | {"S": "int"}
_OPTIONAL = {f.name for f in dataclasses.fields(Case) if f.type.endswith(" | None")} - set(RAGGED_FIELDS)


def _as_list(where: str, key: str, value: Any) -> list:
    """An axis's values as a list, each checked against its field's type (and the field's own value check) and
    "none" (and, for a window, 0: no window) read as None; UserError naming the field and the value."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UserError(f"{where}: field {key!r} is an empty list")
    kind = _FIELD_TYPES[key]
    out = []
    for v in values:
        if key in _OPTIONAL and (v == "none" or (key == "window" and v == 0)):
            v = None
        elif key == "H_kv" and v == "H":  # grid's own word for H_kv = H
            pass
        elif kind == "bool" and not isinstance(v, bool):
            raise UserError(f"{where}: field {key!r} has value {v!r}, expected true or false")
        elif kind == "str" and not isinstance(v, str):
            raise UserError(f"{where}: field {key!r} has value {v!r}, expected a string")
        elif kind == "int" and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise UserError(f"{where}: field {key!r} has value {v!r}, expected a positive integer")
        elif kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise UserError(f"{where}: field {key!r} has value {v!r}, expected a number")
        elif key in VALUE_CHECKS:
            try:
                VALUE_CHECKS[key](v)
            except UserError as exc:
                raise UserError(f"{where}: field {key!r} has value {v!r} ({exc})") from None
        out.append(v)
    return out


def _batch_axes(where: str, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A batch grid's axes, validated: descriptions (their `file:` paths read relative to the suite's folder), layouts, page sizes."""
    unknown = set(spec) - _BATCH_KEYS
    if unknown:
        raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r} in a batch grid (known: {', '.join(sorted(_BATCH_KEYS))})")
    axes = {key: _as_list(where, key, value) for key, value in spec.items() if key not in ("batch", "layout")}
    batches = spec["batch"] if isinstance(spec["batch"], list) else [spec["batch"]]
    layouts = spec.get("layout", list(RAGGED_LAYOUTS))
    layouts = layouts if isinstance(layouts, list) else [layouts]
    if not batches or not all(isinstance(b, str) for b in batches):
        raise UserError(f"{where}: field 'batch' has value {spec['batch']!r}, expected batch descriptions such as '2x2048 + 32x1@1024'")
    if not layouts or any(layout not in RAGGED_LAYOUTS for layout in layouts):
        raise UserError(f"{where}: field 'layout' has value {spec.get('layout')!r}, expected some of {', '.join(RAGGED_LAYOUTS)}")
    for required in ("H", "d_k"):
        if required not in axes:
            raise UserError(f"{where}: missing field {required!r}")
    try:
        check_axes(batches, layouts, axes.get("page_size"), {**axes, "base": folder})
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return {**axes, "batch": batches, "layout": layouts, "folder": folder}


def _batch_grid(device: str, seed: int, *, batch: list, layout: list, folder: Path, page_size: list = (16,), **axes: list) -> list[Case]:
    """The cases of one batch grid: every batch in every layout (paged at each page size) for every combination of the other axes."""
    names = list(axes)
    cases: list[Case] = []
    for values in itertools.product(*(axes[name] for name in names)):
        fields = dict(zip(names, values))
        fields["H_kv"] = fields["H"] if fields.get("H_kv", "H") == "H" else fields["H_kv"]
        cases += ragged_cases(batch, layout, page_sizes=page_size, base=folder, device=device, seed=seed, **fields)
    return cases


def suite_from_toml(path: Path) -> Suite:
    """Parse and validate a TOML suite file (see suites/example.toml)."""
    if not os.path.lexists(path):
        raise UserError(f"suite file {path} does not exist")
    if path.is_dir():
        raise UserError(f"suite file {path} is a directory, not a TOML file")
    raw = read_regular(path, "TOML file", MAX_SUITE_BYTES)  # a FIFO is refused, not waited on
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a TOML file (byte {exc.start} is not UTF-8 text)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UserError(f"{path}: not valid TOML (nested too deep: a suite is tables of flat lists)") from None
    where = str(path)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    grids = data.get("grid")
    if isinstance(grids, dict):
        grids = [grids]
    if grids is not None and (not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids)):
        raise UserError(f"{where}: field 'grid' has value {grids!r}, expected [[grid]] tables of axes (see suites/example.toml)")
    if not grids:
        raise UserError(f"{where}: no [[grid]] table: a suite needs at least one grid")
    device = data.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"{where}: field 'device' has value {device!r}, expected 'cpu' or 'cuda'")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"{where}: field 'seed' has value {seed!r}, expected a non-negative integer")
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise UserError(f"{where}: field {key!r} has value {data[key]!r}, expected a string")
    cases: list[Case] = []
    grid_axes = []
    size = 0
    for index, spec in enumerate(grids):
        gwhere = f"{where} grid #{index + 1}"
        if "batch" in spec:
            axes = _batch_axes(gwhere, spec, lengths_folder(path))
            size += math.prod(len(v) for k, v in axes.items() if k != "folder")  # an upper bound, as below
            if size > MAX_SUITE_CASES:
                raise UserError(f"{where}: its grids hold up to {size:,} cases by grid #{index + 1}, more than the {MAX_SUITE_CASES:,} a suite may have")
            grid_axes.append((gwhere, axes))
            continue
        unknown = set(spec) - _GRID_KEYS
        if unknown:
            raise UserError(f"{gwhere}: unknown field {sorted(unknown)[0]!r} (known: {', '.join(sorted(_GRID_KEYS))})")
        axes = {key: _as_list(gwhere, key, value) for key, value in spec.items()}
        for required in ("B", "H", "d_k"):
            if required not in axes:
                raise UserError(f"{gwhere}: missing field {required!r}")
        size += math.prod(len(values) for values in axes.values())  # an upper bound: H_kv values that divide no H drop out
        if size > MAX_SUITE_CASES:  # counted before any case is built: 10^8 cases would take most of an hour and 40 GB
            raise UserError(f"{where}: its grids hold up to {size:,} cases by grid #{index + 1} (the product of each grid's axis lengths), "
                            f"more than the {MAX_SUITE_CASES:,} a suite may have: split it into smaller suites")
        grid_axes.append((gwhere, axes))
    for gwhere, axes in grid_axes:
        try:
            cases.extend(_batch_grid(device, seed, **axes) if "batch" in axes else grid(device=device, seed=seed, **axes))
        except UserError as exc:
            raise UserError(f"{gwhere}: {exc}") from None
    backends = data.get("backends")
    if backends is not None and (not isinstance(backends, list) or not backends or not all(isinstance(b, str) for b in backends)):
        raise UserError(f"{where}: field 'backends' has value {backends!r}, expected a non-empty list of names")
    repeated = sorted({b for b in backends or () if backends.count(b) > 1})
    if repeated:  # each would run, and be listed, twice
        raise UserError(f"{where}: field 'backends' names {', '.join(repeated)} more than once")
    budget_spec = data.get("budget", {})
    if not isinstance(budget_spec, dict):
        raise UserError(f"{where}: field 'budget' has value {budget_spec!r}, expected a [budget] table")
    # What the [budget] table leaves out is the device's: CUDA_BUDGET's on a GPU, QUICK_BUDGET's on the CPU.
    return Suite(
        name=str(data.get("name", path.stem)), description=str(data.get("description", "")),
        cases=tuple(dict.fromkeys(cases)), backends=tuple(backends) if backends else None,
        budget=budget_from_fields(budget_spec, where, CUDA_BUDGET), cpu_budget=budget_from_fields(budget_spec, where),
    )
