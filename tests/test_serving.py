"""Batches of requests: the batch grammar, lengths files, ragged and paged inputs, per-request agreement, the executor's wiring, records, suites."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from harness.attention.eager import naive_attention
from harness.backends.base import Backend, Prepared
from harness.backends.ragged_views import padded, per_request, request_masks, requests
from harness.backends.registry import load_registry
from harness.errors import UserError
from harness.execution.execute import PairRunner, Phases, execute
from harness.measure.timing import Budget
from harness.results.record import Record, Status
from harness.results.store import RunWriter, load_run, read_records, write_csv
from harness.suite.batch import parse_batch, read_lengths_file
from harness.suite.batch_axes import ragged_case
from harness.suite.cases import Case
from harness.suite.catalog import load_suite
from harness.suite.ragged import RaggedInputs, gather_pages, make_ragged_inputs, page_rows
from tests.cli_runs import attnbench_in_process

ROOT = Path(__file__).resolve().parent.parent
TINY = Budget(warmup_s=0.0, measure_s=0.005, min_rounds=6, max_rounds=6, precision=0.0)


def ragged(batch="2x24 + 6x1@80", layout="packed", **kw):
    return ragged_case(batch, layout, **{"H": 4, "H_kv": 2, "d_k": 16, "causal": True, **kw})


# -- the grammar --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, canonical", [
    ("2x2048+32x1@1024", "2x2048 + 32x1@1024"),
    (" 4x512 @ 4096 ", "4x512@4096"),
    ("16x4@2048", "16x4@2048"),
    ("uniform( 64, 512 )", "uniform(64,512)"),
    ("longtail(16,4096,1.5)", "longtail(16,4096)"),
    ("8xlongtail(16,4096,1.10)", "8xlongtail(16,4096,1.1)"),
    ("32x1@bimodal(512,8192,0.250)", "32x1@bimodal(512,8192,0.25)"),
    ("8xconstant(256)@constant(1024)", "8x256@1024"),
])
def test_batches_have_one_canonical_text(text, canonical):
    assert parse_batch(text).text == canonical  # the one way a batch description is written
    assert parse_batch(canonical).text == canonical


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("2x", "length distribution '2x': expected N"),
    ("4x512@256", "attends over 256 keys, fewer than its 512 queries"),
    ("uniform(512,64)", "the lower bound 512 is above the upper bound 64"),
    ("uniform(1,2,3)", "takes 2 arguments, got 3"),
    ("bimodal(1,2,1.5)", "probability: '1.5' must be between 0 and 1"),
    ("normal(3,4)", "expected N or constant\\(N\\), uniform"),
    ("uniform(64,512) + 2x3", "needs a count"),
    ("0x5", "is not a positive integer"),
    ("2x1@file:/no/such/lengths.txt", "does not exist"),
])
def test_bad_batches_get_one_line_naming_the_term(text, message):
    with pytest.raises(UserError, match=message) as caught:
        parse_batch(text)
    assert "\n" not in str(caught.value)


def test_drawn_lengths_are_seeded_and_within_their_distribution():
    batch = parse_batch("50xuniform(10,20) + 50xlongtail(5,5000) + 400xbimodal(3,300,0.25)@uniform(100,200)")
    q, kv = batch.draw(seed=4)
    assert batch.draw(seed=4) == (q, kv) and batch.draw(seed=5) != (q, kv)
    assert all(10 <= n <= 20 for n in q[:50]) and len(set(q[:50])) > 5
    tail = np.asarray(q[50:100])
    assert tail.min() >= 5 and tail.max() <= 5000 and np.median(tail) < 20 < tail.max()  # most short, a few long
    modes = np.asarray(q[100:])
    assert set(modes) == {3, 300} and 0.15 < (modes == 300).mean() < 0.35
    # KV counts the queries too: drawn from uniform(100,200), raised to the request's Q where that is longer
    assert all((100 <= k <= 200 and k >= n) or k == n == 300 for n, k in zip(q[100:], kv[100:]))
    assert {k for n, k in zip(q[100:], kv[100:]) if n == 3} - set(range(100, 201)) == set()


def test_chunked_prefill_and_speculative_decoding_are_queries_over_a_longer_cache():
    chunk = ragged("4x512@4096", "packed")
    assert chunk.seq_lens_q == (512,) * 4 and chunk.seq_lens_kv == (4096,) * 4
    spec = ragged("16x4@2048", "paged", page_size=16)
    assert spec.causal and spec.seq_lens_q == (4,) * 16 and spec.S_kv == 2048


# -- a user's lengths file ----------------------------------------------------------------------------------------------

def test_a_lengths_file_is_read_as_a_histogram(tmp_path):
    path = tmp_path / "hist.txt"
    path.write_text("# production prompt lengths\n100 30\n\n2000 10   # long ones\n100\n")
    lengths = read_lengths_file(path)
    assert lengths.lengths == (100, 2000) and lengths.counts == (31, 10)
    q, _ = parse_batch(f"400xfile:{path}").draw(seed=1)
    assert set(q) == {100, 2000} and 0.6 < q.count(100) / 400 < 0.9


@pytest.mark.parametrize("text, message", [
    ("100\n200 3 4\n", "line 2: '200 3 4' is not 'length' or 'length count'"),
    ("100\n-5\n", "line 2: length: '-5' is not a positive integer"),
    ("100 x\n", "line 1: count: 'x' is not a positive integer"),
    ("# nothing\n", "holds no lengths"),
])
def test_a_bad_lengths_file_names_the_line(tmp_path, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        read_lengths_file(path)


def test_a_users_lengths_file_runs_and_agrees(tmp_path):
    (tmp_path / "lengths.txt").write_text("5 2\n37 1\n64 1\n")
    case = ragged_case("6xfile:lengths.txt", "paged", base=tmp_path, H=4, H_kv=2, d_k=16, causal=True, page_size=16, seed=2)
    assert set(case.seq_lens_q) <= {5, 37, 64} and case.length_dist == "6xfile:lengths.txt"
    record = execute(case, load_registry().get("naive"), PairRunner(budget=TINY))
    assert record.status is Status.OK and record.agree, record.reason


def test_a_toml_suite_runs_a_lengths_file_beside_it_in_every_layout(tmp_path):
    (tmp_path / "lengths.txt").write_text("24 40\n96 12\n")
    (tmp_path / "mine.toml").write_text('''
[[grid]]
batch = ["8xfile:lengths.txt", "2x64 + 8x1@file:lengths.txt"]
layout = ["padded", "packed", "paged"]
page_size = [1, 16]
H = [8]
H_kv = [2]
d_k = [32]
causal = [true]
''')
    suite = load_suite(str(tmp_path / "mine.toml"))
    assert len(suite.cases) == 2 * 4
    assert {c.layout for c in suite.cases} == {"padded", "packed", "paged"} and {c.page_size for c in suite.cases} == {None, 1, 16}
    assert all(set(c.seq_lens_kv) <= {24, 64, 96} for c in suite.cases)


@pytest.mark.parametrize("grid, message", [
    ('batch = ["8x5"]\nlayout = ["tiled"]\nH = [8]\nd_k = [32]', "field 'layout' has value ['tiled'], expected some of padded, packed, paged"),
    ('batch = ["8x5"]\nS = [128]\nH = [8]\nd_k = [32]', "unknown field 'S' in a batch grid"),
    ('batch = ["8xfile:nowhere.txt"]\nH = [8]\nd_k = [32]', "nowhere.txt does not exist"),
])
def test_a_bad_batch_grid_names_the_field(tmp_path, grid, message):
    (tmp_path / "bad.toml").write_text("[[grid]]\n" + grid + "\n")
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_suite(str(tmp_path / "bad.toml"))


# -- inputs ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 64, 128, 256])
def test_paged_inputs_scatter_the_cache_and_hold_the_packed_tokens(page_size):
    case = ragged("3x7@300 + 2x1@129", "paged", page_size=page_size, seed=3)
    inputs = make_ragged_inputs(case)
    assert inputs.q.shape == (3 * 7 + 2, 4, 16) and inputs.k.shape == (3 * 300 + 2 * 129, 2, 16)
    assert inputs.cu_seqlens_kv.tolist() == [0, 300, 600, 900, 1029, 1158]
    pages = [-(-n // page_size) for n in case.seq_lens_kv]
    table = inputs.block_table
    assert table.shape == (5, max(pages)) and inputs.k_pages.shape == (sum(pages), page_size, 2, 16)
    used = torch.cat([table[i, :n] for i, n in enumerate(pages)])
    assert sorted(used.tolist()) == list(range(sum(pages)))  # every page used once
    assert all(bool((table[i, n:] == -1).all()) for i, n in enumerate(pages))  # unused entries are -1
    if sum(pages) > 2:
        assert used.tolist() != sorted(used.tolist())  # scattered, not in order
    rows = page_rows(inputs)
    assert torch.equal(gather_pages(inputs.k_pages, rows), inputs.k) and torch.equal(gather_pages(inputs.v_pages, rows), inputs.v)
    # the same seed draws the same q, k, v in every layout: one batch's rows attend over the same values
    packed = make_ragged_inputs(case.replace(layout="packed", page_size=None))
    assert torch.equal(packed.q, inputs.q) and torch.equal(packed.k, inputs.k)


# -- agreement: each request against its own float64 reference --------------------------------------------------------------

class AcrossRequestsBackend(Backend):
    """Packed attention that forgets the request boundaries: every query sees every key of the batch."""

    name = "across-requests"
    family = "test-wrong"
    layouts = frozenset({"packed"})

    def prepare(self, case, inputs: RaggedInputs) -> Prepared:
        """One attention over all packed tokens."""
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (inputs.q, inputs.k, inputs.v))
        return Prepared(fn=lambda: naive_attention(q, k, v)[0].transpose(0, 1))


class PagesInOrderBackend(Backend):
    """Paged attention that ignores the block table: reads each request's pages as if they lay in order."""

    name = "pages-in-order"
    family = "test-wrong"
    layouts = frozenset({"paged"})

    def prepare(self, case, inputs: RaggedInputs) -> Prepared:
        """Naive's per-request loop over K/V taken from the pages in storage order."""
        count = inputs.k.shape[0]
        k, v = (pages.reshape(-1, *pages.shape[2:])[:count] for pages in (inputs.k_pages, inputs.v_pages))
        batch = requests(inputs, k, v, request_masks(inputs, case.window))
        return Prepared(fn=lambda: per_request(lambda r: naive_attention(r.q, r.k, r.v, r.mask), batch))


class PaddingSeenBackend(Backend):
    """Padded attention without the key mask: queries also attend to the zeros padding each request."""

    name = "padding-seen"
    family = "test-wrong"
    layouts = frozenset({"padded"})

    def prepare(self, case, inputs: RaggedInputs) -> Prepared:
        """The padded rectangle, unmasked."""
        rect = padded(inputs, case.window)
        return Prepared(fn=lambda: naive_attention(rect.q, rect.k, rect.v), to_bhsd=rect.packed_output)


class PlannedBackend(Backend):
    """Right answers through naive, with a measured plan phase and a record of what `prepare` was handed."""

    name = "planned"
    family = "test"
    layouts = frozenset({"packed"})
    handed: list = []

    def prepare(self, case, inputs) -> Prepared:
        """Naive's packed loop, with plan_s set."""
        type(self).handed.append(type(inputs))
        prepared = load_registry().get("naive").prepare(case, inputs)
        prepared.plan_s = 0.0125
        return prepared


@pytest.mark.parametrize("wrong, layout", [
    (AcrossRequestsBackend, "packed"), (PagesInOrderBackend, "paged"), (PaddingSeenBackend, "padded"),
])
def test_a_layout_bug_disagrees(wrong, layout):
    case = ragged("uniform(4,30)", layout, B=4, causal=False, page_size=4 if layout == "paged" else None)
    record = execute(case, wrong(), PairRunner(budget=TINY))
    assert record.status is Status.OK and record.agree is False


def test_ragged_cases_get_ragged_inputs_and_plan_s_becomes_plan_ms():
    PlannedBackend.handed.clear()
    record = execute(ragged(), PlannedBackend(), PairRunner(budget=TINY))
    assert PlannedBackend.handed == [RaggedInputs] and record.agree
    assert record.plan_ms == pytest.approx(12.5)


@pytest.mark.parametrize("backend, layout, words", [
    ("across-requests", "paged", "across-requests does not take paged batches"),
    ("across-requests", "padded", "across-requests does not take padded batches (it takes: packed)"),
    ("projections", "packed", "projections does not take packed (varlen) batches (it takes: dense)"),
])
def test_a_layout_a_backend_does_not_declare_is_unsupported_with_its_reason(backend, layout, words):
    chosen = AcrossRequestsBackend() if backend == "across-requests" else load_registry().get(backend)
    record = execute(ragged(layout=layout, page_size=16 if layout == "paged" else None), chosen, PairRunner(budget=TINY))
    assert record.status is Status.UNSUPPORTED and words in record.reason


@pytest.mark.slow
def test_a_paged_backward_pass_is_refused_with_a_reason_and_a_packed_one_is_timed_and_checked():
    paged = execute(ragged(mode="bwd", layout="paged", page_size=16), load_registry().get("naive"), PairRunner(budget=TINY))
    assert paged.status is Status.UNSUPPORTED and "paged KV cache serves decoding" in paged.reason
    packed = execute(ragged(mode="bwd"), load_registry().get("naive"), PairRunner(budget=TINY))
    assert packed.status is Status.OK and packed.agree is True and packed.latency_ms_median > 0


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["padded", "packed", "paged"])
@pytest.mark.parametrize("backend", ["naive", "sdpa", "sdpa-math", "sdpa-flash"])
def test_cpu_backends_serve_every_layout_and_agree(backend, layout):
    for causal in (False, True):
        case = ragged("3x20 + 4x2@50", layout, causal=causal, page_size=16 if layout == "paged" else None)
        record = execute(case, load_registry().get(backend), PairRunner(budget=TINY, phases=Phases(memory=False)))
        assert record.status is Status.OK and record.agree, (causal, record.reason)
        if layout == "packed" and backend != "naive":
            assert record.notes["packed_via"] in ("nested_jagged", "per_request_loop")


# -- records ----------------------------------------------------------------------------------------------------------

def test_records_carry_the_batch_and_csv_writes_the_lengths_as_json_lists(tmp_path):
    case = ragged("2x24 + 6x1@80", "paged", page_size=16)
    record = execute(case, load_registry().get("naive"), PairRunner(budget=TINY))
    assert (record.case.layout, record.case.page_size, record.case.length_dist) == ("paged", 16, "2x24 + 6x1@80")
    assert (record.tokens_q, record.tokens_kv) == (54, 528)
    RunWriter(tmp_path).append(record)
    line = json.loads((tmp_path / "records.jsonl").read_text())
    assert line["seq_lens_q"] == [24, 24, 1, 1, 1, 1, 1, 1]
    frame = pd.read_csv(write_csv(tmp_path))
    assert json.loads(frame.seq_lens_kv.iloc[0]) == [24, 24, 80, 80, 80, 80, 80, 80]
    assert load_run(tmp_path).case_id.tolist() == [case.id]


def test_a_record_written_before_layouts_existed_reads_as_dense(tmp_path):
    old = {k: v for k, v in Record(case=Case(B=1, S_q=4, S_kv=4, H=2, H_kv=2, d_k=8, d_v=8), backend="naive").to_dict().items()
           if k not in ("layout", "page_size", "length_dist", "seq_lens_q", "seq_lens_kv", "tokens_q", "tokens_kv", "plan_ms")}
    (tmp_path / "records.jsonl").write_text(json.dumps(old) + "\n")
    assert read_records(tmp_path).records[0]["layout"] == "dense"
    assert load_run(tmp_path).layout.tolist() == ["dense"]


# -- suites -----------------------------------------------------------------------------------------------------------

def test_serving_quick_runs_every_batch_padded_packed_and_paged():
    suite = load_suite("serving-quick")
    by_batch: dict[str, set] = {}
    for case in suite.cases:
        assert case.device == "cpu" and case.ragged
        by_batch.setdefault(case.length_dist, set()).add(case.layout)
    assert len(by_batch) >= 5 and all(layouts == {"padded", "packed", "paged"} for layouts in by_batch.values())
    assert {"naive", "sdpa", "sdpa-math", "sdpa-flash"} <= set(suite.backends)


def test_serving_sweeps_presets_page_sizes_and_mixed_batches_and_falls_back_to_quick_on_a_cpu():
    suite = load_suite("serving")
    assert {c.page_size for c in suite.cases if c.layout == "paged"} == {1, 16, 64, 128, 256}
    assert {(c.H, c.H_kv) for c in suite.cases} == {(32, 32), (32, 8), (64, 8)}
    assert any(" + " in c.length_dist for c in suite.cases) and all(c.device == "cuda" for c in suite.cases)
    assert suite.on_device("cpu").cases == tuple(c.replace(device="cpu") for c in load_suite("serving-quick").cases)


@pytest.mark.slow
def test_serving_quick_end_to_end_records_every_layout_and_agrees(tmp_path, capsys):
    # The mixed prefill + decode batch alone: every layout, paged at two page sizes, every backend of the suite but flex (the
    # whole suite's 21 cases cost minutes on a busy machine and answer nothing more about the run's path; each batch's check
    # is test_cpu_backends_serve_every_layout_and_agree's). Flex would compile each of the four layouts cold here (15-20
    # CPU-s each); its compiled ragged layouts are test_flex_layouts' and its compiled run path test_backends'.
    backends = [name for name in load_suite("serving-quick").backends if name != "flex"]
    ran = attnbench_in_process(["run", "--suite", "serving-quick", "--device", "cpu", "--only", "L2x128+8x1@256", "--out", tmp_path,
                                "--run-id", "sq", "--backends", ",".join(backends), "--quiet"], capsys)
    assert ran.code == 0, ran.err
    frame = load_run(tmp_path / "sq")
    ok = frame[frame.status == "ok"]
    assert set(ok.layout) == {"padded", "packed", "paged"} and bool(ok.agree.all())
    for backend in ("naive", "sdpa", "sdpa-math", "sdpa-flash"):
        assert set(ok[ok.backend == backend].layout) == {"padded", "packed", "paged"}
