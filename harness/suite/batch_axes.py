"""The checks of a batch grid's axes against its batches: an axis a batch makes meaningless is refused, not dropped.

A suite file's batch grid is checked at load (`harness.suite.catalog`), before any case is drawn, so a file
that asks for page sizes with no paged layout, or a B beside batches that count their own requests, stops
with one line naming the field, rather than running a sweep other than the one written.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from harness.errors import UserError
from harness.suite.batch import parse_batch


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
