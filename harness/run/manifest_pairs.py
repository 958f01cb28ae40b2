"""A run's pairs and budget as its manifest holds them: written once at creation, read back by resume, workers and Ray.

The manifest holds every pair as data (its case's fields, all of them, and its backend) and the budget by
its fields (harness.results.run_options), so a run never depends on its suite again: a release that changes a built-in suite's grid
leaves older runs resumable. A folder made before this held only pair keys; its pairs are rebuilt from
its suite as that version did, and refused in one line when the suite no longer has them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.env import harness_identity
from harness.errors import UserError
from harness.measure.timing import Budget
from harness.results.documents import MANIFEST, Manifest
from harness.results.pair_specs import pair_cases
from harness.suite.batch_files import check_cases
from harness.suite.cases import Case
from harness.suite.catalog import Suite, load_suite
from harness.results.record import pair_key

Pairs = dict[str, tuple[Case, str]]


def pair_manifest(pairs: list[tuple[Case, str]]) -> dict[str, Any]:
    """The manifest's fields that let a run be resumed, reported and compared from its folder alone, whatever its suite becomes.

    Every pair as data (its case's fields, all of them, and its backend) in run order, and what measured it:
    generic over the dataclass, so a field added to `Case` travels too (the budget travels with the run options).
    """
    return {"pairs": [pair_key(case, backend) for case, backend in pairs],
            "pair_specs": [{"case": case.fields(), "backend": backend} for case, backend in pairs], **harness_identity()}


def run_pairs(manifest: Manifest, folder: Path, suite_arg: str) -> Pairs:
    """Every pair of the run in `folder` by key, in run order: from its manifest (an older folder's: from its suite)."""
    if manifest.pair_specs is None:
        return _pairs_from_suite(manifest, folder, suite_arg)
    where = folder / MANIFEST
    pairs: Pairs = {pair_key(case, backend): (case, backend) for case, backend in pair_cases(manifest, where) or ()}
    if manifest.batches is not None:  # the cases drawn from lengths files, checked against the copies frozen with the run
        check_cases(folder, manifest.batches, [case for case, _ in pairs.values()], str(where))
    return pairs


def suite_of_run(folder: Path, manifest: Manifest, suite_arg: str) -> Suite:
    """The pairs of the run in `folder` as a suite: its cases in run order, its backends and its budget, from its manifest alone.

    What a row's `repro` runs (`--suite <run folder>`): the pair is the one the row measured, whatever its suite has become since."""
    pairs = run_pairs(manifest, folder, suite_arg)
    cases = tuple(dict.fromkeys(case for case, _ in pairs.values()))
    return Suite(str(manifest.suite or folder.name), f"the pairs of run {manifest.run_id}", cases,
                 tuple(manifest.backends or dict.fromkeys(backend for _, backend in pairs.values())), run_budget(manifest, folder, suite_arg))


def run_budget(manifest: Manifest, folder: Path, suite_arg: str) -> Budget:
    """The budget the run's pairs are measured under: its manifest's (an older folder's: its suite's)."""
    budget = manifest.options.budget  # checked when the manifest was read
    return _old_suite(manifest, folder, suite_arg).budget if budget is None else budget


def _old_suite(manifest: Manifest, folder: Path, suite_arg: str) -> Suite:
    """The suite of a folder made before manifests held their pairs and budget (loaded again, as that version did)."""
    try:
        return load_suite(suite_arg).on_device(str(manifest.device))
    except UserError as exc:
        raise UserError(f"{folder}: this run was made by an attnbench that did not record its pairs, "
                        f"and its suite {suite_arg!r} no longer loads ({exc})") from None


def _pairs_from_suite(manifest: Manifest, folder: Path, suite_arg: str) -> Pairs:
    by_key = {pair_key(c, b): (c, b) for c, b in _old_suite(manifest, folder, suite_arg).pairs(manifest.backends)}
    missing = [k for k in manifest.pairs if k not in by_key]
    if missing:
        raise UserError(f"{folder / MANIFEST}: field 'pairs' lists {missing[0]!r}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, "
                        f"no pair of its suite {suite_arg!r} now: the run was made by an attnbench that did not record "
                        "its pairs, before its suite changed; finish it with the attnbench that made it")
    return {k: by_key[k] for k in manifest.pairs}
