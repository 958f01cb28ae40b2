"""Where the real H200 measurements are (shared/data/h200-2026-11-29, beside the repository or a folder above it), and their rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
_NAME = Path("shared") / "data" / "h200-2026-11-29"
#: The folder of H200 evidence, or None on a machine that has no copy of shared/.
H200 = next((parent / _NAME for parent in _ROOT.parents if (parent / _NAME).is_dir()), None)

needs_h200 = pytest.mark.skipif(H200 is None, reason="the H200 measurements (shared/data/h200-2026-11-29) are not on this machine")


def h200_records() -> list[dict]:
    """Every record of the H200 slice (132 pairs, 84 ok with their raw `sample_ms`)."""
    with gzip.open(H200 / "records.jsonl.gz", "rt") as lines:
        return [json.loads(line) for line in lines]
