"""GPU adapters' control flow on the CPU, with the GPU library's kernel replaced by a stand-in.

The kernels cannot run here; what is checked is how an adapter reacts to what the library does
(a refusal raised only when backward runs), and the CUDA clock's event/spin ordering against a
simulated device timeline.
"""

import pytest
import torch

from harness.cases import Case
from harness.errors import Unsupported
from harness.inputs import make_inputs


class _RefusingBackward(torch.autograd.Function):
    """Forward returns its input; backward raises as xFormers does when no backward operator fits."""

    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("No operator found for `memory_efficient_attention_backward` with inputs: BMGHK")


def _fake_xformers(monkeypatch, *, backward_ok: bool):
    pytest.importorskip("xformers")
    import harness.backends.xformers as xf
    from harness.backends.xformers import import_xformers

    import_xformers()
    from xformers.ops import fmha

    class FakeOp:
        NAME = "fake_fw"

    class FakeXops:
        @staticmethod
        def memory_efficient_attention(q, k, v, attn_bias=None, scale=None):
            out = q * 1.0 if backward_ok else _RefusingBackward.apply(q)
            return out + 0.0 * (k.sum() + v.sum())

    monkeypatch.setattr(xf, "import_xformers", lambda: (FakeXops, None))
    monkeypatch.setattr(fmha.dispatch, "_dispatch_fw", lambda inp, needs_gradient: FakeOp)
    return xf.XformersBackend()


GQA_BWD = Case(B=1, S_q=8, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16, dtype="fp32", mode="bwd", causal=True)


def test_xformers_backward_refusal_is_unsupported_not_an_error(monkeypatch):
    backend = _fake_xformers(monkeypatch, backward_ok=False)
    inputs = make_inputs(GQA_BWD)
    with pytest.raises(Unsupported, match="xformers backward: No operator found"):
        backend.prepare(GQA_BWD, inputs)


def test_xformers_backward_probe_passes_when_backward_runs(monkeypatch):
    backend = _fake_xformers(monkeypatch, backward_ok=True)
    prepared = backend.prepare(GQA_BWD, make_inputs(GQA_BWD))
    assert prepared.notes["op_fw"] == "fake_fw" and all(t.requires_grad for t in prepared.leaves)
