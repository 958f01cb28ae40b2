"""xFormers on the CPU for the tests: stand-in operators declared as xFormers declares its own, the `xf` fixture, `Bound`.

Only the kernel, which has no CPU build, is a stand-in: its `apply` is the float64 math of
`tests.library_contracts.xformers_emulator`. Shared by tests/test_xformers_library.py and tests/test_gpu_variants.py
(a helper module: a test module imported twice is two copies); a test module using `xf` imports it.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from tests.library_contracts import xformers_emulator
from tests.xformers_real import real_fmha


def stand_in_ops(fmha):
    """A forward and a backward operator declared as xFormers declares its own, but for the CPU; `apply` is the emulated math."""
    common = fmha.common

    def emulated(inp, leaves=None):
        q, k, v = leaves or (inp.query, inp.key, inp.value)
        call = types.SimpleNamespace(q=q, k=k, v=v, attn_bias=inp.attn_bias, scale=inp.scale, view=lambda *t: t)
        return xformers_emulator(call)

    class Declared:
        OPERATOR = "cpu"  # BaseOperator.is_available: anything but None
        SUPPORTED_DEVICES, SUPPORTED_DTYPES, SUPPORTED_MAX_K = {"cpu"}, {torch.float32}, 256
        SUPPORTED_ATTN_BIAS_TYPES = [type(None), *(c for c in vars(fmha.attn_bias).values()
                                                   if isinstance(c, type) and issubclass(c, fmha.attn_bias.AttentionBias))]
        SUPPORTS_DROPOUT, SUPPORTS_CUSTOM_SCALE = False, True

    class CpuFwOp(Declared, common.AttentionFwOpBase):
        NAME, SUPPORTS_BMGHK = "cpuF", True

        @classmethod
        def apply(cls, inp, needs_gradient):
            out = emulated(inp).to(inp.query.dtype)
            lse = torch.zeros(inp.query.shape[0], *inp.query.shape[2:-1], inp.query.shape[1])  # [B, *GH, M]
            return out, common.Context(out=out, lse=lse) if needs_gradient else None

    class CpuBwOp(Declared, common.AttentionBwOpBase):
        NAME, SUPPORTS_BMGHK = "cpuB", False  # as flash.BwOp and cutlass.BwOp

        @classmethod
        def apply(cls, ctx, inp, grad):
            leaves = [t.detach().double().requires_grad_() for t in (inp.query, inp.key, inp.value)]
            with torch.enable_grad():  # _fMHA.backward is once_differentiable: it runs with grad mode off
                grads = torch.autograd.grad(emulated(inp, leaves), leaves, grad.double())
            return common.Gradients(*(g.to(inp.query.dtype) for g in grads))

    return CpuFwOp, CpuBwOp


@pytest.fixture
def xf(monkeypatch):
    """The adapter module, xFormers' dispatcher choosing among the stand-ins, and a count of the dispatcher's runs."""
    import harness.backends.xformers.adapter as adapter

    fmha = real_fmha()
    fw, bw = stand_in_ops(fmha)
    # Without torch.version.cuda (a CPU build) the dispatcher's priority lists are [ck.FwOp] and [ck.BwOp].
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(fmha.dispatch, "ck", types.SimpleNamespace(FwOp=fw, BwOp=bw))
    runs, real_run = [], fmha.dispatch._run_priority_list
    monkeypatch.setattr(fmha.dispatch, "_run_priority_list", lambda name, *a, **k: runs.append(name) or real_run(name, *a, **k))
    return types.SimpleNamespace(adapter=adapter, fmha=fmha, fw=fw, bw=bw, runs=runs)


class Bound:
    """Stands for a real xFormers object: each call is bound to the real signature (a mismatch is a TypeError), then made."""

    def __init__(self, real, name, calls):
        self.real, self.name, self.calls = real, name, calls

    def __call__(self, *args, **kwargs):
        self.calls[self.name] = inspect.signature(self.real).bind(*args, **kwargs)
        return self.real(*args, **kwargs)

    def __getattr__(self, attr):
        return Bound(getattr(self.real, attr), f"{self.name}.{attr}", self.calls)
