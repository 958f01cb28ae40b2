"""FLOP and byte formulas against hand-computed values, including causal with S_q ≠ S_kv, padding, windows and MLA."""

import numpy as np
import torch
import pytest

from harness.attention import theory
from harness.suite.cases import Case
from harness.suite.inputs import kv_lengths, visible_key_rows, visible_mask, visible_pairs


def case(**kw):
    base = dict(B=1, S_q=4, S_kv=4, H=2, H_kv=2, d_k=8, d_v=8, dtype="fp32")
    return Case(**{**base, **kw})


def test_unmasked_forward_flops_is_four_b_h_s2_d():
    c = case()
    assert theory.forward_flops(c) == 4 * 1 * 2 * 4 * 4 * 8 == 1024


def test_causal_square_counts_s_s_plus_1_over_2_pairs():
    c = case(causal=True)
    assert visible_pairs(c) == 10
    assert theory.forward_flops(c) == 2 * 2 * 16 * 10


def test_causal_fewer_queries_than_keys_is_bottom_right():
    # S_q = 2, S_kv = 5: query 0 sees keys 0..3, query 1 sees 0..4 → 4 + 5 = 9 = S_q(2·S_kv − S_q + 1)/2.
    c = case(S_q=2, S_kv=5, causal=True)
    assert visible_pairs(c) == 9
    m = visible_mask(c)[0, 0]
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    assert theory.forward_flops(c) == 2 * 2 * 16 * 9


def test_causal_more_queries_than_keys_leaves_early_rows_empty():
    # S_q = 5, S_kv = 2: queries 0..2 see nothing, query 3 sees key 0, query 4 sees keys 0..1.
    c = case(S_q=5, S_kv=2, causal=True)
    assert visible_pairs(c) == 3
    assert visible_mask(c)[0, 0].sum(dim=-1).tolist() == [0, 0, 0, 1, 2]


def test_window_of_w_keys_includes_the_query_itself():
    c = case(S_q=6, S_kv=6, window=2)
    assert visible_pairs(c) == 1 + 2 * 5
    assert visible_mask(c)[0, 0, 3].tolist() == [False, False, True, True, False, False]


def test_backward_is_two_and_a_half_forward_and_fwd_bwd_three_and_a_half():
    fwd = theory.flops(case(causal=True))
    assert theory.flops(case(causal=True, mode="bwd")) == 2.5 * fwd
    assert theory.flops(case(causal=True, mode="fwd_bwd")) == 3.5 * fwd


def test_padding_counts_real_keys_and_pads_queries_in_self_attention():
    c = case(B=3, S_q=8, S_kv=8, padding=True, seed=4)
    lens = kv_lengths(c)
    assert lens[0] == 8 and all(4 <= n <= 8 for n in lens)
    assert visible_pairs(c) == int((lens**2).sum())  # padded query rows see nothing
    causal = c.replace(causal=True)
    assert visible_pairs(causal) == int((lens * (lens + 1) // 2).sum())


def test_decode_with_padding_sees_each_sequences_cache():
    c = case(B=4, S_q=1, S_kv=64, padding=True, causal=True, seed=2)
    assert visible_pairs(c) == int(kv_lengths(c).sum())


def test_speculative_decode_is_causal_per_sequence():
    # S_q = 3 new tokens at the end of each sequence's own cache of len_b keys.
    c = case(B=2, S_q=3, S_kv=16, padding=True, causal=True, seed=1)
    lens = kv_lengths(c)
    assert visible_pairs(c) == int(sum(3 * n - 3 for n in lens))  # (n−2) + (n−1) + n
    m = visible_mask(c)
    assert int(m[1, 0, 0].sum()) == lens[1] - 2


def test_decode_bytes_are_the_kv_cache_plus_q_and_o():
    c = Case(B=2, S_q=1, S_kv=100, H=8, H_kv=2, d_k=16, d_v=16, dtype="bf16")
    expected = (2 * 8 * 16 + 2 * 100 * 2 * (16 + 16) + 2 * 8 * 16) * 2
    assert theory.min_bytes(c) == expected
    padded = c.replace(padding=True)
    lens = kv_lengths(padded)
    assert theory.min_bytes(padded) == (2 * 8 * 16 * 2 + int(lens.sum()) * 2 * 32) * 2


def test_window_shrinks_the_keys_a_decode_reads():
    c = Case(B=1, S_q=1, S_kv=64, H=4, H_kv=4, d_k=8, d_v=8, window=5)
    assert visible_key_rows(c) == 5
    assert theory.min_bytes(c) == (4 * 8 + 5 * 4 * 16 + 4 * 8) * 4


def test_backward_bytes_read_q_k_v_o_do_and_write_dq_dk_dv():
    c = case(mode="bwd")
    t = theory.touched_bytes(c)
    assert theory.min_bytes(c) == 2 * (t["q"] + t["k"] + t["v"]) + 2 * t["o"]
    assert theory.min_bytes(c.replace(mode="fwd_bwd")) == theory.min_bytes(c) + theory.min_bytes(c.replace(mode="fwd"))


def test_kv_cache_ratio_mha_gqa_mqa_is_one_to_g_over_h_to_one_over_h():
    sizes = [theory.kv_cache_bytes(Case(B=2, S_q=1, S_kv=128, H=8, H_kv=g, d_k=16, d_v=16)) for g in (8, 2, 1)]
    assert sizes[0] == 2 * 128 * 8 * 32 * 4
    assert np.allclose([s / sizes[0] for s in sizes], [1, 2 / 8, 1 / 8])


def test_mla_caches_one_latent_per_token():
    c = Case(B=1, S_q=1, S_kv=10, H=128, H_kv=1, d_k=576, d_v=512, dtype="bf16", mla=True)
    assert theory.kv_cache_bytes_per_token(c) == 1152
    assert theory.kv_cache_bytes(c) == 11520
    assert theory.touched_bytes(c)["v"] == 0


@pytest.mark.parametrize("kw", [dict(H_kv=2), dict(d_v=8, d_k=4)])
def test_mla_case_needs_one_kv_head_and_dv_within_dk(kw):
    from harness.errors import UserError

    with pytest.raises(UserError):
        Case(B=1, S_q=1, S_kv=4, H=4, **{"H_kv": 1, "d_k": 8, "d_v": 4, **kw}, mla=True)


@pytest.mark.parametrize("H, H_kv", [(8, 8), (8, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_model_crossover_is_where_the_cases_own_flops_cross(H, H_kv, causal):
    from harness.backends.pytorch.projections import projection_flops

    d = 64
    D = H * d
    s_star = theory.model_crossover(D, H, H_kv, causal)
    assert s_star == pytest.approx(D * (1 + H_kv / H) * (2 if causal else 1))
    # At the model's S* the core's counted FLOPs equal the projections' (up to the causal diagonal, 1/S).
    S = round(s_star)
    case = Case(B=1, S_q=S, S_kv=S, H=H, H_kv=H_kv, d_k=d, d_v=d, causal=causal)
    assert theory.flops(case) / projection_flops(case) == pytest.approx(1.0, rel=2 / S)
    below = case.replace(S_q=S // 2, S_kv=S // 2)
    assert theory.flops(below) < projection_flops(below)


def test_model_crossover_for_the_h200_gqa_rows_of_the_issue():
    # H = 32, H_kv = 8, d_k = 128 (D = 4096): 5120 non-causal, 10240 causal (not 8192 for both).
    assert theory.model_crossover(4096, 32, 8, False) == 5120
    assert theory.model_crossover(4096, 32, 8, True) == 10240


# -- batches of requests: costs count each request's real tokens, whatever the layout --------------------------------------

from harness.backends.registry import load_registry  # noqa: E402
from harness.execution.outcome import case_record  # noqa: E402
from harness.suite.batch_axes import ragged_case  # noqa: E402

BATCHES = ["2x64 + 8x1@256", "uniform(3,90)", "4x32@256 + 16x4@128", "longtail(2,300)", "6x5@bimodal(7,120,0.5)"]


def brute_force_pairs(q_lens, kv_lens, causal, window=None):
    """Visible (query, key) pairs counted one by one per request, bottom-right: query j of a request sits at j + kv − q."""
    total = 0
    for q_len, kv_len in zip(q_lens, kv_lens):
        for j in range(q_len):
            position = j + kv_len - q_len
            for t in range(kv_len):
                seen = (not causal and window is None) or t <= position
                if window is not None:
                    seen = seen and t > position - window
                total += seen
    return total


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 16)])
def test_ragged_flops_match_a_brute_force_count_per_request_in_every_layout(batch, causal, window):
    rows = {}
    for layout in ("padded", "packed", "paged"):
        c = ragged_case(batch, layout, B=7, H=4, H_kv=2, d_k=16, d_v=8, causal=causal, window=window, page_size=16 if layout == "paged" else None, seed=5)
        pairs = brute_force_pairs(c.seq_lens_q, c.seq_lens_kv, causal, window)
        rows[layout] = case_record(c, load_registry().get("naive")).flops  # the FLOPs the row carries
        assert rows[layout] == 2 * c.H * (c.d_k + c.d_v) * pairs, layout
    # the padded row carries the packed row's FLOPs: its padding is waste, so its TFLOP/s shows it
    assert rows["padded"] == rows["packed"] == rows["paged"]
    dense = case(B=c.B, S_q=c.S_q, S_kv=c.S_kv, H=4, H_kv=2, d_k=16, d_v=8, causal=causal, window=window)
    if len(set(c.seq_lens_q)) > 1 or len(set(c.seq_lens_kv)) > 1:
        assert theory.flops(dense) > rows["padded"]  # the rectangle the batch was padded to is more work


def test_ragged_bytes_count_real_tokens_and_a_paged_row_its_block_table():
    packed = ragged_case("3x1@100 + 1x1@40", "packed", H=4, H_kv=2, d_k=16, causal=True)
    tokens = 3 * 100 + 40
    assert theory.mask_counts(packed).kv_tokens == tokens
    kv = tokens * 2 * (16 + 16) * 4  # K and V of the tokens actually read, fp32
    q_and_o = 4 * 4 * (16 + 16) * 4  # one query and one output row per request
    assert theory.min_bytes(packed) == kv + q_and_o
    for size, pages in ((1, tokens), (16, 3 * 7 + 3), (256, 4)):
        paged = packed.replace(layout="paged", page_size=size)
        assert theory.min_bytes(paged) == kv + q_and_o + 4 * pages  # one int32 block-table entry per page read
    assert theory.kv_cache_bytes(packed) == kv


def test_the_torch_free_element_sizes_are_torchs():
    from harness.suite.case_values import DTYPE_BYTES, DTYPES

    assert set(DTYPE_BYTES) == set(DTYPES)
    assert {name: getattr(torch, DTYPES[name]).itemsize for name in DTYPES} == DTYPE_BYTES


@pytest.mark.parametrize("variant", [{"softcap": 30.0}, {"sinks": True}, {"sinks": True, "window": 16}, {"alibi": True}, {"scale": 0.5}])
@pytest.mark.parametrize("causal", [False, True])
def test_each_score_variants_flops_match_a_brute_force_count_of_the_products(variant, causal):
    # The convention (harness.attention.theory): a variant is elementwise or one logit per row, so FLOPs count the two
    # products over the visible pairs only; a window beside the sinks hides keys, and the count follows it.
    c = case(B=2, S_q=24, S_kv=40, H=4, H_kv=2, d_k=16, d_v=8, causal=causal or "window" in variant, **variant)
    pairs = brute_force_pairs([c.S_q] * c.B, [c.S_kv] * c.B, c.causal, c.window)
    assert theory.flops(c) == 2 * c.H * (c.d_k + c.d_v) * pairs


def test_a_backward_with_d_k_not_d_v_counts_its_five_products():
    """S = Q·Kᵀ, dQ = dS·K and dK = dSᵀ·Q cost 2·d_k per pair, dV = Pᵀ·dO and dP = dO·Vᵀ 2·d_v: 2·H·(3·d_k + 2·d_v)."""
    c = Case(B=2, S_q=64, S_kv=64, H=4, H_kv=4, d_k=192, d_v=128, dtype="bf16", causal=True, mode="bwd")
    pairs = 2 * 64 * 65 // 2
    assert theory.flops(c) == 2 * 4 * pairs * (3 * 192 + 2 * 128)
    assert theory.flops(c) / (2.5 * theory.forward_flops(c)) == pytest.approx(832 / 800)  # 2.5× read 3.8 % low
    assert theory.flops(c.replace(mode="fwd_bwd")) == theory.forward_flops(c) + theory.flops(c)
    square = c.replace(d_k=128)
    assert theory.flops(square) == 2.5 * theory.forward_flops(square)  # the convention holds where d_k = d_v


def test_an_mla_backward_counts_its_dv_write():
    """MLA reads V inside K's latent (no V read), but its backward writes dV: H_kv·d_v per key row beside dQ and dK."""
    c = Case(B=1, S_q=16, S_kv=16, H=8, H_kv=1, d_k=576, d_v=512, dtype="bf16", mla=True, causal=True, mode="bwd")
    t = theory.touched_bytes(c)
    dv = 16 * 1 * 512 * 2
    assert t["v"] == 0
    assert theory.min_bytes(c) == 2 * (t["q"] + t["k"]) + dv + 2 * t["o"]
    assert theory.min_bytes(c.replace(mode="fwd_bwd")) == theory.min_bytes(c) + theory.min_bytes(c.replace(mode="fwd"))
