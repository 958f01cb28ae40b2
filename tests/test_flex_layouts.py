"""FlexAttention on the serving layouts, run for real on the CPU, and compiled backward steps leaving donated_buffer alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch._functorch.config as functorch_config

from harness.backends.pytorch.flex import FlexBackend, flex_ragged_layout, ragged_mask_mod
from tests.ragged_fixtures import agrees, ragged_batch, serving_case

BATCHES = [([5, 3, 7], [5, 3, 7]), ([4, 2, 6], [9, 13, 6]), ([1, 1, 1, 1], [7, 16, 3, 11]), ([3, 3, 3], [10, 5, 17])]


def visible(inputs) -> torch.Tensor:
    """[T_q, key slots] booleans from the layout contract alone: own sequence, below its length, causal bottom-right."""
    T_q = sum(inputs.seq_lens_q)
    paged = inputs.block_table is not None
    slots = inputs.k_pages.shape[0] * inputs.page_size if paged else sum(inputs.seq_lens_kv)
    out = torch.zeros(T_q, slots, dtype=torch.bool)
    for b, (n_q, n_kv) in enumerate(zip(inputs.seq_lens_q, inputs.seq_lens_kv)):
        q0, k0 = int(inputs.cu_seqlens_q[b]), int(inputs.cu_seqlens_kv[b])
        for j in range(n_q):
            for t in range(n_kv):
                if inputs.causal and t > j + n_kv - n_q:
                    continue
                slot = int(inputs.block_table[b, t // inputs.page_size]) * inputs.page_size + t % inputs.page_size if paged else k0 + t
                out[q0 + j, slot] = True
    return out


def layouts():
    out = []
    for i, (lq, lkv) in enumerate(BATCHES):
        for causal in (False, True):
            for ps in (None, 1, 4):
                out.append(pytest.param(ragged_batch(lq, lkv, causal=causal, page_size=ps, seed=i),
                                        id=f"{lq}-{lkv}-{'causal' if causal else 'full'}-{'packed' if ps is None else f'ps{ps}'}"))
    return out


@pytest.mark.parametrize("inputs", layouts())
def test_ragged_mask_mod_is_the_layout_contract(inputs):
    mod = ragged_mask_mod(inputs)
    expected = visible(inputs)
    q_idx = torch.arange(expected.shape[0])[:, None]
    kv_idx = torch.arange(expected.shape[1])[None, :]
    assert torch.equal(mod(torch.zeros(()), torch.zeros(()), q_idx, kv_idx), expected)


def _eager_flex(inputs) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = flex_ragged_layout(inputs)
    block_mask = create_block_mask(ragged_mask_mod(inputs), B=None, H=None, Q_LEN=q.shape[2], KV_LEN=k.shape[2], device="cpu")
    return flex_attention(q, k, v, block_mask=block_mask, scale=q.shape[-1] ** -0.5, enable_gqa=True)[0].transpose(0, 1)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("inputs", [p for p in layouts() if "ps1" not in p.id])
def test_flex_attention_with_the_ragged_block_mask_meets_the_reference(inputs):
    assert agrees(_eager_flex(inputs), inputs)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_page_table_read_in_order_would_be_caught():
    inputs = ragged_batch([2, 3], [9, 6], page_size=4, causal=True, seed=2)
    in_order = torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32)
    assert not torch.equal(in_order, inputs.block_table)
    assert not agrees(_eager_flex(dataclasses.replace(inputs, block_table=in_order)), inputs)


def test_flex_serves_packed_and_paged_forward_and_packed_backward_on_cuda():
    flex = FlexBackend()
    for layout in ("packed", "paged"):
        assert flex.supports(serving_case(layout=layout, page_size=4 if layout == "paged" else None)) is None
    assert "paged KV cache" in flex.supports(serving_case(device="cuda", layout="paged", page_size=4, mode="fwd_bwd"))
    assert flex.supports(serving_case(device="cuda", layout="packed", mode="fwd_bwd")) is None
    assert "padded" in flex.supports(serving_case(layout="padded"))


@pytest.mark.compile
@pytest.mark.parametrize("page_size", [None, 4], ids=["packed", "paged"])
def test_compiled_flex_runs_a_ragged_batch_on_cpu_with_its_block_mask_as_the_plan(page_size, one_thread):
    inputs = ragged_batch([4, 1, 6], [9, 13, 6], causal=True, page_size=page_size, seed=4)
    case = serving_case(B=3, S_q=6, S_kv=13, layout="packed" if page_size is None else "paged", page_size=page_size, causal=True)
    prepared = FlexBackend().prepare(case, inputs)
    assert prepared.plan_s is not None and prepared.plan_s > 0 and prepared.compile_s is not None
    assert prepared.notes["layout"] == ("packed" if page_size is None else "paged")
    assert agrees(prepared.to_bhsd(prepared.fn()), inputs)


@pytest.mark.compile
def test_compiled_bwd_leaves_donated_buffer_as_the_process_has_it_after_prepare_and_after_the_step(one_thread):
    from harness.backends.pytorch.compiled import NaiveCompiledBackend
    from harness.execution.execute import build_step
    from harness.execution.shared_inputs import InputsCache
    from harness.suite.cases import Case

    own = functorch_config.donated_buffer
    functorch_config.donated_buffer = True  # torch's default, set so that no earlier test's leftover decides
    try:
        seen = []
        # fwd_bwd first: its graph, backward compiled with donated buffers, lands in AOTAutograd's cache.
        for mode in ("fwd_bwd", "bwd"):
            case = Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, mode=mode)
            inputs, _ = InputsCache().get(case)  # as the executor hands them: q, k, v requiring grad
            prepared = NaiveCompiledBackend().prepare(case, inputs)
            seen.append(functorch_config.donated_buffer)
            step = build_step(case, prepared, inputs)
            grads = [step() for _ in range(3)]  # bwd: retain_graph backward, which donated buffers would refuse
            seen.append(functorch_config.donated_buffer)
    finally:
        functorch_config.donated_buffer = own
    assert seen == [True] * 4
    assert all(torch.equal(g[0], grads[0][0]) for g in grads)
