"""Batch grids: the cases of batch descriptions in layouts, and the checks of a batch grid's axes against its batches.

The grammar of a batch (harness.suite.batch) knows nothing of a Case, so that the Case can check its own
lengths against it; the cases a batch makes live here, above both. A suite file's batch grid is checked
at load (`harness.suite.catalog`), before any case is drawn: an axis a batch makes meaningless is refused,
not dropped, so a file that asks for page sizes with no paged layout, or a B beside batches that count their
own requests, stops with one line naming the field, rather than running a sweep other than the one written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.errors import UserError
from harness.suite.batch import parse_batch
from harness.suite.cases import Case


def ragged_case(batch: str, layout: str, *, H: int, H_kv: int, d_k: int, d_v: int | None = None, B: int | None = None,
                page_size: int | None = None, base: Path | None = None, seed: int = 0, **fields) -> Case:
    """The Case of one batch description in one layout: lengths drawn from `seed`, B, S_q and S_kv derived from them.

    `fields` are the Case's other fields (dtype, device, causal, window, mode). `base` is where `file:`
    paths are read from.
    """
    parsed = parse_batch(batch, base)
    q, kv = parsed.draw(seed, B)
    return Case(B=len(q), S_q=max(q), S_kv=max(kv), H=H, H_kv=H_kv, d_k=d_k, d_v=d_k if d_v is None else d_v, layout=layout,
                page_size=page_size if layout == "paged" else None, seq_lens_q=q, seq_lens_kv=kv, length_dist=parsed.text, seed=seed,
                **fields)


def ragged_cases(batches, layouts, *, page_sizes=(16,), **fields) -> list[Case]:
    """Every (batch, layout) case, paged ones once per page size, in a stable order: the layouts of one batch side by side."""
    cases = []
    for batch in batches:
        for layout in layouts:
            for size in (page_sizes if layout == "paged" else (None,)):
                cases.append(ragged_case(batch, layout, page_size=size, **fields))
    return list(dict.fromkeys(cases))


def axis_text(values: Any) -> str:
    """An axis's values as a suite file writes them: one value bare, several as a list."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return str(values[0]) if len(values) == 1 else "[" + ", ".join(map(str, values)) + "]"


def check_axes(batches: Sequence[str], layouts: Sequence[str], page_sizes: Any, fields: Mapping[str, Any]) -> None:
    """UserError naming the field when page sizes (None: the file gave none) sit beside no paged layout, or a B beside a batch that counts its requests."""
    if "paged" not in layouts and page_sizes is not None:
        raise UserError(f"field 'page_size' has value {axis_text(page_sizes)}, but no layout is paged "
                        f"(layout {axis_text(layouts)}): a page size is the paged layout's only")
    B = fields.get("B")
    if B is None:
        return
    for batch in batches:
        parsed = parse_batch(batch, fields.get("base"), read=False)
        # A bare distribution takes B as its count; any other batch fixes its own, and B would be ignored.
        if parsed.terms[0].count is not None:
            raise UserError(f"field 'B' has value {axis_text(B)}, but batch {batch!r} counts its own requests ({parsed.requests()}): "
                            f"B is the count of a bare distribution such as 'uniform(64,512)'")
