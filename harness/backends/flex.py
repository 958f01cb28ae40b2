"""FlexAttention (`torch.nn.attention.flex_attention`) under `torch.compile`, the mask as a block mask.

The mask is written as a `mask_mod` the way users write one (causal as `kv ≤ q + offset`, padding
as `kv < len[b]`), and `create_block_mask` turns it into the block-sparse structure that lets the
kernel skip fully masked tiles. Compilation happens once in `prepare`, timed there and recorded in
the `compile_s` column, never inside latency. On the CPU, inductor generates C++ (it needs a C++
compiler, as for any torch.compile on CPU); on CUDA, Triton kernels.
"""

from __future__ import annotations

import shutil
import time
import weakref
from typing import Any, Callable

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.errors import Unsupported
from harness.suite.inputs import AttentionInputs, kv_lengths, q_lengths


def mask_mod_for(case: Case, device: str | torch.device = "cpu") -> Callable[..., Any] | None:
    """The case's mask as a FlexAttention `mask_mod(b, h, q_idx, kv_idx) -> bool`, or None when nothing is masked.

    Query i of sequence b sits at `i + kv_len[b] − q_len[b]` (bottom-right, per sequence: harness.suite.inputs);
    without padding the offset is the constant S_kv − S_q.
    """
    if not case.masked:
        return None
    window = case.window
    causal = case.causal or window is not None
    if case.padding:
        kv_len = torch.as_tensor(kv_lengths(case), device=device)
        q_len = torch.as_tensor(q_lengths(case), device=device)
        offset = kv_len - q_len

        def padded(b, h, q_idx, kv_idx):
            keep = (kv_idx < kv_len[b]) & (q_idx < q_len[b])
            if causal:
                pos = q_idx + offset[b]
                keep = keep & (kv_idx <= pos)
                if window is not None:
                    keep = keep & (kv_idx > pos - window)
            return keep

        return padded
    shift = case.S_kv - case.S_q

    def dense(b, h, q_idx, kv_idx):
        pos = q_idx + shift
        keep = kv_idx <= pos
        if window is not None:
            keep = keep & (kv_idx > pos - window)
        return keep

    return dense


def compiler_reason(device: str) -> str | None:
    """Why torch.compile cannot generate code for `device` here, or None."""
    if device == "cpu":
        try:
            from torch._inductor import config

            cxx = config.cpp.cxx[0] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
        except Exception:
            cxx = "g++"
        if cxx and not shutil.which(cxx) and not shutil.which("g++") and not shutil.which("clang++"):
            return "torch.compile on CPU needs a C++ compiler (g++ or clang++), and none is on PATH"
    return None


def fresh_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.compile(fn)` with static shapes and no graph breaks, after clearing dynamo's caches.

    Each case is compiled afresh: a worker that runs many shapes would otherwise hit dynamo's
    recompile limit and fall back to eager without saying so (fullgraph makes any break an error).
    """
    torch.compiler.reset()
    return torch.compile(fn, dynamic=False, fullgraph=True)


@register
class FlexBackend(Backend):
    """torch.compile(flex_attention) with the case's mask as a BlockMask; GQA native (enable_gqa)."""

    name = "flex"
    family = "flex"
    description = "torch.compile(flex_attention) with a BlockMask; compile time in compile_s"
    native_gqa = True

    def available(self) -> str | None:
        """Needs torch.nn.attention.flex_attention (torch ≥ 2.5) and a compiler for this machine's device."""
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs ≥ 2.5)"
        return compiler_reason("cpu") if not torch.cuda.is_available() else None

    def supports(self, case: Case) -> str | None:
        """FlexAttention's own limits: fp16/bf16/fp32, and on CUDA head dims of at least 16."""
        reason = super().supports(case)
        if reason:
            return reason
        if case.dtype == "fp64":
            return "flex_attention has no fp64 kernel"
        if case.device == "cpu" and case.mode != "fwd":
            return f"flex_attention has no backward on CPU in torch {torch.__version__} (torch raises NotImplementedError); backward runs on CUDA"
        if case.device == "cuda" and min(case.d_k, case.d_v) < 16:
            return f"flex_attention's CUDA kernels need head dims ≥ 16 (case has d_k={case.d_k}, d_v={case.d_v})"
        return compiler_reason(case.device)

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Build the block mask and compile (both untimed; compile time kept apart), then time the compiled call."""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        q, k, v = inputs.q, inputs.k, inputs.v
        device = q.device
        mod = mask_mod_for(case, device)
        notes: dict[str, Any] = {}
        block_mask = None
        if mod is not None:
            start = time.perf_counter()
            block_mask = create_block_mask(mod, B=case.B if case.padding else None, H=None, Q_LEN=case.S_q, KV_LEN=case.S_kv, device=device)
            notes["block_mask_s"] = time.perf_counter() - start
            notes["block_sparsity"] = round(float(block_mask.sparsity()), 2)
        compiled = fresh_compile(flex_attention)
        gqa = case.H_kv != case.H
        scale = 1.0 / (case.d_k ** 0.5)

        def fn() -> torch.Tensor:
            return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

        try:
            compile_s = compile_timed(fn, case, (q, k, v), notes)
        except torch._dynamo.exc.Unsupported as exc:
            raise Unsupported(f"flex: torch.compile cannot trace this case: {' '.join(str(exc).split())[:200]}") from None
        return Prepared(fn=fn, leaves=(q, k, v), notes=notes, compile_s=compile_s)


def donated_buffer_problem() -> str | None:
    """Why the private `torch._functorch.config.donated_buffer` cannot be turned off here, or None when it is the bool the harness sets."""
    try:
        import torch._functorch.config as functorch_config
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch._functorch.config ({' '.join(str(exc).split())[:200]})"
    value = getattr(functorch_config, "donated_buffer", None)
    if not isinstance(value, bool):
        return f"torch {torch.__version__} has no bool torch._functorch.config.donated_buffer (found {value!r})"
    return None


class DonatedBuffersOff:
    """AOTAutograd's donated buffers off while any compiled `bwd` step lives; the process's own setting back after the last.

    The `bwd` mode differentiates one saved forward many times (retain_graph), which donated
    buffers forbid, and torch reads the flag again on every backward call, not only when it
    compiles: a `config.patch` around the compile is not enough. Tying the setting to the timed
    callable's lifetime keeps it from leaking into later pairs (a `fwd_bwd` pair would otherwise
    be measured with more backward memory or not depending on whether a `bwd` pair ran before it).
    """

    def __init__(self) -> None:
        self.holders = 0
        self.saved: bool | None = None

    def hold(self, owner: object) -> str | None:
        """Turn donated buffers off until `owner` is garbage collected; why they cannot be, or None."""
        problem = donated_buffer_problem()
        if problem:
            return problem
        import torch._functorch.config as functorch_config

        if self.holders == 0:
            self.saved = functorch_config.donated_buffer
            functorch_config.donated_buffer = False
        self.holders += 1
        weakref.finalize(owner, self._release)
        return None

    def _release(self) -> None:
        import torch._functorch.config as functorch_config

        self.holders -= 1
        if self.holders == 0:
            functorch_config.donated_buffer = self.saved


#: The one holder of the process-wide flag, shared by every compiled backend.
DONATED_BUFFERS_OFF = DonatedBuffersOff()


def compile_timed(fn: Callable[[], torch.Tensor], case: Case, leaves: tuple[torch.Tensor, ...],
                  notes: dict[str, Any] | None = None) -> float:
    """Call a freshly compiled `fn` twice; its compile time is the first call's time minus the second's.

    In backward modes each call also differentiates with respect to `leaves`, so the backward graph
    is compiled here too and not on the first timed iteration. In `bwd` mode donated buffers are off
    for as long as `fn` lives (DonatedBuffersOff); when they cannot be turned off, `notes` says why.
    """
    if case.mode == "bwd":
        problem = DONATED_BUFFERS_OFF.hold(fn)
        if problem and notes is not None:
            notes["donated_buffer"] = f"left as torch has it: {problem}"

    def first_calls() -> None:
        out = fn()
        if case.mode != "fwd" and all(t.requires_grad for t in leaves):
            torch.autograd.grad(out, leaves, torch.ones_like(out))

    timings = []
    for _ in range(2):
        if case.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.set_grad_enabled(case.mode != "fwd"):
            first_calls()
        if case.device == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    return max(0.0, timings[0] - timings[1])
