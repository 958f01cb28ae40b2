"""PyTorch's scaled_dot_product_attention: torch's own choice, and each kernel forced alone.

A forced kernel that cannot serve a case is reported unsupported with torch's own reason; it is
never replaced by another kernel. That is what `sdpa_kernel` with a single backend guarantees,
and `prepare` probes it once, untimed, to turn torch's refusal into an `unsupported` record.
torch's own choice and the math kernel serve every dense case, so they are not probed (a refusal
there would be the first call's `error`, never another kernel).
"""

from __future__ import annotations

import re
import sys
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

from harness.attention.variants import case_alibi_bias
from harness.backends.base import Backend, Prepared, expand_kv
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.errors import Unsupported
from harness.errors import one_line
from harness.private_api import refused_signature
from harness.suite.inputs import AttentionInputs, visible_mask
from harness.suite.ragged import RaggedInputs
from harness.backends.pytorch.sdpa_ragged import prepare_ragged

#: enable_gqa arrived in torch 2.5; the builtin has no inspectable signature, so read its docstring.
_HAS_ENABLE_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def _mask_arguments(case: Case, device: torch.device, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """SDPA's mask arguments for a case: is_causal for square causal, a lower-right CausalBias, or a bool mask.

    With ALiBi, one float mask in the inputs' dtype: the bias, −inf where the boolean mask hides a key.
    A model's own scale goes in SDPA's `scale=`.
    """
    own_scale = {"scale": case.scale} if case.scale is not None else {}
    if case.alibi:
        bias = case_alibi_bias(case, device, dtype)
        visible = visible_mask(case, device=device)
        return {"attn_mask": bias if visible is None else bias.masked_fill(~visible, float("-inf")), **own_scale}
    return {**_boolean_mask_arguments(case, device), **own_scale}


def _boolean_mask_arguments(case: Case, device: torch.device) -> dict[str, Any]:
    """The mask arguments of a case without ALiBi (see _mask_arguments)."""
    if case.padding or case.window is not None:
        return {"attn_mask": visible_mask(case, device=device)}
    if case.causal and case.S_q == case.S_kv:
        return {"is_causal": True}
    if case.causal:
        # is_causal aligns top-left; the harness's convention is bottom-right.
        from torch.nn.attention.bias import causal_lower_right

        return {"attn_mask": causal_lower_right(case.S_q, case.S_kv)}
    return {}


#: The arguments `dispatched_kernel` passes `torch._fused_sdp_choice`, by the names in its aten schema.
FUSED_SDP_CHOICE_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "enable_gqa")


def fused_sdp_choice_problem() -> str | None:
    """Why the private `torch._fused_sdp_choice` cannot name SDPA's kernel in this torch, or None when its schema is the one called."""
    if not callable(getattr(torch, "_fused_sdp_choice", None)):
        return f"torch {torch.__version__} has no torch._fused_sdp_choice (the private function that names the kernel SDPA picks)"
    try:
        schema = torch.ops.aten._fused_sdp_choice.default._schema
    except (AttributeError, RuntimeError) as exc:
        return f"torch {torch.__version__}: torch._fused_sdp_choice has no aten schema to check ({one_line(exc)})"
    names = {argument.name for argument in schema.arguments}
    missing = [name for name in FUSED_SDP_CHOICE_ARGUMENTS if name not in names]
    returns = [str(r.type) for r in schema.returns]
    if missing or returns != ["int"]:
        return (f"torch {torch.__version__}: torch._fused_sdp_choice is now `{schema}`; the harness passes "
                f"{', '.join(FUSED_SDP_CHOICE_ARGUMENTS)} and reads one int")
    return None


def causal_bias_materialize_problem() -> str | None:
    """Why the private `CausalBias._materialize(device)` cannot turn a lower-right bias into a mask here, or None."""
    from torch.nn.attention.bias import CausalBias

    materialize = getattr(CausalBias, "_materialize", None)
    if not callable(materialize):
        return f"torch {torch.__version__} has no CausalBias._materialize (the private method that turns a causal bias into a mask)"
    signature = refused_signature(materialize, None, torch.device("cpu"))
    if signature:
        return f"torch {torch.__version__}: CausalBias._materialize{signature} no longer takes a device"
    return None


def dispatched_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    """The SDPA kernel torch's dispatcher picks for these arguments (`torch._fused_sdp_choice`) by its SDPBackend name, or None and why not.

    A lower-right CausalBias dispatches itself (torch.nn.attention.bias.CausalBias._dispatch): flash
    where `can_use_flash_attention` says yes, else efficient, else SDPA over the materialised mask;
    that order is followed here. Naming the kernel only annotates the row: when torch's private
    functions cannot be asked, the row is still measured and says why its kernel has no name.
    """
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
    from torch.nn.attention import SDPBackend

    # A CausalBias exists only where its module was imported: importing it to ask would cost every worker torch._dynamo
    # (1.5 CPU-s), which only lower-right causal masks and compiled backends need.
    bias_module = sys.modules.get("torch.nn.attention.bias")
    mask, gqa = kwargs.get("attn_mask"), bool(kwargs.get("enable_gqa", False))
    is_causal = bool(kwargs.get("is_causal", False))
    try:
        if bias_module is not None and isinstance(mask, bias_module.CausalBias):
            if mask.seq_len_q == mask.seq_len_kv:
                mask, is_causal = None, True
            else:
                params = SDPAParams(q, k, v, None, 0.0, False, gqa)
                if can_use_flash_attention(params):
                    return SDPBackend.FLASH_ATTENTION.name, None
                if can_use_efficient_attention(params):
                    return SDPBackend.EFFICIENT_ATTENTION.name, None
                problem = causal_bias_materialize_problem()
                if problem:
                    return None, problem
                mask = mask._materialize(q.device)
        problem = fused_sdp_choice_problem()
        if problem:
            return None, problem
        index = torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=is_causal, enable_gqa=gqa)
        return SDPBackend(index).name, None
    except Exception as exc:  # noqa: BLE001 - torch's private dispatcher failed: say so, never guess
        return None, f"torch {torch.__version__}'s dispatcher could not be asked: {one_line(exc)}"


def _refusal_reason(exc: Exception, caught: list[warnings.WarningMessage]) -> str:
    """One line out of torch's 'no kernel' error and the warnings that explain it.

    torch warns "<kernel> not used because:" and then, in separate warnings, the reasons; the
    header and the "(Triggered internally at …)" source locations say nothing to a user.
    """
    reasons = []
    for w in caught:
        text = " ".join(re.sub(r"\(Triggered internally at [^)]*\)\.?", "", str(w.message)).split())
        if text and not text.endswith("because:"):
            reasons.append(text)
    text = "; ".join(dict.fromkeys(reasons)) or " ".join(str(exc).split())
    return text[:300]


class _SdpaBase(Backend):
    family = "sdpa"
    #: Every SDPA kernel takes `scale=`; ALiBi goes in as a float attn_mask where the kernel takes one.
    score_variants = frozenset({"scale", "alibi"})
    feature_reasons = {"softcap": "SDPA has no softcap: scores cannot be transformed before the softmax",
                       "sinks": "SDPA has no sink logits: its softmax denominator covers the keys alone",
                       **dict.fromkeys(("dtype:fp8_e4m3", "dtype:fp8_e5m2"),
                                       "scaled_dot_product_attention takes no descales, so FP8 inputs cannot carry "
                                       "their scales through it (on the CPU torch raises NotImplementedError for Float8); cuDNN's FP8 "
                                       "attention is not reached through it here")}
    #: Padded with a mask, packed as nested jagged tensors or request by request, paged gathered first (harness.backends.pytorch.sdpa_ragged).
    layouts = frozenset({"dense", "padded", "packed", "paged"})
    #: Training batches: the padded rectangle's leaves, or the packed rows through nested jagged tensors or the request loop.
    ragged_backward = frozenset({"padded", "packed"})
    #: The forced kernel (`torch.nn.attention.SDPBackend` member name), or None for torch's choice.
    kernel: str | None = None
    #: Whether torch may refuse the kernel for a case, so that `prepare` must probe it (one untimed call).
    may_refuse: bool = True

    def available(self) -> str | None:
        """SDPA with kernel forcing needs torch.nn.attention (torch ≥ 2.3)."""
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel (needs ≥ 2.3)"
        if self.kernel is not None and not hasattr(SDPBackend, self.kernel):
            return f"torch {torch.__version__} has no SDPA kernel {self.kernel}"
        return None

    def _run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """One SDPA call, inside `sdpa_kernel` when a kernel is forced."""
        if self.kernel is None:
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # Entering the context costs about a microsecond of host time; it must wrap each call
        # because the timer, not the backend, owns the loop.
        with sdpa_kernel(getattr(SDPBackend, self.kernel)):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    @staticmethod
    def _refusal(fn: Callable[[], torch.Tensor]) -> str | None:
        """One untimed call of `fn`: None when the kernel ran, else torch's reason for refusing (out of memory is raised)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with torch.no_grad():
                    fn()
            except RuntimeError as exc:
                if "out of memory" in str(exc).lower():
                    raise
                return _refusal_reason(exc, caught)
        return None

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Pick GQA handling and mask arguments, then probe a kernel that may refuse once, so a refusal becomes Unsupported."""
        if case.ragged:
            return prepare_ragged(case, inputs, self._run, self._refusal, _HAS_ENABLE_GQA and case.H_kv != case.H, self.name, self.kernel,
                                  lambda q, k, v, kwargs: self._prepare_rectangle(case, q, k, v, kwargs))
        return self._prepare_rectangle(case, inputs.q, inputs.k, inputs.v, _mask_arguments(case, inputs.q.device, inputs.q.dtype))

    def _prepare_rectangle(self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> Prepared:
        """The call on `[B, H, S, d]` tensors with these mask arguments: a dense case's, or a padded batch's rectangle."""
        # Each attempt: the call to time, whether it copies K/V, and the (k, v, kwargs) torch dispatches on.
        attempts: list[tuple[Callable[[], torch.Tensor], bool, Callable[[], tuple]]] = []
        if case.H_kv == case.H:
            attempts.append((lambda: self._run(q, k, v, kwargs), False, lambda: (k, v, kwargs)))
        else:
            if _HAS_ENABLE_GQA:
                gqa_kwargs = {**kwargs, "enable_gqa": True}
                attempts.append((lambda: self._run(q, k, v, gqa_kwargs), False, lambda: (k, v, gqa_kwargs)))
            # The explicit expansion runs inside the timed call: its time and memory are the honest cost.
            g = case.group_size
            attempts.append((lambda: self._run(q, expand_kv(k, g), expand_kv(v, g), kwargs), True,
                             lambda: (expand_kv(k, g), expand_kv(v, g), kwargs)))
        failure = ""
        for fn, kv_expanded, dispatched_on in attempts:
            refusal = self._refusal(fn) if self.may_refuse else None
            if refusal is None:
                break
            failure = refusal
        else:
            raise Unsupported(f"{self.name}: {failure}")
        # torch's choice for the call that will be timed: the forced kernel, or what the dispatcher picks.
        notes: dict[str, Any] = {"kv_expanded": kv_expanded, "sdpa_kernel": self.kernel}
        if self.kernel is None:
            notes["sdpa_kernel"], unnamed = dispatched_kernel(q, *dispatched_on())
            if unnamed:
                notes["sdpa_kernel_unknown"] = unnamed
        return Prepared(fn=fn, leaves=(q, k, v), notes=notes)


@register
class SdpaBackend(_SdpaBase):
    """torch.nn.functional.scaled_dot_product_attention with torch choosing the kernel."""

    name = "sdpa"
    description = "F.scaled_dot_product_attention, torch's own kernel choice"
    native_gqa = _HAS_ENABLE_GQA
    may_refuse = False
    #: Under deterministic algorithms torch's dispatch skips cuDNN (sdp_utils.cpp check_cudnn_deterministic); flash,
    #: efficient and math then each run their deterministic backward.
    deterministic_backward = True


@register
class SdpaMathBackend(_SdpaBase):
    """SDPA forced to the math (composite) kernel."""

    name = "sdpa-math"
    kernel = "MATH"
    description = "SDPA forced to the math kernel (composite ops)"
    native_gqa = _HAS_ENABLE_GQA
    may_refuse = False
    materializes_scores = True
    deterministic_backward = True  # composite matmuls and softmax: no atomics
    #: The reference point of speed-ups: every installation has it, and it is what SDPA does unfused.
    baseline = True


@register
class SdpaFlashBackend(_SdpaBase):
    """SDPA forced to its FlashAttention kernel (a CPU implementation exists too)."""

    name = "sdpa-flash"
    kernel = "FLASH_ATTENTION"
    description = "SDPA forced to the FlashAttention kernel"
    native_gqa = _HAS_ENABLE_GQA
    score_variants = frozenset({"scale"})
    feature_reasons = {**_SdpaBase.feature_reasons, "alibi": "SDPA's flash kernel takes no attn_mask, so no ALiBi bias"}
    deterministic_backward = True  # torch hands FA2's backward deterministic=True under deterministic algorithms


@register
class SdpaEfficientBackend(_SdpaBase):
    """SDPA forced to the memory-efficient (xFormers-derived) kernel; CUDA only."""

    name = "sdpa-efficient"
    kernel = "EFFICIENT_ATTENTION"
    description = "SDPA forced to the memory-efficient kernel"
    devices = ("cuda",)
    deterministic_backward = True  # torch forces num_splits_key = 1 under deterministic algorithms (attention_backward.cu)

    def available(self) -> str | None:
        """Needs a CUDA device."""
        return super().available() or _cuda_reason()


@register
class SdpaCudnnBackend(_SdpaBase):
    """SDPA forced to the cuDNN kernel; CUDA only."""

    name = "sdpa-cudnn"
    kernel = "CUDNN_ATTENTION"
    description = "SDPA forced to the cuDNN attention kernel"
    devices = ("cuda",)
    score_variants = frozenset({"scale"})
    feature_reasons = {**_SdpaBase.feature_reasons, "alibi": "not verified that SDPA's cuDNN kernel takes a float attn_mask",
                       "deterministic": ("torch does not choose cuDNN attention under use_deterministic_algorithms (cuDNN SDPA is not "
                                         "deterministic), so forcing it finds no kernel; run sdpa, which dispatches to flash or efficient")}

    def available(self) -> str | None:
        """Needs a CUDA device and torch ≥ 2.4."""
        return super().available() or _cuda_reason()


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (this kernel has no CPU implementation)"
    return None
