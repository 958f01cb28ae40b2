"""Which pairs a run measures (--only, --case) and in which order: cases outer, each case's backends in an order drift cannot favour.

A GPU warming up (its SM clock rose from 345 to 1980 MHz over one of our H200 sweeps), a CPU whose
noise drifts, a cache that fills: each makes a pair's cost depend on when it ran. Run every case's
backends in one fixed order and the first backend meets the same point of the drift in every case,
so one backend gains systematically. Cases stay outer: a case's inputs and its float64 reference
are shared by its backends (execution/shared_inputs.py, attention/reference.py).

The scheme is blocks of Latin squares. Every `k` consecutive cases (k = the number of backends) share
one seeded permutation of the backends, rotated by a different amount in each case, the rotations
themselves in a seeded order: within a block each backend runs once in each position, so under any
drift that is linear in position each backend's mean cost is the same, exactly, not only on
average as a plain shuffle gives. Seeding the permutation and the rotations (rather than rotating by
the case's index) keeps the order from aliasing with a period of the grid (causal and not
alternating, say, would otherwise always give one backend the first slot on causal cases). The seed
is recorded in the manifest and its default is fixed, so a run's order is reproducible.
"""

from __future__ import annotations

import random
from typing import Hashable, Sequence, TypeVar

from harness.errors import UserError
# The default seed and the scheme's name are the manifest's, kept with the run options.
from harness.results.run_options import DEFAULT_ORDER_SEED  # noqa: F401 - re-exported
from harness.suite.cases import Case
from harness.results.record import pair_key

Pair = tuple[Case, str]
T = TypeVar("T", bound=Hashable)


def backend_orders(n_cases: int, backends: Sequence[T], seed: int) -> list[list[T]]:
    """The order of `backends` in each of `n_cases` cases: seeded Latin-square blocks of len(backends) cases."""
    rng = random.Random(seed)
    k = len(backends)
    orders: list[list[T]] = []
    while len(orders) < n_cases:
        base = list(backends)
        rng.shuffle(base)
        shifts = list(range(max(k, 1)))
        rng.shuffle(shifts)
        orders.extend(base[s:] + base[:s] for s in shifts[: n_cases - len(orders)])
    return orders


def fair_pairs(pairs: Sequence[Pair], seed: int) -> list[Pair]:
    """`pairs` (cases outer, as Suite.pairs gives them) with each case's backends reordered by `backend_orders`."""
    by_case: dict[Case, list[str]] = {}
    for case, backend in pairs:
        by_case.setdefault(case, []).append(backend)
    names = list(dict.fromkeys(b for _, b in pairs))
    orders = backend_orders(len(by_case), names, seed)
    ordered: list[Pair] = []
    for (case, present), order in zip(by_case.items(), orders):
        ordered.extend((case, b) for b in order if b in present)
    return ordered


def positions_in_case(keys: Sequence[str], pairs: dict[str, Pair]) -> dict[str, int]:
    """Each pair key's position (0 = first) among its case's pairs in the run's order `keys`."""
    seen: dict[str, int] = {}
    positions: dict[str, int] = {}
    for key in keys:
        case_id = pairs[key][0].id
        positions[key] = seen.get(case_id, 0)
        seen[case_id] = positions[key] + 1
    return positions


def select_keys(pairs: Sequence[Pair], only: Sequence[str], case_ids: Sequence[str], suite_name: str) -> list[str]:
    """The keys of `pairs`, in order, whose key holds every `only` substring and whose case id is one of `case_ids` (when given).

    `--case` is exact where `--only` is a substring (`…-fp32` is inside `…-fp32-causal`): an id that is
    no case of the suite is refused by name, so a repro command never silently measures another pair.
    """
    known = {case.id for case, _ in pairs}
    unknown = [c for c in case_ids if c not in known]
    if unknown:
        raise UserError(f"--case {unknown[0]!r} is not a case of suite {suite_name!r} (case ids are what records' case_id holds)")
    keys = [pair_key(c, b) for c, b in pairs if (not case_ids or c.id in case_ids) and all(o in pair_key(c, b) for o in only)]
    if not keys:
        raise UserError(f"--only {','.join(only)} matches no pair of suite {suite_name!r}" if only else f"suite {suite_name!r} has no pairs")
    return keys
