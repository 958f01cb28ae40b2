"""FlexAttention (`torch.nn.attention.flex_attention`) under `torch.compile`, the mask as a block mask.

The mask is written as a `mask_mod` the way users write one (causal as `kv ≤ q + offset`, padding
as `kv < len[b]`), and `create_block_mask` turns it into the block-sparse structure that lets the
kernel skip fully masked tiles. Compilation happens once in `prepare`, timed there and recorded in
the `compile_s` column, never inside latency. On the CPU, inductor generates C++ (it needs a C++
compiler, as for any torch.compile on CPU); on CUDA, Triton kernels.

Serving layouts (`ragged_mask_mod`): the packed queries are one sequence of T_q rows and each query
row's document (its sequence) is looked up per token. Packed keys are masked to the query's own
document, causal bottom-right within it. Paged keys are the page pool's slots in storage order; a
page table inverted per sequence (physical page → logical page, -1 for a page the sequence does not
own) turns a slot into the sequence's own KV position, as a paged KV cache reads it. The BlockMask
build is the batch's plan, timed into `Prepared.plan_s`.

The score variants FlexAttention computes exactly: softcap and ALiBi as a `score_mod`, sinks through the returned log-sum-exp.

flex_attention's `score_mod(score, b, h, q_idx, kv_idx)` sees each scaled score before the mask, so softcap
(c·tanh(s/c)) and ALiBi (−slope_h·|pos(i) − j|) are exactly what a model writes. Sinks have no argument of
their own, but `return_lse=True` gives each row's log-sum-exp L over its keys, and with one more logit σ in
the denominator every weight is scaled by e^L / (e^L + e^σ) = sigmoid(L − σ): the output is the keys-only
output times that factor, an identity rather than an approximation (a row that sees no key has L = −∞ and stays 0).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import Any, Callable

import torch

from harness.attention.variants import alibi_slopes
from harness.backends.base import Backend, Prepared
from harness.backends.ragged_args import is_paged, pages_used, timed_setup, translation_refusals
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, kv_lengths, q_lengths, query_positions
from harness.suite.ragged import RaggedInputs

#: What flex_attention computes exactly (see the module's docstring); its `scale=` takes a model's own scale.
FLEX_VARIANTS = frozenset({"softcap", "alibi", "sinks", "scale"})


def request_offsets(inputs: RaggedInputs) -> tuple[Any, Any, Any, Any]:
    """A packed batch's per-row request (`document`), each request's first packed row, its key lengths and its bottom-right shift."""
    device = inputs.q.device
    lens_q = torch.as_tensor(inputs.seq_lens_q, device=device)
    lens_kv = torch.as_tensor(inputs.seq_lens_kv, device=device)
    document = torch.repeat_interleave(torch.arange(inputs.batch_size, device=device), lens_q)
    q_start = inputs.cu_seqlens_q[:-1].to(device=device, dtype=torch.int64)
    return document, q_start, lens_kv, lens_kv - lens_q  # query j of a request sits at key position j + shift


def _key_positions(inputs: RaggedInputs) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    """For a packed or paged batch: each packed query row's key position, and a key slot's position in its sequence."""
    device = inputs.q.device
    B = inputs.batch_size
    document, q_start, lens_kv, shift = request_offsets(inputs)

    def query(q_idx):
        seq = document[q_idx]
        return q_idx - q_start[seq] + shift[seq]

    if not is_paged(inputs):
        kv_start = inputs.cu_seqlens_kv[:-1].to(device=device, dtype=torch.int64)
        return query, lambda q_idx, kv_idx: kv_idx - kv_start[document[q_idx]]
    page_size = inputs.page_size
    logical = torch.full((B, inputs.k_pages.shape[0]), -1, dtype=torch.int64, device=device)
    for b, used in enumerate(pages_used(inputs)):
        logical[b, inputs.block_table[b, :used].to(device=device, dtype=torch.int64)] = torch.arange(used, device=device)

    def key(q_idx, kv_idx):
        return logical[document[q_idx], kv_idx // page_size] * page_size + kv_idx % page_size

    return query, key


def score_mod_for(case: Case, inputs: Any) -> Callable[..., Any] | None:
    """The case's softcap and ALiBi as a flex `score_mod(score, b, h, q_idx, kv_idx)`, or None when it has neither."""
    if case.softcap is None and not case.alibi:
        return None
    cap = case.softcap
    if cap is not None:
        def softcap(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / cap) * cap

        return softcap
    device = inputs.q.device
    slopes = alibi_slopes(case.H).to(device)
    if isinstance(inputs, RaggedInputs):
        query, key = _key_positions(inputs)

        def ragged_alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (query(q_idx) - key(q_idx, kv_idx)).abs()

        return ragged_alibi
    positions = torch.as_tensor(query_positions(case), device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (positions[b, q_idx] - kv_idx).abs()

    return alibi


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """flex's keys-only output `[B, H, S, d]` with each head's sink logit joined to its rows' denominators (the docstring's identity)."""
    share = torch.sigmoid(lse.float() - sinks.to(lse.device, torch.float32)[None, :, None])
    return (out.float() * share[..., None]).to(out.dtype)


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


def ragged_mask_mod(inputs: RaggedInputs) -> Callable[..., Any]:
    """The mask of a packed or paged batch as a `mask_mod` over (packed query row, key slot in storage order)."""
    device = inputs.q.device
    B = inputs.batch_size
    document, q_start, lens_kv, shift = request_offsets(inputs)  # bottom-right: query j of a sequence sits at key position j + shift
    causal = inputs.causal
    if not is_paged(inputs):
        kv_document = torch.repeat_interleave(torch.arange(B, device=device), lens_kv)
        kv_start = inputs.cu_seqlens_kv[:-1].to(device=device, dtype=torch.int64)

        def packed(b, h, q_idx, kv_idx):
            seq = document[q_idx]
            keep = kv_document[kv_idx] == seq
            if causal:
                keep = keep & (kv_idx - kv_start[seq] <= q_idx - q_start[seq] + shift[seq])
            return keep

        return packed
    page_size = inputs.page_size
    logical = torch.full((B, inputs.k_pages.shape[0]), -1, dtype=torch.int64, device=device)
    for b, used in enumerate(pages_used(inputs)):
        logical[b, inputs.block_table[b, :used].to(device=device, dtype=torch.int64)] = torch.arange(used, device=device)

    def paged(b, h, q_idx, kv_idx):
        seq = document[q_idx]
        page = logical[seq, kv_idx // page_size]
        position = page * page_size + kv_idx % page_size
        keep = (page >= 0) & (position < lens_kv[seq])
        if causal:
            keep = keep & (position <= q_idx - q_start[seq] + shift[seq])
        return keep

    return paged


def flex_ragged_layout(inputs: RaggedInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of a packed or paged batch as flex's `[1, H, T, d]` (copies, untimed): the page pool keeps its page order."""
    def heads_first(t: torch.Tensor) -> torch.Tensor:
        return t.detach().transpose(0, 1).unsqueeze(0).contiguous()

    if is_paged(inputs):
        k = inputs.k_pages.reshape(-1, *inputs.k_pages.shape[2:])
        v = inputs.v_pages.reshape(-1, *inputs.v_pages.shape[2:])
    else:
        k, v = inputs.k, inputs.v
    return heads_first(inputs.q), heads_first(k), heads_first(v)


def compiler_reason(device: str) -> str | None:
    """Why torch.compile cannot generate code for `device` here, or None."""
    if device == "cpu":
        if shutil.which("g++") or shutil.which("clang++"):  # either serves whatever inductor names: its config (seconds to import) is not read
            return None
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
    layouts = frozenset({"dense", "packed", "paged"})
    #: flex_attention has no deterministic option of its own; its Triton backward honours torch's deterministic
    #: algorithms (torch._inductor.kernel.flex: only the FLASH backend with a block mask before SM100 raises).
    deterministic_backward = True
    #: Packed documents under the document mask: the `[1, H, T, d]` copies are the leaves (CUDA only: no CPU backward).
    ragged_backward = frozenset({"packed"})
    dtypes = frozenset({"fp32", "fp16", "bf16"})
    feature_reasons = {"dtype:fp64": "flex_attention has no fp64 kernel",
                       **dict.fromkeys(("dtype:fp8_e4m3", "dtype:fp8_e5m2"),
                                       "flex_attention takes FP8 Q, K, V on CUDA sm89-sm100 (it lays them out for "
                                       "FP8 GEMMs) but no per-tensor descales, only one scale: not adapted")}
    score_variants = FLEX_VARIANTS

    def available(self) -> str | None:
        """Needs torch.nn.attention.flex_attention (torch ≥ 2.5) and a compiler for this machine's device."""
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs ≥ 2.5)"
        return compiler_reason("cpu") if not torch.cuda.is_available() else None

    def own_refusals(self, case: Case) -> list[str]:
        """FlexAttention's own limits by device: no sinks or backward on CPU, head dims of at least 16 on CUDA; a compiler."""
        reasons = []
        if case.device == "cpu" and case.sinks:
            reasons.append(f"flex does not support sinks on CPU (torch {torch.__version__}'s CPU flex_attention has no return_lse, "
                           "the log-sum-exp a sink's share is computed from)")
        if case.device == "cpu" and case.mode != "fwd":
            reasons.append(f"flex_attention has no backward on CPU in torch {torch.__version__} (torch raises NotImplementedError); "
                           "backward runs on CUDA")
        if case.device == "cuda" and min(case.d_k, case.d_v) < 16:
            reasons.append(f"flex_attention's CUDA kernels need head dims ≥ 16 (case has d_k={case.d_k}, d_v={case.d_v})")
        compiler = compiler_reason(case.device)
        return reasons + translation_refusals(self, case) + ([compiler] if compiler else [])

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Build the block mask (the plan, timed into plan_s) and compile (compile time kept apart), then time the compiled call."""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        to_bhsd: Callable[[torch.Tensor], torch.Tensor] | None = None
        if isinstance(inputs, RaggedInputs):
            q, k, v = (t.requires_grad_(case.mode != "fwd") for t in flex_ragged_layout(inputs))
            mod, batch = ragged_mask_mod(inputs), None
            to_bhsd = _packed_rows  # [1, H, T_q, d_v] → the packed [T_q, H, d_v]
        else:
            q, k, v = inputs.q, inputs.k, inputs.v
            mod, batch = mask_mod_for(case, q.device), (case.B if case.padding else None)
        device = q.device
        notes: dict[str, Any] = {"layout": "paged" if is_paged(inputs) else "packed"} if to_bhsd else {}
        block_mask, plan_s = None, None
        if mod is not None:
            block_mask, plan_s = timed_setup(
                lambda: create_block_mask(mod, B=batch, H=None, Q_LEN=q.shape[2], KV_LEN=k.shape[2], device=device), device)
            notes["block_sparsity"] = round(float(block_mask.sparsity()), 2)
        compiled = fresh_compile(flex_attention)
        gqa = k.shape[1] != q.shape[1]
        scale, score_mod, sinks = case.softmax_scale, score_mod_for(case, inputs), inputs.sinks

        def fn() -> torch.Tensor:
            if sinks is None:
                return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
            out, lse = compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_lse=True)
            return with_sinks(out, lse, sinks)

        try:
            compile_s = compile_timed(fn, case, (q, k, v))
        except torch._dynamo.exc.Unsupported as exc:
            raise Unsupported(f"flex: torch.compile cannot trace this case: {' '.join(str(exc).split())[:200]}") from None
        if to_bhsd is not None and case.mode != "fwd":
            # A packed document batch in training: one sequence of T tokens whose gradients come back as the packed rows.
            return Prepared(fn=fn, leaves=(q, k, v), to_bhsd=to_bhsd, from_bhsd=lambda g: g.transpose(0, 1).unsqueeze(0),
                            grads_to_packed=lambda grads: [_packed_rows(g) for g in grads], notes=notes, compile_s=compile_s, plan_s=plan_s)
        if to_bhsd is not None:
            return Prepared(fn=fn, to_bhsd=to_bhsd, notes=notes, compile_s=compile_s, plan_s=plan_s)
        return Prepared(fn=fn, leaves=(q, k, v), notes=notes, compile_s=compile_s, plan_s=plan_s)


def _packed_rows(out: torch.Tensor) -> torch.Tensor:
    """flex's `[1, H, T_q, d_v]` output as the packed `[T_q, H, d_v]` rows of RaggedInputs."""
    return out[0].transpose(0, 1)


def compile_timed(fn: Callable[[], torch.Tensor], case: Case, leaves: tuple[torch.Tensor, ...]) -> float:
    """Call a freshly compiled `fn` twice; its compile time is the first call's time minus the second's.

    In backward modes each call also differentiates with respect to `leaves`, so the backward graph
    is compiled here too and not on the first timed iteration. In `bwd` mode that first backward
    keeps its graph, as every timed one does: AOTAutograd compiles a backward first called that way
    without donated buffers (they forbid retain_graph), so `torch._functorch.config.donated_buffer`
    is never touched and the process keeps its own setting for every pair, before and after this one.
    That compile must be a real one, never a cached graph: see `_uncached_compile`.
    """
    retain = case.mode == "bwd"

    def first_calls() -> None:
        out = fn()
        if case.mode != "fwd" and all(t.requires_grad for t in leaves):
            torch.autograd.grad(out, leaves, torch.ones_like(out), retain_graph=retain)

    timings = []
    with _uncached_compile() if retain else contextlib.nullcontext():
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


def _uncached_compile() -> contextlib.ExitStack:
    """AOTAutograd's and inductor's compiled-graph caches off for this compile only (both private config flags).

    A backward compiled for a single use (a `fwd_bwd` pair, or any earlier process: both caches live on
    disk) may reuse its saved tensors' memory in place ("donated buffers"). Inductor's FX graph cache
    keys the backward graph without the donated-buffer list, so a `bwd` step's retain_graph backward
    was served that graph: its first call was right and every later one read the buffers the first
    had overwritten (torch 2.13: 6 of 8 naive-compiled `bwd` cases disagreed by 1e2-1e3 after a
    `fwd_bwd` run of the same shapes). With neither cache its backward is compiled here, for
    retain_graph, and nothing from it is stored to change a later pair. A torch without a flag has
    no such cache to bypass.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    for config, flag in ((functorch_config, "enable_autograd_cache"), (inductor_config, "fx_graph_cache")):
        if isinstance(getattr(config, flag, None), bool):
            stack.enter_context(config.patch(**{flag: False}))
    return stack
