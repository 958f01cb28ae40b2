"""xFormers' `memory_efficient_attention`, CUDA only, with the operator it dispatched to in the record.

GQA/MQA use xFormers' 5-D layout `[B, M, G, H, K]`: queries as G = H_kv groups of g heads, K and V
expanded along g with stride 0, so nothing is copied. Masks are xFormers' attention-bias objects,
bottom-right aligned (per sequence with padding), the harness's convention. `xformers_call` is the
translation, a plain function tested on the CPU (its biases materialise on the CPU too); the
kernels have no CPU implementation and are unverified until `make gpu-check` runs on a GPU.

Serving layouts (`xformers_ragged_call`): packed rows as one `[1, T, H, d]` sequence with a
block-diagonal bias (`BlockDiagonalMask`, causal `BlockDiagonalCausalFromBottomRightMask`); paged,
the page pool viewed as `[1, num_pages·page_size, H_kv, d]` with `PagedBlockDiagonalPaddedKeysMask`
(causal: `PagedBlockDiagonalCausalWithOffsetPaddedKeysMask`), which reads sequence b's logical page p
at physical page block_tables[b, p]. A packed training batch is differentiated too: its leaves are the packed
rows themselves, lifted to one sequence inside each call (cutlass's backward takes both block-diagonal biases).

The operators are resolved once, untimed, as xFormers' own dispatcher picks them for these inputs
(`fmha.dispatch._dispatch_fw`, and `_dispatch_bw` for backward modes), recorded in notes and passed
as `op=` to the timed call, so no dispatcher runs inside it; one untimed trial call in every mode turns
a refusal the kernel makes only when called (FlashAttention 2's paged page-size check) into Unsupported.

The score variants and head dims of xFormers' `memory_efficient_attention` (xformers 0.0.35, ops/fmha).

It takes `scale` and nothing else of the variants: no softcap (ops/fmha/flash.py hands FlashAttention
`softcap = 0.0`), no ALiBi (the same call passes `alibi_slopes=None`, and attn_bias has no ALiBi class: only a
materialised tensor bias, which is not adapted here) and no sink argument. Its widest operator, cutlass,
declares `SUPPORTED_MAX_K = 65536` (flash and flash3 256, triton_splitk 512): no head dim above is served.

xFormers' call records: the arguments of one `memory_efficient_attention` call, and a ragged batch's translation into them.

The serving and training layouts' translation is plain CPU-runnable torch (its biases are xFormers' real classes, which
import on the CPU), so the CPU tests check it against the layout contract; `XformersBackend.prepare` makes the call.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.layouts import from_bshd, kv_to_bmghk, pack, to_bshd, unpack, varlen
from harness.backends.ragged_args import is_paged, kernel_block_table, softmax_scale, translation_refusals
from harness.backends.registry import register
from harness.errors import Unsupported, one_line
from harness.private_api import refused_signature
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs
from harness.suite.ragged import RaggedInputs

SCORE_VARIANTS = frozenset({"scale"})
VARIANT_REASONS = {
    "softcap": "memory_efficient_attention has no softcap: its flash operator calls FlashAttention with softcap=0.0",
    "alibi": ("memory_efficient_attention has no ALiBi: no attn_bias class for it, and its flash operator passes alibi_slopes=None "
              "(a materialised tensor bias is not adapted here)"),
    "sinks": "memory_efficient_attention has no attention-sink argument",
}
#: ops/fmha/cutlass.py FwOp.SUPPORTED_MAX_K, the largest of xFormers' CUDA operators.
MAX_HEAD_DIM = 65536


def head_dim_refusal(d_k: int, d_v: int) -> str | None:
    """Why no xFormers operator takes these head dims, or None."""
    if max(d_k, d_v) <= MAX_HEAD_DIM:
        return None
    return f"xformers' operators take head dims up to {MAX_HEAD_DIM} (cutlass FwOp.SUPPORTED_MAX_K); case has d_k={d_k}, d_v={d_v}"


@dataclass
class XformersCall:
    """Arguments of one `memory_efficient_attention` call and the conversions back to `[B, H, S, d]`."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_bias: Any
    scale: float
    #: Runs on the leaves inside the timed call: free views only (reshape of contiguous, stride-0 expand).
    view: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    out_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    q_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    kv_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    grad_from_bhsd: Callable[[torch.Tensor], torch.Tensor]
    notes: dict[str, Any] = field(default_factory=dict)



def xformers_ragged_call(inputs: RaggedInputs, fmha_bias: Any) -> XformersCall:
    """Translate a packed or paged batch into `memory_efficient_attention`'s arguments and bias (untimed).

    q is the packed rows as one sequence `[1, T_q, H, d_k]`; k/v the packed rows `[1, T_kv, H_kv, d]`, or
    for a paged batch the page pools flattened to `[1, num_pages·page_size, H_kv, d]` (a view, no copy).
    """
    q = inputs.q.detach().unsqueeze(0)
    H, d_k = q.shape[2:]
    H_kv = inputs.k.shape[1]
    lens_q, lens_kv = list(inputs.seq_lens_q), list(inputs.seq_lens_kv)
    if is_paged(inputs):
        num_pages, page_size = inputs.k_pages.shape[:2]
        k = inputs.k_pages.detach().reshape(1, num_pages * page_size, H_kv, d_k)
        v = inputs.v_pages.detach().reshape(1, num_pages * page_size, H_kv, inputs.v_pages.shape[-1])
        cls = fmha_bias.PagedBlockDiagonalCausalWithOffsetPaddedKeysMask if inputs.causal else fmha_bias.PagedBlockDiagonalPaddedKeysMask
        bias = cls.from_seqlens(q_seqlen=lens_q, kv_seqlen=lens_kv, block_tables=kernel_block_table(inputs), page_size=page_size,
                                device=inputs.q.device)
    else:
        k, v = inputs.k.detach().unsqueeze(0), inputs.v.detach().unsqueeze(0)
        cls = fmha_bias.BlockDiagonalCausalFromBottomRightMask if inputs.causal else fmha_bias.BlockDiagonalMask
        try:
            bias = cls.from_seqlens(lens_q, lens_kv, device=inputs.q.device)
        except ValueError as exc:  # a causal block with fewer keys than queries: xFormers leaves it undefined
            raise Unsupported(f"xformers: {' '.join(str(exc).split())[:200]}") from None
    g = H // H_kv

    def view(ql: torch.Tensor, kl: torch.Tensor, vl_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if g == 1:
            return ql, kl, vl_
        return ql.view(1, ql.shape[1], H_kv, g, d_k), kv_to_bmghk(kl, g), kv_to_bmghk(vl_, g)

    def to_packed(out: torch.Tensor) -> torch.Tensor:
        return out.reshape(out.shape[1], H, out.shape[-1])

    notes = {"layout": "paged" if is_paged(inputs) else "packed", "attn_bias": type(bias).__name__}
    return XformersCall(q, k, v, bias, softmax_scale(inputs), view, out_to_bhsd=to_packed, q_to_bhsd=to_packed,
                        kv_to_bhsd=to_packed, grad_from_bhsd=one_sequence, notes=notes)


def one_sequence(t: torch.Tensor) -> torch.Tensor:
    """Packed rows `[T, H, d]` as xFormers' one sequence `[1, T, H, d]` (a view: gradients reach the packed leaf)."""
    return t.unsqueeze(0)


def import_xformers() -> tuple[Any, str | None]:
    """`xformers.ops` and, when its compiled extensions failed to load, xFormers' own reason (one line).

    xFormers logs a multi-line warning when its C++/CUDA library does not match torch; it is
    silenced here and turned into the reason instead.
    """
    logger = logging.getLogger("xformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import xformers.ops as xops

        try:
            # Private: where xFormers keeps why its extensions failed to load. Had it moved, that would
            # not mean xFormers is missing (the ImportError available() reports), only that nothing is known.
            from xformers import _cpp_lib
        except ImportError:
            _cpp_lib = None
    finally:
        logger.setLevel(level)
    exc = getattr(_cpp_lib, "_cpp_library_load_exception", None)
    reason = " ".join(str(exc).split("Please reinstall")[0].split()) if exc is not None else None
    return xops, reason


def xformers_version() -> str:
    """The installed xFormers version, from its package metadata."""
    from importlib import metadata

    return metadata.version("xformers")


def dispatch_fw_problem(fmha: Any, name: str = "_dispatch_fw") -> str | None:
    """Why xFormers' private `fmha.dispatch.<name>(inputs, needs_gradient | varlen_lse_packed)` cannot name an operator here, or None."""
    dispatch = getattr(getattr(fmha, "dispatch", None), name, None)
    what, second = ("forward", "needs_gradient") if name == "_dispatch_fw" else ("backward", "varlen_lse_packed")
    if not callable(dispatch):
        return f"xformers {xformers_version()} has no fmha.dispatch.{name} (the private function that names the {what} operator)"
    signature = refused_signature(dispatch, None, False)
    if signature:
        return f"xformers {xformers_version()}: fmha.dispatch.{name}{signature} no longer takes (inputs, {second})"
    return None


def import_failure(exc: ImportError) -> str:
    """available()'s one-line reason when `import xformers.ops` raised: xFormers missing, or which of its modules failed to import what."""
    from importlib.util import find_spec

    if exc.name == "xformers" or find_spec("xformers") is None:
        return "xformers is not installed (pip install xformers; CUDA only, no CPU kernel)"
    where, tb = "xformers.ops", exc.__traceback__
    while tb is not None:  # the innermost xFormers module on the way: the one whose own import failed
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        where, tb = (module if module.startswith("xformers") else where), tb.tb_next
    reason = f"xformers {xformers_version()} is installed but `import xformers.ops` fails in {where}"
    reason += f" importing {exc.name}" if exc.name else ""
    if (exc.name or "").startswith("flash_attn") or "Flash-Attention" in str(exc):
        # flash.py imports flash_attn.flash_attn_interface whenever any `flash_attn` package is found, and
        # flash-attn-4 alone is a `flash_attn` namespace (flash_attn/cute) without it.
        reason += " (xFormers takes any flash_attn package for FlashAttention 2; flash-attn-4 alone lacks flash_attn_interface)"
    return f"{reason}: {one_line(exc)}"


#: How xFormers (`Operator ... does not support inputs`, a ValueError once `op=` is passed) and the kernels behind it
#: word a refusal made only when called (FlashAttention 2: "Paged KV cache block size must be divisible by 256"),
#: as opposed to a failure (out of memory, a CUDA error), which stays an error.
REFUSALS = ("does not support", "not supported", "only support", "must be divisible")


def resolve_ops(fmha: Any, inp: Any, backward: bool, notes: dict[str, Any]) -> tuple[Any, Any] | None:
    """The `(forward, backward)` operators xFormers' dispatcher picks for `inp`, as `op=` takes them, named in notes; None if unnamed."""
    unnamed = dispatch_fw_problem(fmha) or (dispatch_fw_problem(fmha, "_dispatch_bw") if backward else None)
    if unnamed:
        notes["op_fw"], notes["op_fw_unknown"] = None, unnamed
        return None
    try:
        # What _memory_efficient_attention_forward(_requires_grad) would ask for these inputs.
        op_fw = fmha.dispatch._dispatch_fw(inp, backward)
    except NotImplementedError as exc:
        raise Unsupported(f"xformers: {_first_reason(exc)}") from None
    notes["op_fw"] = op_fw.NAME
    if not backward:
        return op_fw, None
    try:
        # What _fMHA.forward would ask: for a varlen bias the forward's LSE format decides (it asserts they agree).
        op_bw = fmha.dispatch._dispatch_bw(inp, varlen_lse_packed=getattr(op_fw, "VARLEN_LSE_PACKED", None))
    except NotImplementedError as exc:
        raise Unsupported(f"xformers backward: {_first_reason(exc)}") from None
    notes["op_bw"] = op_bw.NAME
    return op_fw, op_bw


def trial_call(fn: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...], backward: bool) -> None:
    """One untimed call of `fn` (and its backward in backward modes): a refusal raised only when called becomes Unsupported."""
    try:
        with torch.set_grad_enabled(backward):
            out = fn()
            if backward:
                torch.autograd.grad(out, leaves, torch.ones_like(out))
    except (NotImplementedError, ValueError, RuntimeError) as exc:
        reason = _first_reason(exc)
        if isinstance(exc, NotImplementedError) or ("CUDA error" not in reason and any(words in reason for words in REFUSALS)):
            raise Unsupported(f"xformers{' backward' if backward else ''}: {reason}") from None
        raise


def attention_bias(case: Case, fmha_bias: Any) -> Any:
    """The xFormers attention bias for a case (`fmha_bias` is `xformers.ops.fmha.attn_bias`), or None without a mask.

    Without padding: bottom-right causal, and bottom-right causal-local for a window of w keys.
    With padding: block-diagonal masks over packed queries and padded keys, causal "with offset"
    (aligned to each sequence's own end).
    """
    causal = case.causal or case.window is not None
    if not case.padding:
        if case.window is not None:
            return fmha_bias.LowerTriangularFromBottomRightLocalAttentionMask(case.window)
        return fmha_bias.LowerTriangularFromBottomRightMask() if causal else None
    vl = varlen(case)
    q_seqlen, kv_seqlen = [int(n) for n in vl.q_lens], [int(n) for n in vl.kv_lens]
    if case.window is not None:
        return fmha_bias.BlockDiagonalCausalLocalAttentionPaddedKeysMask.from_seqlens_local(
            q_seqlen=q_seqlen, kv_padding=case.S_kv, kv_seqlen=kv_seqlen, window_size=case.window
        )
    cls = fmha_bias.BlockDiagonalCausalWithOffsetPaddedKeysMask if causal else fmha_bias.BlockDiagonalPaddedKeysMask
    return cls.from_seqlens(q_seqlen=q_seqlen, kv_padding=case.S_kv, kv_seqlen=kv_seqlen)


def xformers_call(case: Case, inputs: AttentionInputs, attn_bias: Any, *, requires_grad: bool = False) -> XformersCall:
    """Translate a case into `memory_efficient_attention`'s arguments (copies made here, untimed).

    Leaves are contiguous BSHD copies: q `[B, S_q, H, d_k]` (packed `[1, Σ q_len, H, d_k]` with padding),
    K/V `[B, S_kv, H_kv, d]` (`[1, B·S_kv, H_kv, d]` with padding: xFormers reads padded keys in place).
    MHA calls the 4-D form; GQA/MQA the 5-D `[B, M, H_kv, g, d]` form.
    """
    g = case.group_size

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(requires_grad)

    q, k, v = (to_bshd(t.detach()) for t in (inputs.q, inputs.k, inputs.v))
    notes: dict[str, Any] = {"layout": "BMHK" if g == 1 else "BMGHK"}
    if case.padding:
        vl = varlen(case, q.device)
        q = pack(q, vl.q_lens).unsqueeze(0)  # [1, Σ q_len, H, d]
        k = k.reshape(1, case.B * case.S_kv, case.H_kv, case.d_k)
        v = v.reshape(1, case.B * case.S_kv, case.H_kv, case.d_v)
        q_back = lambda t: from_bshd(unpack(t.reshape(-1, case.H, t.shape[-1]), vl.q_lens, case.S_q))  # noqa: E731
        kv_back = lambda t: from_bshd(t.reshape(case.B, case.S_kv, case.H_kv, t.shape[-1]))  # noqa: E731
        grad_from = lambda t: pack(to_bshd(t), vl.q_lens).unsqueeze(0)  # noqa: E731
        notes["q_rows"] = int(vl.q_lens.sum())
    else:
        q_back = from_bshd
        kv_back = from_bshd
        grad_from = to_bshd

    def view(ql: torch.Tensor, kl: torch.Tensor, vl_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if g == 1:
            return ql, kl, vl_
        Bq, M = ql.shape[:2]
        return ql.view(Bq, M, case.H_kv, g, case.d_k), kv_to_bmghk(kl, g), kv_to_bmghk(vl_, g)

    return XformersCall(
        leaf(q), leaf(k), leaf(v), attn_bias, 1.0 / math.sqrt(case.d_k), view,
        out_to_bhsd=q_back, q_to_bhsd=q_back, kv_to_bhsd=kv_back, grad_from_bhsd=grad_from, notes=notes,
    )


@register
class XformersBackend(Backend):
    """xformers.ops.memory_efficient_attention (xFormers chooses among its cutlass, flash, ck, triton operators)."""

    name = "xformers"
    family = "xformers"
    description = "xformers.ops.memory_efficient_attention; the operator it dispatched to is in notes"
    devices = ("cuda",)
    native_gqa = True
    layouts = frozenset({"dense", "packed", "paged"})
    feature_reasons = {**VARIANT_REASONS,
                       "deterministic": ("memory_efficient_attention has no deterministic switch: its flash backward passes "
                                         "deterministic=False, and under use_deterministic_algorithms its dispatcher refuses such operators")}
    #: Packed documents under a block-diagonal bias, differentiated (cutlass's BwOp takes both block-diagonal biases).
    ragged_backward = frozenset({"packed"})
    score_variants = SCORE_VARIANTS

    def version(self) -> str:
        """The installed xFormers version."""
        return xformers_version()

    def own_refusals(self, case: Case) -> list[str]:
        """What its ragged translations carry, and head dims an operator takes (devices, layouts, variants: declared)."""
        head_dims = head_dim_refusal(case.d_k, case.d_v)
        return translation_refusals(self, case) + ([head_dims] if head_dims else [])

    def available(self) -> str | None:
        """A CUDA device (xFormers has no CPU kernel), xFormers installed, and its compiled extensions loaded."""
        if not torch.cuda.is_available():
            # Decided before importing xFormers: the import takes seconds and could not change the answer.
            return "no CUDA device: xFormers' memory_efficient_attention has no CPU kernel"
        try:
            _, broken = import_xformers()
        except ImportError as exc:
            return import_failure(exc)
        except Exception as exc:
            return f"xformers failed to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return broken

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Translate the inputs and resolve xFormers' operators (untimed), make one trial call, and time the call with `op=` set."""
        xops, _ = import_xformers()
        from xformers.ops import fmha

        if isinstance(inputs, RaggedInputs):
            call = xformers_ragged_call(inputs, fmha.attn_bias)
            bias = call.attn_bias
        else:
            bias = attention_bias(case, fmha.attn_bias)
            if bias is not None and hasattr(bias, "to"):
                bias = bias.to(inputs.q.device)
            call = xformers_call(case, inputs, bias, requires_grad=case.mode != "fwd")
        call.scale = case.softmax_scale  # the case's own scale (1/√d_k unless it sets one), dense or ragged
        notes = dict(call.notes)
        notes["attn_bias"] = type(bias).__name__ if bias is not None else None
        backward = case.mode != "fwd"
        ql, kl, vl = call.view(call.q, call.k, call.v)
        op = resolve_ops(fmha, fmha.Inputs(query=ql, key=kl, value=vl, attn_bias=bias, scale=call.scale), backward, notes)
        scale, q, k, v = call.scale, call.q, call.k, call.v
        ragged_leaves = isinstance(inputs, RaggedInputs) and backward
        if ragged_leaves:  # a packed training batch differentiates the packed rows themselves, lifted to one sequence per call
            q, k, v = inputs.q, inputs.k, inputs.v

        def fn() -> torch.Tensor:
            # op = (forward, backward): without leaves that need a gradient xFormers runs op[0] alone.
            lifted = (one_sequence(q), one_sequence(k), one_sequence(v)) if ragged_leaves else (q, k, v)
            out = xops.memory_efficient_attention(*call.view(*lifted), attn_bias=bias, scale=scale, op=op)
            # 5-D [B, M, G, g, d] → [B, M, H, d]: a view, so the upstream gradient has the leaves' layout.
            return out.reshape(*out.shape[:2], case.H, case.d_v) if out.dim() == 5 else out

        # Every mode, fwd too: a kernel may refuse only when called (FA2's paged page-size TORCH_CHECK).
        trial_call(fn, (q, k, v), backward)

        def check(result: Any) -> Any:
            from harness.attention.numerics import check_backward, check_forward

            if case.mode == "fwd":
                return check_forward(case, inputs, call.out_to_bhsd(result))
            dq, dk, dv = result
            return check_backward(case, inputs, [call.q_to_bhsd(dq), call.kv_to_bhsd(dk), call.kv_to_bhsd(dv)])

        if isinstance(inputs, RaggedInputs):  # checked by the runner against each sequence's own reference
            return Prepared(fn=fn, leaves=(q, k, v) if backward else (), to_bhsd=call.out_to_bhsd, from_bhsd=call.grad_from_bhsd, notes=notes)
        return Prepared(fn=fn, leaves=(q, k, v), to_bhsd=call.out_to_bhsd, from_bhsd=call.grad_from_bhsd, notes=notes, check=check)


def _first_reason(exc: Exception) -> str:
    """xFormers' 'No operator found' message, condensed to one line."""
    return " ".join(str(exc).split())[:300]
