"""Bad input gives one line naming the problem (a UserError; exit 2 through the CLI), never a traceback.

One table per kind of input: suite files, cases and grids, records files, run ids, compare's runs; and the
analytic costs, which must not allocate per element for absurd (but honest) sizes.
"""

from __future__ import annotations

import json
import math
import random
import time
import tracemalloc
from pathlib import Path

import pytest

from harness.analysis.compare import compare_runs
from harness.cli.main import main
from harness.errors import UserError
from harness.attention import theory
from harness.results.store import RECORDS, load_run, read_records, validate_run_id
from harness.suite.cases import MAX_PADDED_B, Case, case_from_fields, grid, parse_case_id
from harness.suite.catalog import SLUG_MAX, load_suite, suite_slug
from harness.suite.inputs import kv_lengths, q_lengths, visible_key_rows, visible_pairs
from tests.cli_runs import refused

GRID = "[[grid]]\nB = 1\nS = 8\nH = 2\nd_k = 16\n"


# -- suite files -----------------------------------------------------------------------------------------------------

SUITE_FILES = [
    # id, file content (bytes; None: a folder named x.toml), words the message must contain
    ("binary", b"\x00\xff\xfe\x01 binary \x89PNG", ["not a TOML file", "UTF-8"]),
    ("latin-1", 'name = "caf\xe9"\n'.encode("latin-1") + GRID.encode(), ["not a TOML file", "UTF-8"]),
    ("folder", None, ["is a directory"]),
    ("grid-int", b'name = "a"\ngrid = 5\n', ["field 'grid' has value 5"]),
    ("grid-list-of-ints", b'name = "a"\ngrid = [1, 2]\n', ["field 'grid' has value [1, 2]"]),
    ("budget-int", b"budget = 5\n" + GRID.encode(), ["field 'budget' has value 5", "[budget] table"]),
    ("B-beyond-int64", GRID.replace("B = 1", "B = 99999999999999999999").encode(), ["B=99999999999999999999", "beyond int64"]),
    ("measure-inf", b"[budget]\nmeasure_s = inf\n" + GRID.encode(), ["budget field 'measure_s' has value inf", "finite"]),
    ("warmup-nan", b"[budget]\nwarmup_s = nan\n" + GRID.encode(), ["budget field 'warmup_s' has value nan", "finite"]),
    ("measure-zero", b"[budget]\nmeasure_s = 0\n" + GRID.encode(), ["budget field 'measure_s' has value 0", "positive"]),
    ("precision-one", b"[budget]\nprecision = 1\n" + GRID.encode(), ["budget field 'precision' has value 1", "fraction"]),
    ("max-rounds-huge", b"[budget]\nmax_rounds = 99999999999999999999\n" + GRID.encode(), ["budget field 'max_rounds'"]),
    ("padded-B-too-many", (GRID.replace("B = 1", f"B = {MAX_PADDED_B + 1}") + "padding = true\n").encode(), ["padded case", "B=2147483648"]),
    ("S-string", GRID.replace("S = 8", 'S = "many"').encode(), ["field 'S' has value 'many'"]),
    ("causal-string", (GRID + 'causal = "no"\n').encode(), ["field 'causal' has value 'no'"]),
]


def _bad_suite_file(tmp_path: Path, content: bytes | None) -> Path:
    """x.toml holding `content` as it is (often not TOML at all), or a folder named x.toml (None)."""
    path = tmp_path / "x.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("content, words", [c[1:] for c in SUITE_FILES], ids=[c[0] for c in SUITE_FILES])
def test_bad_suite_file_is_a_user_error_naming_the_file_and_field(tmp_path, content, words):
    path = _bad_suite_file(tmp_path, content)
    with pytest.raises(UserError) as caught:
        load_suite(str(path))
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("content, words", [c[1:] for c in SUITE_FILES], ids=[c[0] for c in SUITE_FILES])
def test_bad_suite_file_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys, content, words):
    path = _bad_suite_file(tmp_path, content)
    out = tmp_path / "out"
    err = refused(capsys, ["run", "--suite", str(path), "--out", str(out), "--device", "cpu", "--quiet"])
    assert words[0] in err
    assert not out.exists()  # refused before a run folder was made


def test_an_honest_huge_sequence_length_is_accepted(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text(GRID.replace("S = 8", "S = 1_000_000_000") + "causal = true\n")
    (case,) = load_suite(str(path)).cases
    assert case.S_q == case.S_kv == 10**9


# -- suite names and run ids ------------------------------------------------------------------------------------------

SLUGS = [
    ("space", "GQA sweep", "GQA-sweep"),
    ("slashes-and-dots", "../../etc/passwd", "etc-passwd"),
    ("accents", "Über sweep", "Uber-sweep"),
    ("only-symbols", "日本語 !!", "suite"),
    ("empty", "", "suite"),
    ("plain", "quick", "quick"),
]


@pytest.mark.parametrize("name, slug", [s[1:] for s in SLUGS], ids=[s[0] for s in SLUGS])
def test_suite_slug_is_a_valid_run_id(tmp_path, name, slug):
    path = tmp_path / "named.toml"
    path.write_text(f"name = {json.dumps(name)}\n" + GRID)
    suite = load_suite(str(path))
    assert suite.name == name and suite.slug == suite_slug(name) == slug
    assert validate_run_id(f"20260101-000000-{suite.slug}-12345")


def test_suite_slug_of_any_name_is_a_valid_run_id():
    rng = random.Random(7)
    alphabet = "aZ09 ._-/\\:*?\"<>|\n\té日\x00"
    for _ in range(500):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        slug = suite_slug(name)
        assert 1 <= len(slug) <= SLUG_MAX and validate_run_id(slug) == slug, (name, slug)


RUN_IDS = [
    ("300-chars", "x" * 300, "300 bytes"),
    ("dot", ".", "invalid run id '.'"),
    ("dot-dot", "..", "invalid run id '..'"),
    ("slash", "a/b", "invalid run id 'a/b'"),
    ("absolute", "/tmp/x", "invalid run id '/tmp/x'"),
    ("trailing-newline", "run\n", "invalid run id 'run\\n'"),
    ("hidden", ".run", "invalid run id '.run'"),
    ("space", "GQA sweep", "invalid run id 'GQA sweep'"),
    ("empty", "", "invalid run id ''"),
]


@pytest.mark.parametrize("run_id, words", [r[1:] for r in RUN_IDS], ids=[r[0] for r in RUN_IDS])
def test_bad_run_id_is_refused(run_id, words):
    with pytest.raises(UserError, match="invalid run id") as caught:
        validate_run_id(run_id)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_longest_run_id_is_accepted():
    assert validate_run_id("x" * 255) == "x" * 255


def test_long_run_id_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "ok.toml"
    path.write_text('backends = ["naive"]\n' + GRID)
    err = refused(capsys, ["run", "--suite", str(path), "--out", str(tmp_path / "out"), "--run-id", "r" * 300, "--device", "cpu", "--quiet"])
    assert "300 bytes" in err


# -- cases and grids --------------------------------------------------------------------------------------------------

BASE = dict(B=1, S_q=4, S_kv=4, H=4, H_kv=2, d_k=8, d_v=8)
BAD_CASES = [
    ("d_k-zero", lambda: Case(**{**BASE, "d_k": 0}), "d_k must be a positive integer, got 0"),
    ("B-negative", lambda: Case(**{**BASE, "B": -1}), "B must be a positive integer, got -1"),
    ("S_q-float", lambda: Case(**{**BASE, "S_q": 2.5}), "S_q must be a positive integer, got 2.5"),
    ("S_kv-string", lambda: Case(**{**BASE, "S_kv": "4"}), "S_kv must be a positive integer, got '4'"),
    ("B-beyond-int64", lambda: Case(**{**BASE, "B": 2**63}), "B=9223372036854775808 is beyond int64"),
    ("H-not-divisible", lambda: Case(**{**BASE, "H": 3}), "H=3 is not divisible by H_kv=2"),
    ("causal-string", lambda: Case(**{**BASE, "causal": "no"}), "causal must be true or false, got 'no'"),
    ("seed-negative", lambda: Case(**{**BASE, "seed": -1}), "seed must be a non-negative integer, got -1"),
    ("window-bool", lambda: Case(**{**BASE, "window": True}), "window must be a positive integer or None, got True"),
    ("padded-B", lambda: Case(**{**BASE, "B": MAX_PADDED_B + 1, "padding": True}), "too many sequences for a padded case"),
    ("mode-list", lambda: Case(**{**BASE, "mode": ["fwd"]}), "unknown mode ['fwd']"),
    ("grid-B-string", lambda: grid(B=["x"], S=[4], H=[4], d_k=[8]), "B must be a positive integer, got 'x'"),
    ("grid-H-string", lambda: grid(B=[1], S=[4], H=["x"], H_kv=[2], d_k=[8]), "H must be a positive integer, got 'x'"),
    ("grid-H-float", lambda: grid(B=[1], S=[4], H=[2.5], H_kv=[2], d_k=[8]), "H must be a positive integer, got 2.5"),
    ("grid-H_kv-divides-none", lambda: grid(B=[1], S=[4], H=[3], H_kv=[2], d_k=[8]), "H=3 is not divisible by H_kv=2"),
    ("grid-empty-axis", lambda: grid(B=[], S=[4], H=[4], d_k=[8]), "grid axis 'B' is empty"),
    ("grid-no-S", lambda: grid(B=[1], H=[4], d_k=[8]), "give S, or both S_q and S_kv"),
    ("fields-S_q-many", lambda: case_from_fields({**BASE, "S_q": "many"}), "S_q must be a positive integer, got 'many'"),
    ("fields-S_q-2.5", lambda: case_from_fields({**BASE, "S_q": 2.5}), "S_q must be an integer, got 2.5"),
    ("fields-missing", lambda: case_from_fields({"B": 1}), "missing case field 'S_q'"),
    ("id-superscript", lambda: parse_case_id("B²-Sq4-Skv4-H4-Hkv2-dk8-fp32"), "token 'B²' is not B<integer>"),
    ("id-huge", lambda: parse_case_id("B1-Sq" + "9" * 5000 + "-Skv4-H4-Hkv2-dk8-fp32"), "is not Sq<integer>"),
]


@pytest.mark.parametrize("build, message", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_case_or_grid_is_a_user_error_naming_the_field(build, message):
    with pytest.raises(UserError) as caught:
        build()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_grid_takes_one_value_for_a_list_and_a_string_as_one_value():
    (case,) = grid(B=2, S=4, H=4, H_kv=2, d_k=8, dtype="bf16", causal=True)
    assert (case.B, case.dtype, case.causal) == (2, "bf16", True)


def test_integral_numpy_and_csv_values_still_make_a_case():
    import numpy as np

    case = Case(**{**BASE, "B": np.int64(2), "causal": np.True_})
    assert type(case.B) is int and case.causal is True
    assert case_from_fields({**BASE, "S_q": 4.0, "window": float("nan")}) == Case(**BASE)


# -- analytic costs ---------------------------------------------------------------------------------------------------


def _elementwise(case: Case) -> tuple[int, int, int, int]:
    """The same counts from inputs' per-query arrays: the definition the closed forms must match."""
    return int(q_lengths(case).sum()), int(kv_lengths(case).sum()), visible_pairs(case), visible_key_rows(case)


MASKS = [  # hand-picked corners: S_q < S_kv, S_q > S_kv, windows wider and narrower than S, padding with both
    ("square-causal", dict(S_q=7, S_kv=7, causal=True)),
    ("decode", dict(S_q=1, S_kv=9, causal=True)),
    ("more-queries", dict(S_q=9, S_kv=3, causal=True)),
    ("window-1", dict(S_q=6, S_kv=6, window=1)),
    ("window-wider-than-S", dict(S_q=5, S_kv=5, window=50)),
    ("window-more-queries", dict(S_q=8, S_kv=3, window=2)),
    ("padding-self", dict(B=5, S_q=9, S_kv=9, padding=True, seed=3)),
    ("padding-causal-self", dict(B=5, S_q=9, S_kv=9, causal=True, padding=True, seed=1)),
    ("padding-decode-window", dict(B=6, S_q=2, S_kv=11, window=3, padding=True, seed=2)),
    ("padding-more-queries", dict(B=4, S_q=12, S_kv=5, causal=True, padding=True)),
    ("unmasked-cross", dict(B=3, S_q=5, S_kv=13)),
]


@pytest.mark.parametrize("fields", [m[1] for m in MASKS], ids=[m[0] for m in MASKS])
def test_closed_form_counts_equal_the_elementwise_ones(fields):
    case = Case(**{**dict(B=2, H=2, H_kv=1, d_k=4, d_v=4), **fields})
    counts = theory.mask_counts(case)
    assert (counts.q_rows, counts.kv_tokens, counts.pairs, counts.key_rows) == _elementwise(case)


def test_closed_form_counts_equal_the_elementwise_ones_on_random_cases():
    rng = random.Random(2024)
    for _ in range(600):
        case = Case(B=rng.randint(1, 7), S_q=rng.randint(1, 24), S_kv=rng.randint(1, 24), H=2, H_kv=1, d_k=4, d_v=4,
                    causal=rng.random() < 0.5, window=rng.choice([None, None, 1, 2, 3, 5, 30]), padding=rng.random() < 0.5,
                    seed=rng.randint(0, 9))
        expected = _elementwise(case)
        for chunk in (1, 3, theory.LENGTH_CHUNK):  # padded lengths drawn in chunks are the same draws
            counts = theory.mask_counts(case, chunk)
            assert (counts.q_rows, counts.kv_tokens, counts.pairs, counts.key_rows) == expected, (case, chunk)


HUGE = [
    ("S-1e9-causal", dict(B=1, S_q=10**9, S_kv=10**9, causal=True)),
    ("S-1e9-window-padding", dict(B=8, S_q=10**9, S_kv=10**9, window=4096, padding=True, mode="fwd_bwd")),
    ("decode-1e9", dict(B=64, S_q=1, S_kv=10**9, causal=True, padding=True)),
    ("largest-indexable", dict(B=2**20, S_q=2**31, S_kv=2**31, causal=True, mode="bwd")),
]


@pytest.mark.parametrize("fields", [h[1] for h in HUGE], ids=[h[0] for h in HUGE])
def test_costs_of_absurd_sizes_are_instant_and_allocate_nothing(fields):
    case = Case(**{**dict(H=8, H_kv=8, d_k=128, d_v=128), **fields})
    theory.mask_counts.cache_clear()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        costs = (theory.flops(case), theory.min_bytes(case), theory.kv_cache_bytes(case), theory.arithmetic_intensity(case))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5
    assert peak < 1 << 20, f"{peak} bytes traced"
    assert all(c > 0 for c in costs[:3]) and math.isfinite(costs[3])


def test_causal_flops_of_a_billion_tokens_are_exact():
    case = Case(B=1, S_q=10**9, S_kv=10**9, H=1, H_kv=1, d_k=64, d_v=64, causal=True, mode="bwd")
    pairs = 10**9 * (10**9 + 1) // 2
    assert theory.flops(case) == 2 * 128 * pairs * 5 // 2


# -- records files ----------------------------------------------------------------------------------------------------


def _record(S: int = 16, backend: str = "naive", ms: float = 1.0, **changes) -> dict:
    case = Case(B=1, S_q=S, S_kv=S, H=2, H_kv=2, d_k=8, d_v=8)
    record = {"case_id": case.id, **case.fields(), "backend": backend, "status": "ok", "schema_version": 1,
              "latency_ms_median": ms, "latency_ms_p20": ms * 0.99, "latency_ms_p80": ms * 1.01}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()
GOOD = json.dumps(_record()).encode() + b"\n"

RECORD_FILES = [
    # id, records.jsonl content, words of the message
    ("not-an-object", GOOD + b"[1, 2]\n" + GOOD, [":2:", "not a JSON object"]),
    ("not-an-object-last", GOOD + b"42", [":2:", "not a JSON object"]),
    ("bad-json-middle", GOOD + b"{oops\n" + GOOD, [":2:", "corrupt record"]),
    ("not-utf8", GOOD + b"\xff\xfe\n", [":2:", "corrupt record"]),
    ("deep-nesting", b"[" * 100_000 + b"]" * 100_000 + b"\n", [":1:", "nested too deep"]),
    ("missing-S_q", json.dumps(_record(S_q=_DROP)).encode() + b"\n", [":1:", "no field 'S_q'"]),
    ("S_q-many", GOOD + json.dumps(_record(S_q="many")).encode() + b"\n", [":2:", "field 'S_q' has value 'many'"]),
    ("S_q-float", json.dumps(_record(S_q=2.5)).encode() + b"\n", [":1:", "field 'S_q' has value 2.5"]),
    ("causal-string", json.dumps(_record(causal="yes")).encode() + b"\n", [":1:", "field 'causal' has value 'yes'"]),
    ("impossible-case", json.dumps(_record(H_kv=3)).encode() + b"\n", [":1:", "not divisible by H_kv=3"]),
    ("backend-null", json.dumps(_record(backend=None)).encode() + b"\n", [":1:", "field 'backend' has value None"]),
    ("schema-string", json.dumps(_record(schema_version="1")).encode() + b"\n", [":1:", "schema_version '1'"]),
    ("schema-newer", json.dumps(_record(schema_version=99)).encode() + b"\n", [":1:", "newer than this attnbench"]),
]


@pytest.mark.parametrize("content, words", [r[1:] for r in RECORD_FILES], ids=[r[0] for r in RECORD_FILES])
def test_bad_records_file_names_the_file_line_and_field(tmp_path, content, words):
    (tmp_path / RECORDS).write_bytes(content)
    with pytest.raises(UserError) as caught:
        read_records(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / RECORDS) in message
    for word in words:
        assert word in message, message


def test_empty_records_file_has_no_records(tmp_path):
    (tmp_path / RECORDS).write_bytes(b"")
    result = read_records(tmp_path)
    assert result.records == [] and not result.dropped_partial_line and result.dropped_message is None


def test_records_file_that_is_a_folder(tmp_path):
    (tmp_path / RECORDS).mkdir()
    with pytest.raises(UserError, match="records.jsonl is a folder, not a records file"):
        read_records(tmp_path)


def test_truncated_last_line_is_dropped_and_can_be_told(tmp_path):
    (tmp_path / RECORDS).write_bytes(GOOD + GOOD[:40])
    result = read_records(tmp_path)
    assert len(result.records) == 1 and result.dropped_partial_line
    assert str(tmp_path / RECORDS) in result.dropped_message and "truncated last line" in result.dropped_message
    assert load_run(tmp_path).attrs["dropped_partial_lines"] == [str(tmp_path / RECORDS)]


def test_a_record_written_by_hand_with_only_its_keys_still_reads(tmp_path):
    (tmp_path / RECORDS).write_text('{"case_id": "a", "backend": "b", "status": "ok"}\n')
    assert read_records(tmp_path).records == [{"case_id": "a", "backend": "b", "status": "ok"}]


# -- compare ----------------------------------------------------------------------------------------------------------

ENV = json.dumps({"before": {"device_type": "cpu", "device_name": "synthetic CPU"}})


def _run(folder: Path, records: list[dict] | None = None, *, raw: bytes | None = None, env: str = ENV) -> Path:
    folder.mkdir(parents=True)
    if raw is None:
        raw = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    (folder / RECORDS).write_bytes(raw)
    (folder / "env.json").write_text(env)
    return folder


def _good_records() -> list[dict]:
    return [_record(S, backend, 1.0 + S / 16) for S in (16, 32) for backend in ("naive", "sdpa")]


def _with(index: int, **changes) -> list[dict]:
    records = _good_records()
    records[index] = {**records[index], **changes}
    return records


COMPARES = [
    # id, NEW run (records, raw bytes, env), words of the message
    ("median-fast", dict(records=_with(1, latency_ms_median="fast")), ["records.jsonl:2:", "'latency_ms_median' has value 'fast'"]),
    ("p20-list", dict(records=_with(2, latency_ms_p20=[1])), ["records.jsonl:3:", "'latency_ms_p20' has value [1]"]),
    ("median-true", dict(records=_with(0, latency_ms_median=True)), ["records.jsonl:1:", "'latency_ms_median' has value True"]),
    ("median-null-on-ok", dict(records=_with(3, latency_ms_median=None)), ["record 4", "'latency_ms_median' has value null"]),
    ("empty-run", dict(raw=b""), ["has no records"]),
    ("env-not-json", dict(records=_good_records(), env="{oops"), ["env.json: not valid JSON"]),
    ("env-a-list", dict(records=_good_records(), env="[]"), ["env.json: expected a JSON object"]),
    ("env-before-int", dict(records=_good_records(), env='{"before": 5}'), ["env.json: field 'before' has value 5"]),
    ("record-missing-S_q", dict(records=_with(0, S_q=_DROP)), ["records.jsonl:1:", "no field 'S_q'"]),
]


def _drop_marked(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if v is not _DROP} for r in records]


@pytest.mark.parametrize("new, words", [c[1:] for c in COMPARES], ids=[c[0] for c in COMPARES])
def test_bad_run_in_compare_is_one_line_naming_file_row_and_column(tmp_path, capsys, new, words):
    base = _run(tmp_path / "base", _good_records())
    new = dict(new)
    if "records" in new:
        new["records"] = _drop_marked(new["records"])
    new_dir = _run(tmp_path / "new", **new)
    with pytest.raises(UserError) as caught:
        compare_runs(base, new_dir)
    assert "\n" not in str(caught.value)
    err = refused(capsys, ["compare", str(base), str(new_dir), "--out", str(tmp_path / "cmp.csv")])
    for word in words:
        assert word in err, err
    assert str(new_dir) in err


def test_compare_still_reads_numbers_written_as_strings_and_tells_a_dropped_line(tmp_path, capsys):
    base = _run(tmp_path / "base", _good_records())
    records = _with(1, latency_ms_median="1.5")  # json.dumps(default=str) writes numpy scalars so
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in records) + b'{"case_id": "cut sh'
    new = _run(tmp_path / "new", raw=raw)
    assert main(["compare", str(base), str(new), "--out", str(tmp_path / "cmp.csv")]) == 0
    out = capsys.readouterr().out
    assert f"warning: {new / RECORDS}: dropped a truncated last line" in out


def test_a_case_whose_tensors_no_tensor_can_index_is_refused_by_name():
    with pytest.raises(UserError, match=r"more than a tensor can index"):
        Case(B=10**6, S_q=10**9, S_kv=10**9, H=128, H_kv=128, d_k=512, d_v=512)


def test_explicit_model_lengths_past_the_context_are_refused_and_run_on_the_cpu_too():
    from harness.suite.catalog import load_suite

    with pytest.raises(UserError, match="context is 32,768 tokens; 99,999 is longer"):
        load_suite("model:mistral-7b:99999")
    suite = load_suite("model:mistral-7b:256").on_device("cpu")
    assert {c.S_kv for c in suite.cases} == {256}
