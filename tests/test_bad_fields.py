"""Fields that are well typed but meaningless, contradictory or out of range are refused by name, never dropped or believed.

Three tables: a TOML suite's batch-grid axes (a B beside batches that count their own requests, page sizes
beside no paged layout, a paged cache no tensor or block table can hold), refused when the suite is loaded;
a run folder's manifest and rows (a timer `run --timer` would refuse, a negative or non-finite position,
cool-down, energy or power), refused on read naming the file, the row and the field; and `compare`, which
warns, with the environments' differences, when NEW's rows were measured by another attnbench version or commit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.errors import UserError
from harness.results.documents import TIMERS
from harness.results.documents import Manifest
from harness.results.store import RECORDS, read_records
from harness.suite.catalog import load_suite
from tests.cli_runs import refused
from tests.run_folders import make_run

# -- 4: batch-grid axes a batch makes meaningless or contradicts ------------------------------------------------------

HEADS = "H = 2\nd_k = 16\n"
BATCH_GRIDS = [
    # id, the [[grid]] table's lines (beside H and d_k), words of the message
    ("B-beside-a-mixed-batch", 'batch = "2x128 + 8x1@256"\nB = 4\n', ["'B'", "4", "2x128 + 8x1@256"]),
    ("B-list-beside-one-counted-batch", 'batch = ["uniform(16,64)", "4x32@128"]\nB = [2, 8]\n', ["'B'", "4x32@128"]),
    ("B-beside-a-speculative-batch", 'batch = "16x4@2048"\nlayout = "paged"\nB = 3\n', ["'B'", "3", "16x4@2048"]),
    ("page-size-with-packed-only", 'batch = "4x32@128"\nlayout = "packed"\npage_size = 32\n', ["'page_size'", "32", "packed"]),
    ("page-sizes-with-padded-and-packed", 'batch = "4x32@128"\nlayout = ["padded", "packed"]\npage_size = [1, 64]\n',
     ["'page_size'", "[1, 64]"]),
    ("page-size-16-said-with-padded", 'batch = "uniform(8,64)"\nB = 2\nlayout = "padded"\npage_size = 16\n', ["'page_size'", "16"]),
    ("page-size-2-to-40", f'batch = "4x32@128"\nlayout = "paged"\npage_size = {2**40}\n', [f"page_size={2**40}", "32-bit"]),
    ("page-size-just-past-int32", f'batch = "2x1@8"\nlayout = "paged"\npage_size = {2**31}\n', [f"page_size={2**31}"]),
    ("page-count-past-int32", 'batch = "2x1@2000000000"\nlayout = "paged"\npage_size = 1\n', ["page_size=1", "4,000,000,000 pages"]),
    ("paged-cache-past-int64", f'batch = "4x1"\nlayout = "paged"\npage_size = {2**30}\n', [f"page_size={2**30}", "2^63 - 1"],
     "H = 65536\nd_k = 65536\n"),
]


def _batch_suite(tmp_path: Path, grid: str, heads: str = HEADS) -> Path:
    path = tmp_path / "serving.toml"
    path.write_text(f'name = "serving"\nbackends = ["naive"]\n[[grid]]\n{grid}{heads}')
    return path


@pytest.mark.parametrize("entry", ["load_suite", "cli"])
@pytest.mark.parametrize("row", BATCH_GRIDS, ids=[r[0] for r in BATCH_GRIDS])
def test_a_batch_grid_axis_that_cannot_mean_what_it_says_is_refused_at_load(tmp_path, capsys, row, entry):
    _, grid, words, *heads = row
    suite = _batch_suite(tmp_path, grid, *heads)
    if entry == "load_suite":
        with pytest.raises(UserError) as caught:
            load_suite(str(suite))
        message = str(caught.value)
        assert "\n" not in message and "serving.toml grid #1" in message, message
        for word in words:
            assert word in message, (word, message)
    else:
        refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--quiet"], ["serving.toml", *words])
        assert not (tmp_path / "out").exists()  # refused before any work


# -- 7: manifest and row fields out of range ----------------------------------------------------------------------------

def _set_manifest(run: Path, **fields) -> None:
    path = run / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _set_row(run: Path, row: int, **fields) -> None:
    """Change fields of one row (1-based) of the run's records.jsonl, NaN and infinities written as JSON's readers take them."""
    path = run / RECORDS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[row - 1].update(fields)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


MANIFEST_TIMERS = ["Events", "graphs", "", "events ", "kernel", "cuda-events"]
ROW_FIELDS = [
    # field, value
    ("order_in_case", -1), ("order_in_case", "-2"), ("order_in_case", -2**40),
    ("cooldown_s", -0.1), ("cooldown_s", math.nan), ("cooldown_s", math.inf), ("cooldown_s", -math.inf), ("cooldown_s", "-5"),
    ("energy_mj_per_call", -1), ("avg_power_w", math.nan), ("gflop_per_joule", -0.5), ("gpu_power_w_mean", -30.0),
    ("energy_calls", -3), ("energy_counter_updates", -1), ("energy_window_s", math.inf),
]


@pytest.mark.parametrize("timer", MANIFEST_TIMERS)
def test_a_manifest_timer_run_would_refuse_is_refused_on_read(tmp_path, capsys, timer):
    run = make_run(tmp_path / "r1")
    _set_manifest(run, timer=timer)
    refused(capsys, ["report", str(run), "--out", str(tmp_path / "reports")], ["manifest.json", "'timer'", repr(timer), "events, kernels, graph"])
    # Every choice of `run --timer` reads back.
    assert all(Manifest.from_dict({"run_id": "r1", "timer": t}, "manifest.json").options.timer == t for t in TIMERS)


@pytest.mark.parametrize("entry", ["read_records", "report"])
@pytest.mark.parametrize("name, value", ROW_FIELDS, ids=[f"{n}={v!r}" for n, v in ROW_FIELDS])
def test_a_negative_or_non_finite_row_field_is_refused_naming_file_row_and_field(tmp_path, capsys, name, value, entry):
    run = make_run(tmp_path / "r1")
    _set_row(run, 3, **{name: value})
    words = [str(run / RECORDS) + ":3:", f"field {name!r}", "non-negative"]
    if entry == "read_records":
        with pytest.raises(UserError) as caught:
            read_records(run)
        message = str(caught.value)
        assert "\n" not in message, message
        for word in words:
            assert word in message, (word, message)
    else:
        refused(capsys, ["report", str(run), "--out", str(tmp_path / "reports")], words)


# -- 7: compare warns when NEW was measured by another attnbench ------------------------------------------------------

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
IDENTITIES = [
    # id, NEW's (harness_version, harness_commit) per row (BASE: 0.5.0 at COMMIT_A on every row), words of the warning
    ("another-version", [("0.6.0", COMMIT_A)] * 4, ["harness_version: 0.5.0 → 0.6.0"]),
    ("another-commit", [("0.5.0", COMMIT_B)] * 4, [f"harness_commit: {COMMIT_A} → {COMMIT_B}"]),
    ("both", [("0.6.0", COMMIT_B)] * 4, ["harness_version: 0.5.0 → 0.6.0", f"harness_commit: {COMMIT_A} → {COMMIT_B}"]),
    ("resumed-at-another-commit", [("0.5.0", COMMIT_A)] * 2 + [("0.5.0", COMMIT_B)] * 2, [f"{COMMIT_A}, {COMMIT_B}"]),
    ("a-dev-version-on-one-row", [("0.5.0", COMMIT_A)] * 3 + [("0.5.0.dev1", COMMIT_A)], ["0.5.0, 0.5.0.dev1"]),
]


def _identify(run: Path, identities: list[tuple[str, str]]) -> None:
    for row, (version, commit) in enumerate(identities, start=1):
        _set_row(run, row, harness_version=version, harness_commit=commit)


@pytest.mark.parametrize("identities, words", [r[1:] for r in IDENTITIES], ids=[r[0] for r in IDENTITIES])
def test_compare_warns_when_new_rows_name_another_harness(tmp_path, capsys, identities, words):
    base, new = make_run(tmp_path / "base"), make_run(tmp_path / "new")
    _identify(base, [("0.5.0", COMMIT_A)] * 4)
    _identify(new, identities)
    assert main(["compare", str(base), str(base), "--out", str(tmp_path / "same.csv")]) == 0
    assert "another attnbench" not in capsys.readouterr().out  # the same attnbench: nothing to say
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "cmp.csv")]) == 0
    warned = [line for line in capsys.readouterr().out.splitlines() if "another attnbench" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: "), warned
    for word in words:
        assert word in warned[0], (word, warned[0])
