"""The check of serving batches catches the ragged mutation set, in `run` (timed) and in `check` (untimed), with no false alarm.

Where it used to look away: a field of the batch a backend rebinds (only tensors were guarded, so the
next backend read the poisoned batch and was blamed), the dtype of what the call returned (judged
after the adapter's cast), requests the row sample never reached (uniform over the packed rows) and
calls other than the last timed one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.attention import reference
from harness.attention.reference import ragged_rows
from harness.backends.pytorch.naive import NaiveBackend
from harness.execution.execute import CHECK_ONLY, PairRunner, Phases
from harness.measure.timing import QUICK_BUDGET
from harness.results.record import Status
from harness.suite.batch_axes import ragged_case
from tests import wrong_ragged_backends as wr

#: Long prefills around decodes: large enough that the reference samples rows (over MAX_REFERENCE_SCORES).
MIXED = "8x1024 + 32x1@1024 + 8x1024"
SMALL = "2x24 + 3x1@40 + 2x8@32"
#: The wrong backends meet MIXED's shape at 1/8 of its lengths, with the reference's budget cut by the same 64 (the
#: `sampled_budget` fixture), so their rows are sampled exactly as MIXED's are (48 requests, both ends and interior rows):
#: at full size each pair computed 134 M scores in bf16 on the CPU, 40 s of a test, where what is tested is the sample.
SCALE = 8
MIXED_SCALED = "8x128 + 32x1@128 + 8x128"
#: A mixed batch still over the budget (its rows are sampled) with few requests, for the padded layout, which computes
#: every request at the longest length (48 x 128 x 128 scores a head for MIXED_SCALED, 6 x 192 x 192 for this).
MIXED_FOR_PADDING = "2x192 + 2x1@192 + 2x192"


def _cut_budget(monkeypatch) -> None:
    """The reference's row budget cut by SCALE², so MIXED_SCALED and MIXED_FOR_PADDING are sampled as MIXED is at full size."""
    monkeypatch.setattr(reference, "MAX_REFERENCE_SCORES", reference.MAX_REFERENCE_SCORES // SCALE**2)


@pytest.fixture
def sampled_budget(monkeypatch):
    """The reference's row budget cut by SCALE² for the whole test (see _cut_budget)."""
    _cut_budget(monkeypatch)


def _case(batch: str, layout: str = "packed", dtype: str = "fp32", page_size: int | None = None, causal: bool = True):
    return ragged_case(batch, layout, H=8, H_kv=2, d_k=16, dtype=dtype, causal=causal, page_size=page_size)


#: Each wrong backend with the batch that shows its fault.
MUTANTS = [
    (wr.RebindsKvLengths, _case(SMALL)),
    (wr.RebindsCausal, _case(SMALL)),
    (wr.RebindsPageSize, _case(SMALL, "paged", page_size=4)),
    (wr.Fp32CastBack, _case(SMALL, dtype="bf16")),
    (wr.WrongOnOneDecode, _case(MIXED_SCALED)),
    (wr.WrongInsideALongRequest, _case(MIXED_SCALED)),
    (wr.WrongOnEvenCalls, _case(SMALL)),
    (wr.PermutesQueriesAndBack, _case(SMALL)),
    # Issue 45's second ragged hidden set: the lengths rebound on a large mixed batch whose rows are sampled, and an fp32
    # result cast back by its adapter on a padded batch (its output has more elements than the packed rows checked).
    (wr.RebindsKvLengths, _case(MIXED_SCALED, dtype="bf16")),
    (wr.RebindsDecodeLengthWhilePreparing, _case(MIXED_SCALED, dtype="bf16")),
    (wr.Fp32CastBackPadded, _case(SMALL, "padded", dtype="bf16")),
    (wr.Fp32CastBackPadded, _case(MIXED_FOR_PADDING, "padded", dtype="bf16")),
]
RUN = Phases(memory=False)


def test_the_mutation_set_is_all_here():
    assert {cls for cls, _ in MUTANTS} == set(wr.WRONG_RAGGED)


def test_the_large_batches_are_the_ones_whose_rows_are_sampled(sampled_budget):
    for batch in (MIXED_SCALED, MIXED_FOR_PADDING):
        assert ragged_rows(_case(batch)) is not None, batch
    assert ragged_rows(_case(SMALL)) is None


def test_the_scaled_batch_is_sampled_as_the_full_size_one_is(monkeypatch):
    full = ragged_rows(_case(MIXED))
    _cut_budget(monkeypatch)
    scaled = ragged_rows(_case(MIXED_SCALED))
    assert full is not None and scaled is not None and len(full) == len(scaled) == reference.SAMPLED_ROWS

    def rows_per_request(rows, batch):
        starts = np.cumsum([0, *_case(batch).seq_lens_q])
        return [int(((rows >= a) & (rows < b)).sum()) for a, b in zip(starts[:-1], starts[1:])]

    assert rows_per_request(full, MIXED) == rows_per_request(scaled, MIXED_SCALED)  # every request, the same share


@pytest.mark.slow
@pytest.mark.parametrize("phases", [RUN, CHECK_ONLY], ids=["run", "check"])
@pytest.mark.parametrize("backend_cls, case", MUTANTS, ids=[f"{cls.name}-{case.layout}-{case.dtype}-B{case.B}" for cls, case in MUTANTS])
def test_every_wrong_ragged_backend_disagrees_and_the_next_backend_still_agrees(backend_cls, case, phases, one_thread, sampled_budget):
    runner = PairRunner(budget=QUICK_BUDGET, phases=phases)
    wrong = runner.run(case, backend_cls())
    assert wrong.status is Status.OK, wrong.reason
    assert wrong.agreement.agree is False, f"{backend_cls.name} passed: {wrong.agreement.check_note}"
    honest = runner.run(case, NaiveBackend())  # the same runner: its inputs cache is what a poisoned batch would reach
    assert honest.status is Status.OK and honest.agreement.agree is True, honest.agreement.check_note


@pytest.mark.parametrize("cls", wr.REBINDING, ids=lambda c: c.name)
def test_a_rebound_field_is_named_and_blamed_on_the_backend_that_rebound_it(cls, one_thread, sampled_budget):
    case = dict(MUTANTS)[cls]
    outcome = PairRunner(phases=CHECK_ONLY).run(case, cls())
    assert f"modified its inputs in place ({cls.field})" in outcome.agreement.check_note


@pytest.mark.parametrize("cls, layout", [(wr.Fp32CastBack, "packed"), (wr.Fp32CastBackPadded, "padded")])
def test_a_kernel_that_returns_fp32_for_a_bf16_case_is_named_though_its_adapter_casts_back(cls, layout, one_thread):
    outcome = PairRunner(phases=CHECK_ONLY).run(_case(SMALL, layout, dtype="bf16"), cls())
    assert "the call returned float32, not the case's bfloat16" in outcome.agreement.check_note


def test_a_timed_row_judges_two_calls_in_a_row(one_thread):
    outcome = PairRunner(phases=RUN).run(_case(SMALL), wr.WrongOnEvenCalls())
    assert outcome.measurement.stats.n > 1  # several calls timed: the fault is on one of the last two, whichever parity
    assert "carries state across calls" in outcome.agreement.check_note or "last timed call" in outcome.agreement.check_note


@pytest.mark.parametrize("batch", [MIXED, "300x64@4096", "4x2048 + 100x1@2048"])
def test_every_request_has_checked_rows_and_long_ones_have_inner_rows(batch):
    case = ragged_case(batch, "packed", H=32, H_kv=8, d_k=128)
    rows = ragged_rows(case)
    assert rows is not None  # these batches are over the reference's budget: the rows are sampled
    starts = np.cumsum([0, *case.seq_lens_q])
    per_request = [int(((rows >= a) & (rows < b)).sum()) for a, b in zip(starts[:-1], starts[1:])]
    assert min(per_request) >= 1
    assert all(int(starts[i + 1] - 1) in rows.tolist() for i in range(case.B))  # each request's last row
    assert len(set(rows.tolist())) == len(rows) and int(rows.max()) < int(starts[-1])
    longest = int(np.argmax(case.seq_lens_q))
    if 2 * case.B <= 128:
        assert per_request[longest] > 2  # its interior is sampled, not only its two ends


def test_the_sample_is_seeded():
    case = _case(MIXED)
    assert torch.equal(ragged_rows(case), ragged_rows(case))
