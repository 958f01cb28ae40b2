"""FlashMLA (deepseek-ai/FlashMLA, module `flash_mla`): DeepSeek's own MLA decode kernel over a paged latent cache.

The absorbed MLA decode (harness.backends.pytorch.mla) as DeepSeek serves it: H query heads of width d_c + d_rope against
one latent cache, the values its first d_c columns. `flash_mla_with_kvcache` reads the cache exactly as a paged
MLA case holds it (harness.suite.ragged):

    q             [B, s_q, H, d_c + d_rope]       the packed queries viewed per request (one query length for all)
    k_cache       [num_blocks, 64, 1, d_c + d_rope]  the latent pages themselves; page (block) size 64 only
    block_table   [B, max_blocks] int32           the harness's, unused (-1) entries pointed at page 0
    cache_seqlens [B] int32                       each request's KV length
    head_dim_v    d_c (512)                       V is the first d_c columns of k_cache

and returns (out [B, s_q, H, d_c], lse). Its tile-scheduler metadata comes from `get_mla_metadata(cache_seqlens,
s_q·H / H_kv, H_kv)`, untimed (plan_ms): older releases compute it there, newer ones (FlashMLASchedMeta) return an
empty schedule that the first kernel call fills in and later calls reuse, so prepare makes that first call
untimed too. Both interfaces take the arguments passed here, checked against their source in
tests/test_mla_kernels.py. Dense decode only (no FP8 cache, no sparse indices); bf16 and fp16; d_k = 576, d_v = 512
(the kernels' compiled widths). The kernels are unverified until a GPU (SM90/SM100) runs them.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.pytorch.mla import NOT_MLA
from harness.backends.ragged_args import kernel_block_table, lengths_int32, softmax_scale, timed_setup, uniform_length
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.ragged import RaggedInputs

MODULE = "flash_mla"
#: The page (block) size FlashMLA's paged decode is built for.
PAGE_SIZE = 64
#: (d_k, d_v) its kernels are compiled for: the latent d_c + d_rope = 512 + 64, and d_c.
HEAD_DIMS = (576, 512)
NOT_INSTALLED = ("flash_mla is not installed (build it from github.com/deepseek-ai/FlashMLA: CUDA SM90/SM100 only, "
                 "no wheel and no CPU build)")


@dataclass
class FlashmlaCall:
    """One FlashMLA decode: get_mla_metadata()'s positional arguments, flash_mla_with_kvcache()'s keywords, the output's packing."""

    metadata_args: tuple[Any, ...]
    kernel_args: dict[str, Any]
    to_packed: Callable[[torch.Tensor], torch.Tensor]
    notes: dict[str, Any] = field(default_factory=dict)


def flashmla_call(case: Case, inputs: RaggedInputs) -> FlashmlaCall:
    """Translate a paged MLA batch into FlashMLA's arguments (untimed); Unsupported when its requests' query lengths differ."""
    s_q = uniform_length(inputs.seq_lens_q)
    if s_q is None:
        raise Unsupported(f"flash_mla takes one query length for the whole batch (q is [batch, s_q, heads, d]); "
                          f"this batch has {len(set(inputs.seq_lens_q))} different ones")
    B, H, d_k = inputs.batch_size, case.H, case.d_k
    device = inputs.q.device
    cache_seqlens = lengths_int32(inputs.seq_lens_kv, device)
    kernel = {
        "q": inputs.q.detach().view(B, s_q, H, d_k),
        "k_cache": inputs.k_pages.detach(),
        "block_table": kernel_block_table(inputs),
        "cache_seqlens": cache_seqlens,
        "head_dim_v": case.d_v,
        "softmax_scale": softmax_scale(inputs, case),
        # One query per request sees its whole cache either way; several (MTP) are bottom-right causal, as the harness's.
        "causal": bool(inputs.causal and s_q > 1),
    }
    return FlashmlaCall((cache_seqlens, s_q * H // case.H_kv, case.H_kv), kernel,
                        lambda out: out.reshape(B * s_q, H, case.d_v), notes={"page_size": inputs.page_size, "s_q": s_q})


@register
class FlashmlaBackend(Backend):
    """DeepSeek's FlashMLA paged decode kernel over the latent cache (page size 64), scheduler metadata untimed."""

    name = "flashmla"
    family = "mla"
    # The same function as the eager absorbed `mla` backend: ranked beside it, never against the attention cores.
    attention_core = False
    description = ("DeepSeek FlashMLA flash_mla_with_kvcache: absorbed MLA decode over a paged latent cache (page 64); "
                   "get_mla_metadata in plan_ms")
    devices = ("cuda",)
    native_gqa = True
    supports_backward = False
    layouts = frozenset({"paged"})
    #: The model's softmax scale (an MLA case's `scale`: 1/√192 × YaRN's mscale²) is flash_mla_with_kvcache's softmax_scale.
    score_variants = frozenset({"scale"})
    dtypes = frozenset({"bf16", "fp16"})  # its FP8 cache is another layout, not adapted
    #: The kernel an MLA row must show in the profiler (harness.backends.kernel_claims): FlashMLA's own benchmark times it by
    #: this name (tests/test_flash_mla_dense_decoding.py: `get_kernel_time("flash_fwd_splitkv_mla_kernel")`); unverified on a GPU here.
    mla_kernels = ("flash_fwd_splitkv_mla",)

    def version(self) -> str:
        """The installed FlashMLA version (its distribution's, else the module's, else unknown)."""
        for name in ("flash_mla", "flash-mla", "flashmla"):
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return str(getattr(importlib.import_module(MODULE), "__version__", "unknown"))

    def available(self) -> str | None:
        """Installed, a CUDA device, and importable (its extension built for this torch)."""
        if importlib.util.find_spec(MODULE) is None:
            return NOT_INSTALLED
        if not torch.cuda.is_available():
            return "flash_mla needs CUDA: it has no CPU kernel"
        try:
            importlib.import_module(MODULE)
        except Exception as exc:  # an extension built against another torch is unavailable, not a crash
            return f"flash_mla failed to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return None

    def own_refusals(self, case: Case) -> list[str]:
        """MLA cases, with 64-token pages, d_k 576 / d_v 512 and one query length per batch (paged, bf16/fp16, forward: declared)."""
        if not case.mla:
            return [f"{self.name} {NOT_MLA}"]  # the latent cache's widths and pages below presume one
        reasons = []
        if case.layout == "paged" and case.page_size != PAGE_SIZE:
            reasons.append(f"flash_mla's paged KV cache has {PAGE_SIZE}-token pages only (case: page_size={case.page_size})")
        if (case.d_k, case.d_v) != HEAD_DIMS:
            reasons.append(f"flash_mla is built for d_k={HEAD_DIMS[0]}, d_v={HEAD_DIMS[1]} (d_c 512 + d_rope 64); "
                           f"case: d_k={case.d_k}, d_v={case.d_v}")
        if case.ragged and uniform_length(case.seq_lens_q) is None:
            reasons.append("flash_mla takes one query length for the whole batch (q is [batch, s_q, heads, d]); this batch's differ")
        return reasons

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """Scheduler metadata untimed (plan_s), one untimed first call (a lazy schedule is filled there), then time the kernel."""
        flash_mla = importlib.import_module(MODULE)
        call = flashmla_call(case, inputs)
        device = inputs.q.device
        (schedule, splits), plan_s = timed_setup(lambda: flash_mla.get_mla_metadata(*call.metadata_args), device)
        kernel_args = {**call.kernel_args, "tile_scheduler_metadata": schedule, "num_splits": splits}

        def fn() -> torch.Tensor:
            return flash_mla.flash_mla_with_kvcache(**kernel_args)[0]

        # A lazy schedule (FlashMLASchedMeta: `splits` None) is computed inside the first call and reused after: it is
        # made here, so no timed call pays it; that call runs a kernel too, so it stays out of plan_s.
        _, first_s = timed_setup(fn, device)
        lazy = splits is None
        notes = {"kernel": f"{MODULE}.flash_mla_with_kvcache", "form": "absorbed", "d_c": case.d_v, "d_rope": case.d_k - case.d_v,
                 "scheduler": "filled by the first (untimed) call" if lazy else "get_mla_metadata",
                 "first_call_ms": round(first_s * 1e3, 3), **call.notes}
        return Prepared(fn=fn, to_bhsd=call.to_packed, notes=notes, plan_s=plan_s)
