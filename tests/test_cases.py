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
