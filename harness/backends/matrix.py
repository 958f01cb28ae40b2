"""The capability matrix: what each backend serves of each feature, per device and dtype, and every refusal's reason.

Each cell asks the backend itself (`Backend.refusals`: its declarations and its own limits) about a small example case
that uses one feature's value (harness.backends.features: `Feature.example`) in one dtype on one device. Nothing is
run and nothing needs the library or the GPU: on a CPU the answer is what the backend would do on a GPU, where a
library's rules depend on the GPU generation, for any GPU it supports (FlashAttention's rules with the GPU unknown).
A case is tried in a few shapes (attention heads of 128, MLA's latent cache; pages of 64 and 256 tokens): a backend
serves the feature when it serves one of them, and a refusal gives the reasons of the shape it came closest to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from harness.backends import features as feature_table
from harness.backends.features import Feature
from harness.errors import UserError
from harness.suite.batch_axes import ragged_case
from harness.results.documents import CAPABILITIES
from harness.suite.case_values import DTYPES
from harness.suite.cases import Case

if TYPE_CHECKING:  # this module imports no torch: the report renders a run's matrix without it
    from harness.backends.base import Backend

#: The matrix of a run's backends, as text, in its run folder (the report's environment section shows it).
MATRIX_FILE = CAPABILITIES
#: The matrix's columns: every dtype a case may have.
DTYPE_COLUMNS = tuple(DTYPES)
#: The shapes a cell's case is tried in: plain attention heads, and MLA's latent cache (H_kv 1, d_c 512 + d_rope 64).
SHAPES: tuple[dict[str, Any], ...] = (
    {"H": 8, "H_kv": 8, "d_k": 128, "d_v": 128, "causal": True},
    {"H": 16, "H_kv": 1, "d_k": 576, "d_v": 512, "causal": True, "mla": True},
)
#: Each shape's batch: dense (B, S_q, S_kv), and a ragged batch's description (harness.suite.batch).
DENSE_SIZES = ({"B": 2, "S_q": 128, "S_kv": 128}, {"B": 2, "S_q": 1, "S_kv": 256})
RAGGED_BATCHES = ("2x128", "2x1@256")
#: Page sizes a paged case is tried with (FlashMLA pages by 64 tokens, FlashAttention 2 by multiples of 256).
PAGE_SIZES = (64, 256)
#: The row of a case that asks for no feature.
PLAIN = ("plain", "plain")


@dataclass(frozen=True)
class Cell:
    """One backend's answer for one feature value in one dtype on one device."""

    device: str
    feature: str
    value: str
    dtype: str
    #: "yes" (served), "no" (refused, with its reasons) or "n/a" (no case asks for this: the Case's own rule in `reasons`).
    status: str
    reasons: tuple[str, ...] = ()
    #: The id of the example case the answer is for.
    case_id: str | None = None


@dataclass(frozen=True)
class BackendCapabilities:
    """One backend's rows of the matrix, with whether it can run on this machine."""

    name: str
    family: str
    devices: tuple[str, ...]
    available: bool
    unavailable_reason: str | None
    cells: tuple[Cell, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form `backends --matrix --json` prints."""
        return asdict(self)


def matrix_rows(features: Iterable[Feature] | None = None) -> list[tuple[str, str]]:
    """The matrix's rows, (feature, value): the plain case, then each value a feature's example can ask for."""
    rows = [PLAIN]
    for feature in feature_table.FEATURES if features is None else features:
        if feature.example is None:
            continue
        rows += [(feature.name, value) for value in feature.values if (feature.name, value) != ("layout", "dense")]
    return rows


def example_cases(device: str, dtype: str, fields: Mapping[str, Any]) -> list[Case] | str:
    """The example cases asking for `fields` in `dtype` on `device`, one per shape and page size, or the Case's refusal of all."""
    cases: list[Case] = []
    refusal = ""
    layout = fields.get("layout", "dense")
    for shape, dense, batch in zip(SHAPES, DENSE_SIZES, RAGGED_BATCHES):
        common = {**shape, **fields, "dtype": dtype, "device": device}
        for page_size in (PAGE_SIZES if layout == "paged" else (None,)):
            try:
                if layout == "dense":
                    cases.append(Case(**dense, **common))
                else:
                    rest = {k: v for k, v in common.items() if k not in ("H", "H_kv", "d_k", "d_v", "layout")}
                    cases.append(ragged_case(batch, layout, H=shape["H"], H_kv=shape["H_kv"], d_k=shape["d_k"], d_v=shape["d_v"],
                                             page_size=page_size, **rest))
            except UserError as exc:
                refusal = refusal or str(exc)
    return cases or refusal


def answer(backend: Backend, cases: list[Case]) -> tuple[str, tuple[str, ...], str | None]:
    """(status, reasons, case id): served when one case is, else the reasons of the case with the fewest."""
    best: tuple[tuple[str, ...], str] | None = None
    for case in cases:
        try:
            reasons = tuple(backend.refusals(case))
        except Exception as exc:  # noqa: BLE001 - a plugin's probe that crashes answers for itself, in its cell
            reasons = (f"its refusal check failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",)
        if not reasons:
            return "yes", (), case.id
        if best is None or len(reasons) < len(best[0]):
            best = (reasons, case.id)
    assert best is not None
    return "no", best[0], best[1]


def backend_capabilities(backend: Backend, available: str | None, features: list[Feature],
                         cases: dict[tuple[str, str, str, str], list[Case] | str]) -> BackendCapabilities:
    """One backend's cells on each device it declares (`cases`: the example cases, shared by every backend)."""
    cells = []
    by_name = {feature.name: feature for feature in features}
    for device in backend.devices:
        for name, value in matrix_rows(features):
            for dtype in DTYPE_COLUMNS:
                key = (device, name, value, dtype)
                if key not in cases:
                    fields = {} if (name, value) == PLAIN else dict(by_name[name].example(value))  # type: ignore[misc]
                    cases[key] = example_cases(device, dtype, fields)
                examples = cases[key]
                if isinstance(examples, str):
                    cells.append(Cell(device, name, value, dtype, "n/a", (examples,)))
                    continue
                status, reasons, case_id = answer(backend, examples)
                cells.append(Cell(device, name, value, dtype, status, reasons, case_id))
    return BackendCapabilities(backend.name, backend.family, tuple(backend.devices), available is None, available, tuple(cells))


def capability_matrix(registry: Any, features: list[Feature] | None = None, *, names: Iterable[str] | None = None,
                      availability: bool = True) -> list[BackendCapabilities]:
    """Every registered backend's capabilities (or those `names`), in the registry's order; a plugin that failed to load is
    listed without cells. `availability`: ask each backend whether it runs here (seconds: some import their library)."""
    features = feature_table.FEATURES if features is None else features
    wanted = None if names is None else set(names)
    cases: dict[tuple[str, str, str, str], list[Case] | str] = {}
    rows = []
    described = {info.name: info for info in registry.describe()} if availability else {}
    for backend in registry:
        if wanted is not None and backend.name not in wanted:
            continue
        info = described.get(backend.name)
        reason = info.reason if info is not None and not info.available else None
        rows.append(backend_capabilities(backend, reason, features, cases))
    for name, reason in registry.failures().items():
        if wanted is None or name in wanted:
            rows.append(BackendCapabilities(name, "plugin", (), False, reason))
    return rows


SYMBOLS = {"yes": "✓", "n/a": "·"}
COLUMN = 12


def _label(feature: str, value: str, groups: Mapping[str, str]) -> str:
    """A row's label: the value alone where it names itself ("softcap"), else the feature's heading and the value."""
    return value if feature in ("plain", value) else f"{groups.get(feature) or feature}: {value}"


def _device_grids(row: BackendCapabilities, notes: dict[str, int]) -> list[tuple[str, dict[str, dict[str, str]]]]:
    """Each device's grid of marks (label → dtype → mark), devices with the same grid merged ("cpu, cuda")."""
    groups = {feature.name: feature.group for feature in feature_table.FEATURES}
    grids: list[tuple[str, dict[str, dict[str, str]]]] = []
    for device in row.devices:
        grid: dict[str, dict[str, str]] = {}
        for cell in (cell for cell in row.cells if cell.device == device):
            mark = SYMBOLS.get(cell.status) or "✗" + ",".join(map(str, sorted(notes.setdefault(reason, len(notes) + 1)
                                                                                for reason in cell.reasons)))
            grid.setdefault(_label(cell.feature, cell.value, groups), {})[cell.dtype] = mark
        same = next((i for i, (_, other) in enumerate(grids) if other == grid), None)
        if same is None:
            grids.append((device, grid))
        else:
            grids[same] = (f"{grids[same][0]}, {device}", grid)
    return grids


def render(matrix: list[BackendCapabilities], *, markdown: bool = False, availability: bool = True) -> str:
    """The matrix as text (or Markdown): per backend and device rows × dtypes, ✓ served, ✗n refused for reasons n, · no such case."""
    out = []
    for row in matrix:
        state = "" if not availability else (" — available here" if row.available else f" — not available here: {row.unavailable_reason}")
        title = f"{row.name} ({row.family})"
        out.append(f"### {title}{state}\n" if markdown else f"{title}{state}")
        notes: dict[str, int] = {}
        for devices, grid in _device_grids(row, notes):
            if markdown:
                out.append(f"| {devices} | " + " | ".join(DTYPE_COLUMNS) + " |")
                out.append("|---" * (len(DTYPE_COLUMNS) + 1) + "|")
                out += [f"| {label} | " + " | ".join(marks[d] for d in DTYPE_COLUMNS) + " |" for label, marks in grid.items()]
                out.append("")
            else:
                width = max(len(label) for label in [devices, *grid]) + 2
                out.append(f"  {devices:<{width}}" + "".join(f"{d:<{COLUMN}}" for d in DTYPE_COLUMNS).rstrip())
                out += [f"  {label:<{width}}" + "".join(f"{marks[d]:<{COLUMN}}" for d in DTYPE_COLUMNS).rstrip() for label, marks in grid.items()]
        for reason, number in notes.items():
            out.append(f"{number}. {reason.replace('<', '&lt;')}" if markdown else f"  ✗{number} {reason}")
        out.append("")
    return "\n".join(out)
