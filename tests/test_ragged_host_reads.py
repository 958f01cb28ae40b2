"""No ragged path reads a tensor back to the host inside its timed call, and SDPA's loop gives each request the lightest right mask.

A host read (`.item()`, `.tolist()`, `int(t)`, a value-dependent shape) is a device-to-host sync on CUDA:
inside the timed call it stalls the measurement and forbids CUDA-graph capture. On the CPU it is seen
two ways: torch's profiler records the aten ops that read (`aten::_local_scalar_dense`, which `.item()`
and `int()` dispatch to, `aten::equal`, `aten::nonzero`, …) at the dispatcher, inside torch's own code
too; a TorchFunctionMode sees the Python-level reads (`Tensor.tolist` reads a CPU tensor without the
dispatcher). Every case goes through the project's own path: `ragged_case`, `make_ragged_inputs`, the
registered backend's `prepare`, and `build_step`, the callable the timer times.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from harness.attention.numerics import check_ragged_forward
from harness.backends.pytorch import sdpa_ragged
from harness.backends.ragged_views import requests
from harness.backends.registry import load_registry
from harness.execution.execute import build_step
from harness.suite.batch_axes import ragged_case
from harness.suite.ragged import make_ragged_inputs, sequence_mask
from tests.ragged_fixtures import agrees, ragged_batch, serving_case

#: aten ops whose result the host reads: a scalar (item, int(), bool(), equal), or an output whose size depends on values.
DISPATCHER_READS = frozenset({
    "aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::allclose", "aten::nonzero", "aten::masked_select",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
})
#: Tensor methods that hand a tensor's values (or a copy of them) to the host.
PYTHON_READS = frozenset({
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.__complex__, torch.Tensor.__array__, torch.Tensor.__repr__,
    torch.Tensor.__format__,
})
#: The serving batches: prefill, decode, mixed, chunked prefill, speculative decoding.
BATCHES = {"prefill": "3x20", "decode": "4x1@64", "mixed": "2x64 + 4x1@64", "chunked": "2x16@64", "speculative": "4x4@64"}
#: Every layout, paged at several page sizes.
LAYOUTS = [("padded", None), ("packed", None), ("paged", 1), ("paged", 16), ("paged", 64)]
CPU_BACKENDS = ["naive", "sdpa", "sdpa-math", "sdpa-flash"]


class _PythonReads(TorchFunctionMode):
    """Records each Python-level call that reads a tensor's values to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_cpu = func is torch.Tensor.to and any(_is_cpu(a) for a in (*args[1:], *kwargs.values()))
        if func in PYTHON_READS or to_cpu:
            self.seen.append(f"Tensor.{func.__name__}")
        return func(*args, **kwargs)


def _is_cpu(argument: Any) -> bool:
    return (isinstance(argument, str) and argument.startswith("cpu")) or (isinstance(argument, torch.device) and argument.type == "cpu")


def host_reads(fn: Callable[[], Any], python_level: bool = True) -> Counter:
    """What one call of `fn` read back to the host, by op or method name (empty: nothing).

    `python_level=False` for a torch.compile'd call: dynamo guards on the torch-function mode stack, so a
    mode would make it retrace and time another graph; the profiler changes nothing of what runs.
    """
    mode = _PythonReads() if python_level else None
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        if mode is None:
            fn()
        else:
            with mode:
                fn()
    seen = Counter(e.name for e in prof.events() if e.name in DISPATCHER_READS)
    return seen + Counter(mode.seen if mode else [])


@pytest.fixture(scope="module")
def registry():
    """The registry every case is prepared by."""
    return load_registry()


# -- the counter sees what it must ------------------------------------------------------------------------------------

T = torch.tensor([3.0, -1.0, 2.0])
NJT_VALUES, NJT_OFFSETS = torch.randn(7, 2, 8), torch.tensor([0, 3, 7])


@pytest.mark.parametrize("read", [
    lambda: T.tolist(), lambda: T[0].item(), lambda: int(T[0]), lambda: float(T[0]), lambda: bool(T[0] > 0),
    lambda: [0, 1, 2, 3][T.long()[0]],
    lambda: T.cpu(), lambda: T.numpy(), lambda: T.to("cpu"), lambda: torch.equal(T, T), lambda: T.nonzero(), lambda: T[T > 0],
    lambda: torch.repeat_interleave(torch.tensor([1, 2])), lambda: f"{T[0]:.1f}",
    # torch's own reads, inside its code: a nested jagged tensor asked for a max length it was not given
    lambda: torch.nested.nested_tensor_from_jagged(NJT_VALUES, NJT_OFFSETS)._get_max_seqlen(),
], ids=["tolist", "item", "int", "float", "bool", "index", "cpu", "numpy", "to_cpu", "equal", "nonzero", "bool_index",
        "repeat_interleave", "format", "njt_max_seqlen"])
def test_the_counter_sees_every_kind_of_host_read(read):
    assert sum(host_reads(read).values()) >= 1


def test_the_counter_sees_nothing_in_device_only_work():
    q = torch.randn(1, 2, 5, 8)
    assert host_reads(lambda: (F.scaled_dot_product_attention(q, q, q, is_causal=True), torch.cat([T, T])[1:4] * 2, T.sum())) == Counter()


# -- every ragged path of every CPU backend: zero host reads in the timed call -----------------------------------------

def _prepared(registry, backend: str, batch: str, layout: str, page_size: int | None, **fields):
    case = ragged_case(batch, layout, H=4, H_kv=2, d_k=16, page_size=page_size, seed=3, **fields)
    chosen = registry.get(backend)
    assert chosen.supports(case) is None
    inputs = make_ragged_inputs(case)
    return case, inputs, chosen.prepare(case, inputs)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
@pytest.mark.parametrize("layout, page_size", LAYOUTS, ids=[f"{lay}{ps or ''}" for lay, ps in LAYOUTS])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_timed_call_of_every_ragged_path_reads_nothing_back(registry, backend, layout, page_size, batch, causal, one_thread):
    case, inputs, prepared = _prepared(registry, backend, batch, layout, page_size, causal=causal)
    step = build_step(case, prepared, inputs)
    assert host_reads(step) == Counter(), prepared.notes  # the first timed call after prepare
    assert host_reads(step) == Counter()  # and every later one
    assert check_ragged_forward(case, inputs, prepared.to_bhsd(step())).agree  # the path that reads nothing is a right one


@pytest.mark.parametrize("layout, page_size", [("padded", None), ("packed", None), ("paged", 16)])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_windowed_batch_reads_nothing_back_either(registry, backend, layout, page_size, one_thread):
    case, inputs, prepared = _prepared(registry, backend, BATCHES["mixed"], layout, page_size, causal=True, window=8)
    step = build_step(case, prepared, inputs)
    assert host_reads(step) == Counter()
    assert check_ragged_forward(case, inputs, prepared.to_bhsd(step())).agree


@pytest.mark.compile
@pytest.mark.parametrize("layout, page_size", [("packed", None), ("paged", 4)])
def test_compiled_flex_reads_nothing_back_in_its_timed_call(registry, layout, page_size, one_thread):
    # The batch of tests/test_flex_layouts.py's compiled test: one graph each layout, compiled once a session (inductor's cache).
    inputs = ragged_batch([4, 1, 6], [9, 13, 6], causal=True, page_size=page_size, seed=4)
    case = serving_case(B=3, S_q=6, S_kv=13, layout=layout, page_size=page_size, causal=True)
    prepared = registry.get("flex").prepare(case, inputs)
    step = build_step(case, prepared, inputs)
    step()
    assert host_reads(step, python_level=False) == Counter()


# -- nested jagged tensors: given their lengths, and not timed where torch would read them ------------------------------

def test_nested_rows_carry_their_min_and_max_length_so_torch_never_reads_them():
    lengths = (3, 4)
    nested = sdpa_ragged.nested_rows(NJT_VALUES, NJT_OFFSETS, lengths)
    asked = {}
    assert host_reads(lambda: asked.update(min=nested._get_min_seqlen(), max=nested._get_max_seqlen())) == Counter()
    assert asked == {"min": 3, "max": 4} and nested.shape[:2] == (2, 2)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-math", "sdpa-flash"])
@pytest.mark.parametrize("layout, page_size", [("packed", None), ("paged", 16)])
def test_on_the_cpu_a_bidirectional_batch_runs_request_by_request_and_says_why(registry, backend, layout, page_size, one_thread):
    case, inputs, prepared = _prepared(registry, backend, BATCHES["mixed"], layout, page_size, causal=False)
    assert prepared.notes["packed_via"] == "per_request_loop"
    assert "reads every request's length back to the host" in prepared.notes["nested_jagged_refused"]
    # The reason is torch's: its math path on nested jagged tensors (the CPU's only one) reads the host even
    # when every length is given. The day this reads nothing, nested jagged tensors can be timed on the CPU.
    q = sdpa_ragged.nested_rows(inputs.q, inputs.cu_seqlens_q.long(), inputs.seq_lens_q)
    k = sdpa_ragged.nested_rows(inputs.k.repeat_interleave(2, dim=1), inputs.cu_seqlens_kv.long(), inputs.seq_lens_kv)
    assert sum(host_reads(lambda: F.scaled_dot_product_attention(q, k, k)).values()) > 0


@pytest.mark.parametrize("synced", [None, "called a synchronizing CUDA operation"])
@pytest.mark.parametrize("layout, page_size", [("packed", None), ("paged", 16)])
def test_nested_jagged_tensors_are_timed_on_cuda_only_where_one_call_never_synchronised(registry, monkeypatch, layout, page_size,
                                                                                       synced, one_thread):
    # The decision on CUDA, run on CPU tensors: CUDA's sync debug mode stands in (the real one is unverified here).
    checked = []
    monkeypatch.setattr(sdpa_ragged, "host_sync", lambda fn: checked.append(fn()) or synced)
    case = ragged_case(BATCHES["mixed"], layout, H=4, H_kv=2, d_k=16, page_size=page_size, seed=3, device="cuda")
    inputs = make_ragged_inputs(case, device="cpu")
    prepared = registry.get("sdpa").prepare(case, inputs)
    assert len(checked) == 1
    if synced is None:
        assert prepared.notes["packed_via"] == "nested_jagged" and prepared.notes["kv_expanded"] is True
        assert agrees(prepared.fn(), inputs)
    else:
        assert prepared.notes["packed_via"] == "per_request_loop" and synced in prepared.notes["nested_jagged_refused"]
    assert registry.get("sdpa-math").prepare(case, inputs).notes["packed_via"] == "per_request_loop"  # math: never nested


# -- the per-request loop's mask arguments -------------------------------------------------------------------------------

def _spied(registry, name: str):
    """A fresh instance of a registered SDPA backend whose every call is recorded as (q_len, kv_len, kwargs)."""
    backend = type(registry.get(name))()
    calls: list[tuple[int, int, dict]] = []
    real = backend._run

    def spy(q, k, v, kwargs):
        calls.append((q.shape[-2], k.shape[-2], kwargs))
        return real(q, k, v, kwargs)

    backend._run = spy
    return backend, calls


def _expected_form(q_len: int, kv_len: int, causal: bool, window: int | None) -> str:
    if window is not None:
        return "bool_mask"
    if not causal or q_len == 1:
        return "none"
    return "is_causal" if q_len == kv_len else "causal_lower_right"


@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 8)], ids=["causal", "bidirectional", "windowed"])
@pytest.mark.parametrize("layout, page_size", [("packed", None), ("paged", 16)])
@pytest.mark.parametrize("backend", ["sdpa", "sdpa-math", "sdpa-flash"])
def test_each_request_gets_no_mask_is_causal_or_a_lower_right_bias_and_a_bool_mask_only_for_a_window(registry, backend, layout,
                                                                                                    page_size, causal, window, one_thread):
    spied, calls = _spied(registry, backend)
    case = ragged_case("2x16 + 3x1@40 + 2x4@24 + 1x12@12", layout, H=4, H_kv=2, d_k=16, page_size=page_size, seed=1, causal=causal,
                       window=window)
    inputs = make_ragged_inputs(case)
    prepared = spied.prepare(case, inputs)
    calls.clear()
    prepared.fn()
    assert prepared.notes["packed_via"] == "per_request_loop"
    assert [(q, kv) for q, kv, _ in calls] == list(zip(inputs.seq_lens_q, inputs.seq_lens_kv))  # one call per request, in order
    forms = []
    for q_len, kv_len, kwargs in calls:
        form = _expected_form(q_len, kv_len, causal, window)
        forms.append(form)
        mask = kwargs.get("attn_mask")
        assert kwargs.get("enable_gqa") is True  # H_kv < H: native GQA, never a copy of K/V
        if form == "none":
            assert mask is None and not kwargs.get("is_causal"), (q_len, kv_len, kwargs)
        elif form == "is_causal":
            assert mask is None and kwargs["is_causal"] is True, (q_len, kv_len, kwargs)
        elif form == "causal_lower_right":
            from torch.nn.attention.bias import CausalBias, CausalVariant

            assert isinstance(mask, CausalBias) and mask.variant == CausalVariant.LOWER_RIGHT and not kwargs.get("is_causal")
            assert (mask.seq_len_q, mask.seq_len_kv) == (q_len, kv_len)
        else:
            assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and not kwargs.get("is_causal")
            assert torch.equal(mask[0, 0], sequence_mask(q_len, kv_len, causal, window))
    assert prepared.notes["mask_forms"] == dict(Counter(forms))


@pytest.mark.parametrize("batch", ["2x16@64", "4x4@64", "2x64 + 4x1@64 + 2x8@40"], ids=["chunked", "speculative", "mixed"])
@pytest.mark.parametrize("layout, page_size", [("packed", None), ("paged", 16)])
@pytest.mark.parametrize("backend", ["sdpa", "sdpa-math", "sdpa-flash"])
def test_the_lower_right_bias_gives_the_bool_masks_output_and_the_float64_reference(registry, backend, layout, page_size, batch,
                                                                                   one_thread):
    from torch.nn.attention.bias import causal_lower_right  # imports torch._dynamo: not at collection, in every worker

    case, inputs, prepared = _prepared(registry, backend, batch, layout, page_size, causal=True)
    assert prepared.notes["mask_forms"]["causal_lower_right"] >= 1
    assert agrees(prepared.to_bhsd(prepared.fn()), inputs)  # the whole batch against each request's float64 reference
    run = registry.get(backend)._run  # inside the backend's own forced-kernel context
    for r, q_len, kv_len in zip(requests(inputs, inputs.k, inputs.v, [None] * inputs.batch_size), inputs.seq_lens_q, inputs.seq_lens_kv):
        if 1 < q_len < kv_len:
            bias = run(r.q, r.k, r.v, {"attn_mask": causal_lower_right(q_len, kv_len), "enable_gqa": True})
            masked = run(r.q, r.k, r.v, {"attn_mask": sequence_mask(q_len, kv_len, True, None)[None, None], "enable_gqa": True})
            torch.testing.assert_close(bias, masked, rtol=0, atol=1e-6)
