"""How much evidence a gate (`compare --fail-above`, `regress`) needs to pass: `--min-judged N|P%`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import UserError

#: `--min-judged`'s default: a gate passes only when at least half of the pairs both runs measured were judged (the rest
#: contended, suspect or throttled): "2 of 18 judged, none slower" says little about the 16 others.
DEFAULT_MIN_JUDGED = "50%"


@dataclass(frozen=True)
class MinJudged:
    """How many judged pairs a gate needs to pass: a count, or a share of the pairs both runs measured `ok`."""

    count: int | None = None
    share: float | None = None

    def required(self, measured: int) -> int:
        """Judged pairs needed out of `measured` pairs both runs measured."""
        if self.count is not None:
            return self.count
        return math.ceil((self.share or 0.0) * measured - 1e-9)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{100 * (self.share or 0.0):g}%"


def parse_min_judged(text: str) -> MinJudged:
    """`--min-judged`: `N` (a count of judged pairs) or `P%` (a share of the pairs both runs measured); UserError otherwise."""
    raw = str(text).strip()
    if raw.endswith("%"):
        try:
            share = float(raw[:-1]) / 100.0
        except ValueError:
            share = math.nan
        if not 0.0 <= share <= 1.0:
            raise UserError(f"--min-judged takes a count like 10 or a share from 0% to 100% like 50%: got {text!r}")
        return MinJudged(share=share)
    if not raw.isdigit():
        raise UserError(f"--min-judged takes a count like 10 or a share from 0% to 100% like 50%: got {text!r}")
    return MinJudged(count=int(raw))
