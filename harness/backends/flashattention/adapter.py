"""FlashAttention 2, 3 and 4 (Dao-AILab), each where installed, on CUDA only.

- `flash-attn2`: `flash_attn.flash_attn_func`, and `flash_attn_varlen_func` for padded batches.
- `flash-attn3`: the hopper/ build, `flash_attn_interface` (its default build has sm80 and sm90 kernels).
- `flash-attn4`: the CuTe-DSL build, `flash_attn.cute` (forward on sm80-sm120, backward sm90 and newer).

Serving layouts (a `RaggedInputs` batch): packed → `flash_attn_varlen_func` on the packed rows with
`cu_seqlens_q/k`; paged → `flash_attn_with_kvcache` with `cache_seqlens` and the block table (FA2's
`block_table`, FA3's `page_table`) when every sequence has the same query length, else the varlen
function over the pages (FA2: `block_table` with `cu_seqlens_k`; FA3: `flash_attn_with_kvcache` with
`cu_seqlens_q`; FA4 always: `flash_attn_varlen_func` with `page_table` and `seqused_k`). Packed documents train
through `flash_attn_varlen_func` too: its autograd Function differentiates the packed rows (a paged cache has no backward).

`flash_call` (dense) and `flash_ragged_call` translate a case into the named function's arguments
(BSHD layout, packed rows with cumulative sequence lengths, window sizes): plain functions of
CPU-runnable torch code whose calls are bound to the libraries' real signatures on the CPU
(tests/test_flash_attn_library.py). Head-dim, GPU and page-size limits are the libraries' own
(harness.backends.flashattention.rules); every `prepare` makes one untimed call, so a limit no rule states
(a build compiled without some head dim) is `Unsupported` in the library's words. The kernels need a
GPU and are unverified until `make gpu-check` runs on one. FlashAttention aligns causal masks
bottom-right, per sequence in varlen mode: the harness's convention (harness.suite.inputs), so no
case needs to be refused for alignment.

FlashAttention's arguments for a ragged batch: packed rows with `cu_seqlens`, or the page pools behind a block table.

Plain functions of CPU-runnable torch code (`prepare` below calls them), so the CPU tests
bind their calls to the libraries' real signatures and check the translation against the layout contract.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.flashattention.rules import (
    SCORE_VARIANTS,
    VARIANT_REASONS,
    arch_refusal,
    head_dim_refusal,
    is_refusal,
    paged_refusal,
    variant_kwargs,
)
from harness.backends.layouts import Varlen, from_bshd, is_causal, pack, to_bshd, unpack, varlen, window_size
from harness.backends.ragged_args import (
    case_layout,
    is_paged,
    kernel_block_table,
    lengths_int32,
    softmax_scale,
    translation_refusals,
    uniform_length,
)
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.case_values import FP8_DTYPES
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs
from harness.suite.ragged import RaggedInputs


@dataclass
class FlashRaggedCall:
    """One FlashAttention call on a ragged batch: the function's name, its arguments, and how its output becomes `[T_q, H, d_v]`."""

    function: str
    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, Any]
    to_packed: Callable[[torch.Tensor], torch.Tensor]


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def flash_ragged_call(inputs: RaggedInputs, generation: int) -> FlashRaggedCall:
    """Translate a packed or paged batch into FlashAttention `generation`'s (2, 3 or 4) arguments (untimed).

    Paged: k/v are the page pools `[num_pages, page_size, H_kv, d]` as they lie; unused block-table
    entries point at page 0 (ragged_args.kernel_block_table), never read past a sequence's length.
    """
    q = inputs.q.detach()
    device = q.device
    lens_q = inputs.seq_lens_q
    common: dict[str, Any] = {"softmax_scale": softmax_scale(inputs), "causal": inputs.causal}
    ragged_q = {"cu_seqlens_q": inputs.cu_seqlens_q.to(torch.int32), "max_seqlen_q": max(lens_q)}
    if not is_paged(inputs):
        kwargs = {**ragged_q, "cu_seqlens_k": inputs.cu_seqlens_kv.to(torch.int32), "max_seqlen_k": max(inputs.seq_lens_kv), **common}
        return FlashRaggedCall("flash_attn_varlen_func", (q, inputs.k.detach(), inputs.v.detach()), kwargs, _same)
    pools = (q, inputs.k_pages.detach(), inputs.v_pages.detach())
    table = kernel_block_table(inputs)
    kv_lens = lengths_int32(inputs.seq_lens_kv, device)
    if generation == 4:
        kwargs = {**ragged_q, "seqused_k": kv_lens, "page_table": table, **common}
        return FlashRaggedCall("flash_attn_varlen_func", pools, kwargs, _same)
    table_name = "block_table" if generation == 2 else "page_table"
    S_q = uniform_length(lens_q)
    if S_q is not None:
        # Every sequence has S_q queries, so the packed rows are already the documented [B, S_q, H, d].
        H, d = q.shape[1:]
        q_bshd = q.reshape(len(lens_q), S_q, H, d)
        kwargs = {"cache_seqlens": kv_lens, table_name: table, **common}
        return FlashRaggedCall("flash_attn_with_kvcache", (q_bshd, *pools[1:]), kwargs, lambda out: out.reshape(-1, H, out.shape[-1]))
    if generation == 2:
        kwargs = {**ragged_q, "cu_seqlens_k": inputs.cu_seqlens_kv.to(torch.int32), "max_seqlen_k": max(inputs.seq_lens_kv),
                  "block_table": table, **common}
        return FlashRaggedCall("flash_attn_varlen_func", pools, kwargs, _same)
    kwargs = {**ragged_q, "cache_seqlens": kv_lens, "page_table": table, **common}
    return FlashRaggedCall("flash_attn_with_kvcache", pools, kwargs, _same)


@dataclass
class FlashCall:
    """The arguments of one FlashAttention call, and how to turn its results back into `[B, H, S, d]`.

    Dense: q, k, v are `[B, S, H, d]` for `flash_attn_func`. Varlen: `[Σ len, H, d]` for
    `flash_attn_varlen_func`, with `cu_seqlens_q/k` and `max_seqlen_q/k` in `kwargs`; the call is
    `function(q, k, v, **kwargs)`. `q_to_bhsd` converts the output and dQ; `kv_to_bhsd` dK and dV.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any]
    is_varlen: bool
    q_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    kv_to_bhsd: Callable[[torch.Tensor], torch.Tensor]
    grad_from_bhsd: Callable[[torch.Tensor], torch.Tensor]
    layout: dict[str, Any] = field(default_factory=dict)
    function: str = "flash_attn_func"


def flash_call(case: Case, inputs: AttentionInputs, *, none_window: int | None = -1, requires_grad: bool = False) -> FlashCall:
    """Translate a case's inputs into FlashAttention's arguments (copies made here, outside any timed region).

    GQA/MQA: K and V keep their H_kv heads; FlashAttention pairs query head h with K/V head h // (H/H_kv).
    Padding: `flash_attn_varlen_func` with packed rows and `cu_seqlens`; queries are packed with the
    keys' lengths in self-attention over a padded batch (S_q = S_kv), else all S_q query rows are real.
    """
    kwargs: dict[str, Any] = {"softmax_scale": case.softmax_scale, "causal": is_causal(case), "window_size": window_size(case, none=none_window)}
    if case.deterministic:  # only when asked, so a plain call stays what it always was
        kwargs["deterministic"] = True

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(requires_grad)

    q, k, v = (to_bshd(t.detach()) for t in (inputs.q, inputs.k, inputs.v))
    if inputs.descales:
        kwargs.update(fp8_descales(case, inputs.descales))
    if not case.padding:
        return FlashCall(
            leaf(q), leaf(k), leaf(v), kwargs, False,
            q_to_bhsd=from_bshd, kv_to_bhsd=from_bshd, grad_from_bhsd=to_bshd, layout={"layout": "BSHD"},
            function="flash_attn_func",
        )
    vl: Varlen = varlen(case, q.device)
    kwargs.update(cu_seqlens_q=vl.cu_q, cu_seqlens_k=vl.cu_k, max_seqlen_q=vl.max_q, max_seqlen_k=vl.max_k)
    S_q, S_kv = case.S_q, case.S_kv
    return FlashCall(
        leaf(pack(q, vl.q_lens)), leaf(pack(k, vl.kv_lens)), leaf(pack(v, vl.kv_lens)), kwargs, True,
        q_to_bhsd=lambda t: from_bshd(unpack(t, vl.q_lens, S_q)),
        kv_to_bhsd=lambda t: from_bshd(unpack(t, vl.kv_lens, S_kv)),
        grad_from_bhsd=lambda t: pack(to_bshd(t), vl.q_lens),
        layout={"layout": "varlen", "total_q": int(vl.q_lens.sum()), "total_k": int(vl.kv_lens.sum())},
        function="flash_attn_varlen_func",
    )


def fp8_descales(case: Case, descales: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FlashAttention 3's FP8 descales: `q_descale`, `k_descale`, `v_descale`, each float32 `(batch, num_heads_k)` (one per-tensor value, expanded)."""
    return {f"{name}_descale": descales[name].to(torch.float32).reshape(1, 1).expand(case.B, case.H_kv).contiguous()
            for name in ("q", "k", "v")}


def first(result: Any) -> torch.Tensor:
    """The output of a FlashAttention call: some versions return `(out, lse)` or `(out, lse, …)`."""
    return result[0] if isinstance(result, (tuple, list)) else result


def cuda_capability() -> tuple[int, int] | None:
    """The compute capability of CUDA device 0, or None without one."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(0)


class _FlashBase(Backend):
    family = "flash-attn"
    devices = ("cuda",)
    native_gqa = True
    #: flash_attn_func and flash_attn_varlen_func take `deterministic` in FA2, FA3 and FA4 (flash_attn.cute): passed by flash_call.
    deterministic_backward = True
    #: Module to import, and the pip package that provides it.
    module: ClassVar[str] = ""
    package: ClassVar[str] = ""
    #: Distribution name whose version is reported.
    dist: ClassVar[str] = ""
    #: Compute capabilities (major versions) the build has kernels for, and in words.
    majors: ClassVar[tuple[int, ...]] = ()
    arch_words: ClassVar[str] = ""
    #: How the build spells an unbounded window side.
    none_window: ClassVar[int | None] = -1
    layouts = frozenset({"dense", "packed", "paged"})
    dtypes = frozenset({"fp16", "bf16"})
    #: Packed documents (varlen) forward and backward, as pretraining runs them; unverified on a GPU.
    ragged_backward = frozenset({"packed"})
    #: The FlashAttention generation (2, 3, 4): its head-dim and page rules (flash_rules), and which
    #: function and argument names serve a paged batch.
    generation: ClassVar[int] = 2

    def _import(self) -> Any:
        return importlib.import_module(self.module)

    def version(self) -> str:
        """The installed FlashAttention version."""
        mod = self._import()
        return str(getattr(mod, "__version__", None) or _dist_version(self.dist) or "unknown")

    def available(self) -> str | None:
        """Installed, importable, a CUDA device, and one of the architectures the build has kernels for."""
        try:
            mod = self._import()
        except ImportError as exc:
            return f"{self.module} is not installed ({self.package}; FlashAttention runs on CUDA only, no CPU kernel): {exc}"
        except Exception as exc:  # a broken build (ABI mismatch with torch) is unavailable, not a crash
            return f"{self.module} failed to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        # flash-attn-4 alone leaves `flash_attn` importable as a bare namespace (only `flash_attn.cute`):
        # that is FlashAttention 2 missing, not a backend that fails on its first call.
        missing = [f for f in ("flash_attn_func", "flash_attn_varlen_func") if not hasattr(mod, f)]
        if missing:
            return f"{self.module} has no {' or '.join(missing)}: {self.name} is not installed ({self.package})"
        cc = cuda_capability()
        if cc is None:
            return f"no CUDA device: {self.name} has no CPU kernel"
        if cc[0] not in self.majors:
            return f"{self.name} needs {self.arch_words}; this GPU is sm{cc[0]}{cc[1]}"
        return None

    def own_refusals(self, case: Case) -> list[str]:
        """The library's own FP8, head-dim, GPU and page-size rules (harness.backends.flashattention.rules); dtypes, layouts: declared."""
        reasons = []
        if case.dtype in FP8_DTYPES and (case.mode != "fwd" or case.padding):
            reasons.append(f"{self.name}'s FP8 path is the dense forward (flash_attn_func with q/k/v_descale): "
                           f"no {case.mode if case.mode != 'fwd' else 'varlen'} FP8")
        # The rules differ by GPU (FA3's d_v ≠ d_k, FA4's head dims): this machine's GPU when it has one.
        cc = cuda_capability()
        major = cc[0] if cc else None
        words = head_dim_refusal(self.generation, case.d_k, case.d_v, backward=case.mode != "fwd", major=major,
                                 fp8=case.dtype in FP8_DTYPES)
        if words:
            reasons.append(f"{self.name} {words}; case has d_k={case.d_k}, d_v={case.d_v}")
        words = arch_refusal(self.generation, case, major)  # the declared variants, on this GPU
        if words:
            reasons.append(f"{self.name} {words}")
        reasons += translation_refusals(self, case)
        page_size = getattr(case, "page_size", None)
        if case_layout(case) == "paged" and page_size:
            words = paged_refusal(self.generation, page_size, major)
            reasons += [f"{self.name} {words}"] if words else []
        return reasons

    def _trial(self, fn: Callable[[], Any], function: str) -> None:
        """One untimed call: a build or kernel that refuses the configuration says so only when called."""
        try:
            fn()
        except (RuntimeError, AssertionError, NotImplementedError, ValueError) as exc:
            message = " ".join(str(exc).split())[:300]
            if is_refusal(message):
                raise Unsupported(f"{self.name} {function}: {message}") from None
            raise

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Translate the inputs, make one untimed trial call, then time that call."""
        if isinstance(inputs, RaggedInputs):
            return self._prepare_ragged(case, inputs)
        call = flash_call(case, inputs, none_window=self.none_window, requires_grad=case.mode != "fwd")
        kernel = getattr(self._import(), call.function)
        q, k, v = call.q, call.k, call.v
        kwargs = {**call.kwargs, **variant_kwargs(self.generation, case, inputs.sinks, q.device)}

        def fn() -> torch.Tensor:
            return first(kernel(q, k, v, **kwargs))

        self._trial(fn, call.function)

        def check(result: Any) -> Any:
            from harness.attention.numerics import check_backward, check_forward

            if case.mode == "fwd":
                return check_forward(case, inputs, call.q_to_bhsd(result))
            dq, dk, dv = result
            return check_backward(case, inputs, [call.q_to_bhsd(dq), call.kv_to_bhsd(dk), call.kv_to_bhsd(dv)])

        notes = {**call.layout, "kernel": f"{self.module}.{call.function}"}
        return Prepared(fn=fn, leaves=(q, k, v), to_bhsd=call.q_to_bhsd, from_bhsd=call.grad_from_bhsd, notes=notes, check=check)

    def _prepare_ragged(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """A packed or paged batch: one call of the function `flash_ragged_call` names, output as packed rows.

        A packed training batch differentiates the inputs' own packed q, k, v: `flash_attn_varlen_func` is an autograd
        Function in every generation (FlashAttnVarlenFunc's backward), so its gradients come back as packed rows.
        """
        call = flash_ragged_call(inputs, self.generation)
        kernel = getattr(self._import(), call.function)
        args = call.args
        backward = case.mode != "fwd"
        if backward:
            args = (inputs.q, inputs.k, inputs.v)  # the leaves, requiring grad (call.args are detached copies' views)
        kwargs = {**call.kwargs, **variant_kwargs(self.generation, case, inputs.sinks, inputs.q.device),
                  **({"deterministic": True} if case.deterministic else {})}  # a packed training batch's backward too

        def fn() -> torch.Tensor:
            return first(kernel(*args, **kwargs))

        # A build compiled without paged KV (or varlen) refuses only when called.
        self._trial(fn, call.function)
        notes = {"kernel": f"{self.module}.{call.function}", "layout": "paged" if is_paged(inputs) else "packed"}
        return Prepared(fn=fn, leaves=args if backward else (), to_bhsd=call.to_packed, notes=notes)


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@register
class FlashAttn2Backend(_FlashBase):
    """FlashAttention 2: `flash_attn_func`, `flash_attn_varlen_func` for padded batches; Ampere and newer."""

    name = "flash-attn2"
    description = "FlashAttention 2 (flash_attn.flash_attn_func / flash_attn_varlen_func), sm80+"
    module = "flash_attn"
    package = "pip install flash-attn"
    dist = "flash-attn"
    majors = (8, 9, 10, 11, 12)
    arch_words = "an Ampere or newer GPU (sm80+)"
    score_variants, feature_reasons = SCORE_VARIANTS[2], VARIANT_REASONS[2]

    def available(self) -> str | None:
        """As the base, and the installed `flash_attn` must be a 2.x release."""
        version = _dist_version("flash-attn") or ""
        if version and not version.startswith("2."):
            return f"flash-attn {version} is installed, not a 2.x release"
        return super().available()


@register
class FlashAttn3Backend(_FlashBase):
    """FlashAttention 3, the hopper/ build (`flash_attn_interface`): sm90, and sm80 kernels in its default build."""

    name = "flash-attn3"
    description = "FlashAttention 3 (flash_attn_interface, the hopper/ build), sm90 (sm80 kernels too)"
    module = "flash_attn_interface"
    package = "built from flash-attention/hopper"
    dist = "flash_attn_3"
    # hopper/setup.py builds sm80 kernels unless FLASH_ATTENTION_DISABLE_SM80; its sm90 ones are
    # sm_90a only, so nothing runs on Blackwell.
    majors = (8, 9)
    arch_words = "an Ampere or Hopper GPU (sm80, sm90)"
    generation = 3
    score_variants, feature_reasons = SCORE_VARIANTS[3], VARIANT_REASONS[3]
    #: FP8 forward (e4m3 Q, K, V with q/k/v_descale; bf16 output): hopper/flash_attn_interface.py's flash_attn_func.
    dtypes = frozenset({"fp16", "bf16", "fp8_e4m3"})
    #: What an FP8 row's trace must show: its sm90 kernels are templated on cutlass::float_e4m3_t (unverified on a GPU).
    fp8_kernels = ("e4m3",)


@register
class FlashAttn4Backend(_FlashBase):
    """FlashAttention 4, the CuTe-DSL build (`flash_attn.cute`): forward on sm80-sm120, backward from sm90."""

    name = "flash-attn4"
    description = "FlashAttention 4 (flash_attn.cute, CuTe DSL), sm80-sm120 (backward sm90+)"
    module = "flash_attn.cute"
    package = "pip install flash-attn-4"
    dist = "flash-attn-4"
    majors = (8, 9, 10, 11, 12)
    arch_words = "an Ampere, Hopper or Blackwell GPU (sm80-sm120)"
    none_window = None
    generation = 4
    score_variants, feature_reasons = SCORE_VARIANTS[4], VARIANT_REASONS[4]

    def version(self) -> str:
        """The installed flash-attn-4 version."""
        return _dist_version(self.dist) or _dist_version("fa4") or super().version()
