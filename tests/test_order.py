"""The run's order: drift cannot favour a backend, the order is recorded, and workers measure in it."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from harness.cli.main import main
from harness.run.order import backend_orders, fair_pairs, positions_in_case
from harness.suite.cases import grid
from harness.results.record import pair_key
from harness.suite.catalog import Suite
from tests.cli_runs import write_suite

BACKENDS = ["a", "b", "c", "d"]


def _suite(n_sizes: int) -> Suite:
    """Cases alternating causal and not (a period of 2 in the grid, which a plain rotation would alias with)."""
    cases = grid(B=[1], S=[16 * (i + 1) for i in range(n_sizes)], H=[2], d_k=[8], causal=[False, True], device="cpu")
    return Suite("drift", "", tuple(cases))


def _measured_under_drift(pairs: list, drift: float) -> dict[str, float]:
    """Each backend's mean measured cost when all cost 1.0 and every successive pair runs `drift` slower (a clock ramp)."""
    costs: dict[str, list[float]] = {}
    for t, (_, backend) in enumerate(pairs):
        costs.setdefault(backend, []).append(1.0 + drift * t)
    return {b: sum(v) / len(v) for b, v in costs.items()}


def _winners(pairs: list, drift: float) -> Counter:
    """How many cases each backend wins when the cheapest measured pair of a case wins."""
    best: dict[str, tuple[float, str]] = {}
    for t, (case, backend) in enumerate(pairs):
        best[case.id] = min(best.get(case.id, (float("inf"), "")), (1.0 + drift * t, backend))
    return Counter(b for _, b in best.values())


@pytest.mark.parametrize("k", [2, 3, 4])
def test_drift_favours_the_first_backend_in_the_suite_order_and_none_in_the_run_order(k):
    suite, drift = _suite(12), 0.01  # 24 cases: a whole number of blocks for k = 2, 3 and 4
    backends = BACKENDS[:k]
    fixed = suite.pairs(backends)
    fixed_means = _measured_under_drift(fixed, drift)
    # The suite's own order: the first backend is always cheapest, by (k - 1) pairs of drift, and wins every case.
    assert min(fixed_means, key=fixed_means.get) == backends[0]
    assert max(fixed_means.values()) - min(fixed_means.values()) == pytest.approx((k - 1) * drift)
    assert _winners(fixed, drift) == Counter({backends[0]: len(suite.cases)})
    fair = fair_pairs(fixed, seed=0)
    assert sorted(map(str, fair)) == sorted(map(str, fixed))  # the same pairs, reordered
    assert [c.id for c, _ in fair] == [c.id for c, _ in fixed]  # cases stay outer, in the suite's order
    means = _measured_under_drift(fair, drift)
    assert max(means.values()) - min(means.values()) < 1e-9
    assert _winners(fair, drift) == Counter({b: len(suite.cases) // k for b in backends})


def test_each_backend_takes_each_position_once_per_block_without_aliasing_the_grid():
    orders = backend_orders(40, BACKENDS, seed=3)
    for start in range(0, 40, 4):
        block = orders[start:start + 4]
        for position in range(4):
            assert sorted(order[position] for order in block) == BACKENDS
    # Cases alternate causal / not: no backend may own the first slot of the causal cases.
    causal_firsts = Counter(order[0] for order in orders[1::2])
    assert max(causal_firsts.values()) < 20
    assert backend_orders(40, BACKENDS, seed=3) == orders and backend_orders(40, BACKENDS, seed=4) != orders


def test_positions_count_within_each_case():
    pairs = fair_pairs(_suite(2).pairs(["a", "b", "c"]), seed=0)
    keys = [pair_key(c, b) for c, b in pairs]
    positions = positions_in_case(keys, {pair_key(c, b): (c, b) for c, b in pairs})
    assert [positions[k] for k in keys] == [0, 1, 2] * 4


@pytest.mark.slow
def test_the_manifest_and_the_records_carry_the_order_used(tmp_path, capsys):
    suite = write_suite(tmp_path / "two.toml", ["naive", "sdpa-math"], [8, 16, 24, 32])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "r", "--quiet", "--no-check", "--order-seed", "5"]) == 0
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["order"]["seed"] == 5 and "Latin-square" in manifest["order"]["scheme"]
    backends_in_order = [k.rsplit("-fp32-", 1)[1] for k in manifest["pairs"]]
    firsts = backends_in_order[::2]
    assert sorted(firsts) == ["naive", "naive", "sdpa-math", "sdpa-math"]  # each backend first in two of the four cases
    rows = read_records(tmp_path / "r").records
    # One worker: it measured the pairs in the manifest's order (pytest neither re-sorted them nor used the suite's).
    assert [f"{r['case_id']}-{r['backend']}" for r in rows] == manifest["pairs"]
    assert [r["order_in_case"] for r in rows] == [0, 1] * 4
    # --resume runs what is left in the same order: the manifest's, not the suite's.
    records = tmp_path / "r" / "records.jsonl"
    records.write_text("".join(records.read_text().splitlines(keepends=True)[:3]))
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    rows = read_records(records).records
    assert [f"{r['case_id']}-{r['backend']}" for r in rows] == manifest["pairs"] and [r["order_in_case"] for r in rows] == [0, 1] * 4


def test_a_bad_order_seed_is_one_line(tmp_path, capsys):
    assert main(["run", "--suite", "quick", "--out", str(tmp_path), "--order-seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--order-seed" in err and "non-negative integer" in err
