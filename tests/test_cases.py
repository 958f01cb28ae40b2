"""Case model: validation, ids, grids."""

import pytest

from harness.suite.cases import Case, case_from_fields, grid
from harness.errors import UserError


def make(**kw):
    base = dict(B=1, S_q=1024, S_kv=1024, H=16, H_kv=4, d_k=64, d_v=64, dtype="bf16", causal=True)
    return Case(**{**base, **kw})


def test_id_is_readable_and_stable():
    assert make().id == "B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16-causal"
    assert make(d_v=128, causal=False, mode="bwd", window=256, padding=True).id == "B1-Sq1024-Skv1024-H16-Hkv4-dk64-dv128-bf16-win256-pad-bwd"


def test_case_is_hashable_and_frozen():
    assert len({make(), make()}) == 1
    with pytest.raises(Exception):
        make().B = 2


def test_attention_kind():
    assert make(H_kv=16).attention_kind == "MHA"
    assert make(H_kv=4).attention_kind == "GQA"
    assert make(H_kv=1).attention_kind == "MQA"


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(H_kv=5), "H=16 is not divisible by H_kv=5"),
        (dict(d_k=0), "d_k must be a positive integer"),
        (dict(d_k=-3), "d_k must be a positive integer"),
        (dict(dtype="fp8"), "unknown dtype 'fp8'"),
        (dict(mode="sideways"), "unknown mode 'sideways'"),
        (dict(device="tpu"), "unknown device 'tpu'"),
        (dict(window=0), "window must be a positive integer"),
    ],
)
def test_bad_cases_name_the_problem(changes, message):
    with pytest.raises(UserError, match=message):
        make(**changes)


def test_dtype_aliases_are_canonicalised():
    assert make(dtype="bfloat16").dtype == "bf16"
    assert make(dtype="torch.float32").dtype == "fp32"


def test_grid_expands_h_kv_and_drops_non_divisors():
    cases = grid(B=[1], S=[128], H=[16, 12], H_kv=["H", 8, 1], d_k=[64])
    assert [(c.H, c.H_kv) for c in cases] == [(16, 16), (16, 8), (16, 1), (12, 12), (12, 1)]


def test_grid_cross_attention_lengths():
    cases = grid(B=[2], S_q=[1], S_kv=[256, 512], H=[8], d_k=[64])
    assert [(c.S_q, c.S_kv) for c in cases] == [(1, 256), (1, 512)]


def test_case_round_trips_through_record_fields():
    case = make(window=64, padding=True)
    fields = {**case.fields(), "backend": "naive", "latency_ms_median": 1.0}
    assert case_from_fields(fields) == case


# -- batches of requests (layout, page size, per-request lengths) --------------------------------------------------------

from harness.suite.batch_axes import ragged_case  # noqa: E402
from harness.suite.cases import parse_case_id  # noqa: E402


def ragged(batch="2x64 + 4x1@128", layout="paged", **kw):
    return ragged_case(batch, layout, **{"H": 8, "H_kv": 2, "d_k": 16, "causal": True, "page_size": 16, **kw})


def test_ragged_case_derives_b_and_the_longest_lengths():
    c = ragged()
    assert (c.B, c.S_q, c.S_kv) == (6, 64, 128)
    assert c.seq_lens_q == (64, 64, 1, 1, 1, 1) and c.seq_lens_kv == (64, 64, 128, 128, 128, 128)
    assert c.length_dist == "2x64 + 4x1@128" and c.page_size == 16 and c.ragged


@pytest.mark.parametrize("layout, batch, extra", [
    ("paged", "2x64 + 4x1@128", {}), ("packed", "uniform(8,40)", {"B": 5, "seed": 7}), ("padded", "longtail(4,512,1.1)", {"B": 9}),
    ("paged", "8x1@bimodal(16,300,0.25)", {"page_size": 1}), ("packed", "4x32@256 + 16x4@128", {"window": 8}),
])
def test_ragged_ids_are_readable_and_round_trip(layout, batch, extra):
    c = ragged(batch, layout, **extra)
    assert f"-{layout}" in c.id and "-L" in c.id and "," not in c.id  # `--case` splits ids on commas
    assert parse_case_id(c.id) == c
    assert case_from_fields(c.fields()) == c
    # what a CSV round-trip leaves: JSON lists of lengths as text, NaN for no page size
    csv_like = {**c.fields(), "seq_lens_q": str(list(c.seq_lens_q)), "seq_lens_kv": str(list(c.seq_lens_kv)),
                "page_size": float("nan") if c.page_size is None else float(c.page_size)}
    assert case_from_fields(csv_like) == c


def test_the_paged_id_names_layout_page_size_batch_and_seed():
    assert ragged(seed=3).id == "B6-Sq64-Skv128-H8-Hkv2-dk16-fp32-causal-paged-page16-L2x64+4x1@128-seed3"


@pytest.mark.parametrize("changes, message", [
    (dict(layout="tiled"), "unknown layout 'tiled'"),
    (dict(page_size=None), "page_size must be a positive integer"),
    (dict(layout="packed"), "page_size is for paged cases, not packed ones"),
    (dict(S_kv=100), "S_kv=100 contradicts the lengths, which make S_kv=128"),
    (dict(seq_lens_q=(64, 64, 1, 1, 1, 2)), "the lengths are not those '2x64 \\+ 4x1@128' draws from seed 0"),
    (dict(seq_lens_q=(64, 64, 1, 1, 1, 1), seq_lens_kv=(64, 64, 128, 128, 128)), "seq_lens_q has 6 requests, seq_lens_kv 5"),
    (dict(seq_lens_kv=(64, 63, 128, 128, 128, 128)), "request 1 has 64 queries over 63 keys"),
    (dict(seq_lens_q=(64, 0, 1, 1, 1, 1)), r"seq_lens_q\[1\] must be a positive integer"),
    (dict(length_dist="2x64+4x1@128"), "length_dist '2x64\\+4x1@128' is not canonical: write '2x64 \\+ 4x1@128'"),
    (dict(length_dist=None), "needs length_dist"),
    (dict(padding=True), "cannot also be padding"),
])
def test_bad_ragged_cases_name_the_problem(changes, message):
    with pytest.raises(UserError, match=message):
        ragged().replace(**changes)


def test_a_dense_case_has_no_ragged_fields():
    with pytest.raises(UserError, match="a dense case has no page_size"):
        make(page_size=16)
    assert make().layout == "dense" and "paged" not in make().id


def test_a_lengths_file_case_carries_its_lengths_and_a_hash_in_its_id(tmp_path):
    (tmp_path / "prod-hist.txt").write_text("# length count\n100 3\n2000 1\n")
    c = ragged(f"4x1@file:{tmp_path / 'prod-hist.txt'}", "packed", page_size=None)
    assert "-L4x1@file:prod_hist.txt-h" in c.id and set(c.seq_lens_kv) <= {100, 2000}
    assert case_from_fields(c.fields()) == c  # a record rebuilds it: the lengths are its fields
    other = c.replace(seq_lens_kv=tuple(2000 if n == 100 else 100 for n in c.seq_lens_kv), S_kv=2000)
    assert other.id != c.id  # edited lengths change the id's hash
    with pytest.raises(UserError, match="draws its lengths from a user's file: rebuild it from a record's fields"):
        parse_case_id(c.id)


@pytest.mark.parametrize("case_id, message", [
    ("B2-Sq4-Skv4-H2-Hkv2-dk8-fp32-packed", "a packed case needs length_dist"),
    ("B2-Sq4-Skv4-H2-Hkv2-dk8-fp32-packed-L2x4-h0123abcd", "a lengths hash"),
    ("B2-Sq4-Skv4-H2-Hkv2-dk8-fp32-paged-L2x4", "page_size must be a positive integer"),
    ("B2-Sq5-Skv4-H2-Hkv2-dk8-fp32-packed-L2x4", "S_q=5 contradicts the lengths"),
    ("B2-Sq4-Skv4-H2-Hkv2-dk8-fp32-packed-Lnormal(3_4)", "length distribution 'normal"),
])
def test_bad_ragged_ids_name_the_problem(case_id, message):
    with pytest.raises(UserError, match=message):
        parse_case_id(case_id)
