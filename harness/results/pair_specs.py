"""A manifest's pairs as data (`pair_specs`), checked one way for every reader of a run: resume, db add, export, report, recommend.

Kept out of harness.results.documents: the case modules import that one, so it can build no Case.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.errors import UserError
from harness.results.documents import Manifest
from harness.results.record import pair_key
from harness.suite.cases import OPTIONAL_FLOAT_FIELDS, Case, case_from_fields


def pair_cases(manifest: Manifest, where: Path | str) -> list[tuple[Case, str]] | None:
    """Every pair of `pair_specs` as (Case, backend), in run order, each a case that can exist and the pair `pairs` names at its
    place; UserError naming `where` and the field otherwise; None for a manifest written before it held its pairs as data.

    Every reader of a run checks this the same way (resume, db add, export, report, recommend)."""
    if manifest.pair_specs is None:
        return None
    keys, specs = manifest.pairs, manifest.pair_specs
    if len(specs) != len(keys):
        raise UserError(f"{where}: field 'pair_specs' has {len(specs)} pairs and field 'pairs' {len(keys)}: the manifest is damaged")
    pairs = []
    for i, (key, spec) in enumerate(zip(keys, specs)):
        if "case" not in spec or "backend" not in spec:
            raise UserError(f"{where}: field 'pair_specs[{i}]' lacks {'case' if 'case' not in spec else 'backend'}")
        for name in OPTIONAL_FLOAT_FIELDS:  # NaN is how a CSV says "unset", never how a manifest does
            value = spec["case"].get(name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"{where}: field 'pair_specs[{i}].case.{name}' is {value!r}, not a finite number")
        try:
            case = case_from_fields(spec["case"])
        except (UserError, TypeError) as exc:
            raise UserError(f"{where}: field 'pair_specs[{i}].case' is not a case ({exc})") from None
        if pair_key(case, spec["backend"]) != key:
            raise UserError(f"{where}: field 'pair_specs[{i}]' is pair {pair_key(case, spec['backend'])!r}, "
                            f"but field 'pairs' says {key!r}: the manifest is damaged")
        pairs.append((case, spec["backend"]))
    return pairs
