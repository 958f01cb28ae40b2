"""Strict JSON for every `--json` output: a number that is not finite (NaN, ±inf) is written as null, never as `NaN`.

Python's json module writes `NaN` and `Infinity` by default, which jq, JavaScript's JSON.parse and every strict parser
refuse. A pandas frame's missing value is a float NaN (or pd.NA, NaT), so a document built from rows carries them;
`clean` turns each into None, numpy scalars into Python's, and `dumps` refuses anything else that is not JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any


def clean(value: Any) -> Any:
    """`value` with every non-finite float, pandas missing value and numpy scalar made plain JSON (None, int, float, bool)."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, (str, int, float, bool)) and k is not None else k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [clean(v) for v in value]
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas is a dependency; the check only needs it when present
        pass
    return str(value)  # a path, a timestamp, a dtype: as the commands printed them before (default=str)


def dumps(document: Any, indent: int | None = 1) -> str:
    """`document` as strict JSON text (`clean`, then json.dumps with allow_nan=False)."""
    return json.dumps(clean(document), indent=indent, allow_nan=False)
