"""Which kind of work an operator or kernel is: matmul, softmax, elementwise, copy/expand, fused attention or other.

Known aten operators are looked up by name; anything else (CUDA kernels, new operators) by substrings
of its name, most specific first.
"""

from __future__ import annotations

import re

from harness.results.vocabulary import CATEGORIES, column_name  # noqa: F401 - re-exported


# Exact aten base names (namespace and in-place `_` stripped). Checked before the substring
# patterns below, because the patterns are for names nobody listed (CUDA kernels, new ops).
_CPU_OPS: dict[str, str] = {}
for _category, _names in {
    "matmul": "mm bmm addmm baddbmm addbmm matmul linear einsum dot vdot mv addmv tensordot "
              "_addmm_activation mkldnn_linear mkldnn_matmul _mkldnn_matmul _int_mm",
    "softmax": "softmax _softmax log_softmax _log_softmax _safe_softmax _masked_softmax "
               "_softmax_backward_data _log_softmax_backward_data _masked_softmax_backward",
    "fused attention": "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
                       "_scaled_dot_product_flash_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward "
                       "_scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward "
                       "_scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward "
                       "_scaled_dot_product_fused_attention_overrideable _scaled_dot_product_fused_attention_overrideable_backward "
                       "_flash_attention_forward _flash_attention_backward _efficient_attention_forward _efficient_attention_backward",
    "copy/expand": "copy _copy_from _copy_from_and_resize _to_copy to contiguous clone expand expand_as repeat "
                   "repeat_interleave index_select index gather cat stack view view_as reshape _reshape_alias "
                   "as_strided transpose permute unsqueeze squeeze t _unsafe_view select slice narrow flatten "
                   "unflatten alias detach lift_fresh split chunk unbind movedim resolve_conj resolve_neg",
    "elementwise": "mul add sub rsub div masked_fill where nan_to_num exp exp2 log neg reciprocal fill zero zeros "
                   "zeros_like ones ones_like full full_like tanh gelu relu sigmoid silu logical_not logical_and "
                   "logical_or bitwise_not bitwise_and bitwise_or eq ne lt gt le ge isnan isinf clamp clamp_min "
                   "clamp_max rsqrt sqrt pow abs sign square maximum minimum addcmul addcdiv lerp triu tril "
                   "threshold_backward gelu_backward scalar_tensor",
    # The SDPA dispatcher and its composite math path: their self time is dispatch, not a fused kernel.
    "other": "scaled_dot_product_attention _scaled_dot_product_attention_math _fused_sdp_choice empty empty_like "
             "empty_strided resize sum mean amax amin max min logsumexp",
}.items():
    for _name in _names.split():
        _CPU_OPS[_name] = _category

# Substring patterns on the lowercased name, first match wins. Fused attention comes first because
# its kernels' names also contain "cutlass" or "gemm" (fmha_cutlassF…, cudnn sdpa); copy comes
# before elementwise because torch's copy kernels run inside `elementwise_kernel<…direct_copy…>`.
_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fused attention", ("flash", "fmha", "sdpa", "efficient_attention", "attention", "_attn")),
    ("softmax", ("softmax",)),
    ("matmul", ("gemm", "gemv", "cutlass", "xmma", "cublas", "nvjet", "matmul", "bmm", "dot_kernel")),
    ("copy/expand", ("copy", "memcpy", "index_select", "indexselect", "repeat", "expand", "contiguous", "transpose", "permute")),
    ("elementwise", ("elementwise", "memset", "fill", "where", "masked", "unrolled", "vectorized")),
)


def categorize(name: str) -> str:
    """The category of a CPU operator (`aten::bmm`) or CUDA kernel name, one of CATEGORIES."""
    if name.startswith("autograd::") or re.search(r"Backward\d*$", name):
        return "other"  # autograd's bookkeeping around a backward node, not the node's operators
    if "::" in name:
        base = name.rsplit("::", 1)[1]
        base = base[:-1] if base.endswith("_") and not base.endswith("__") else base
        if base in _CPU_OPS:
            return _CPU_OPS[base]
    lowered = name.lower()
    for category, needles in _PATTERNS:
        if any(n in lowered for n in needles):
            return category
    return "other"


