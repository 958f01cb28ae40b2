"""FlashInfer's MLA kernels (`BatchMLAPagedAttentionWrapper`) over a paged latent cache; CUDA only, forward only.

The absorbed MLA decode (harness.backends.pytorch.mla) as FlashInfer serves it: every query head attends with a query of
width d_c + d_rope over one shared latent cache, whose first d_c columns are the values. The wrapper takes the
query and the cache split at d_c, as FlashInfer's MLA API names them:

    q_nope [T_q, H, d_c]  q_pe [T_q, H, d_rope]      views of the packed query [T_q, H, d_c + d_rope]
    ckv    [P, page, d_c] kpe  [P, page, d_rope]     views of the latent pages [P, page, 1, d_c + d_rope]

flashinfer-python 0.7.2.post1 (mla/_batch_mla/_wrapper.py) spells this in its preferred, non-deprecated form:
`plan(metadata=MLAPlanMetadata.csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr), num_heads=…, head_dim_ckv=…,
head_dim_kpe=…, page_size=…, causal=…, sm_scale=…, q_data_type=…, kv_data_type=…, query_layout="split",
kv_cache_layout="split")` and `run(query=(q_nope, q_pe), kv_cache=(ckv, kpe))`; the flat plan tensors and the
q_nope=/ckv_cache= run keywords are its deprecated forms. The CSR page table is the one the paged wrappers read
(harness.backends.flashinfer.adapter.page_table_csr), with each request's KV length in `kv_len_arr` instead of a last-page
length. Its kernels are built for d_c = 512 and d_rope = 64 (the FA2 path's check, _backends/_fa_common.py), the
DeepSeek-V3 and Kimi-K2 widths. Causal is bottom-right, as the harness's; a decode (one query per request) plans
non-causal, which is the same function. `plan()` is untimed, twice: the first loads or JIT-compiles the kernel
(compile_s), the second is a server's per-step plan (plan_ms). Its calls are bound to the installed source's
signatures in tests/test_mla_kernels.py; the kernels themselves are unverified until a GPU runs them.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.flashinfer.adapter import WORKSPACE_BYTES, flashinfer_unavailable, host_indptr, page_table_csr
from harness.backends.pytorch.mla import NOT_MLA
from harness.backends.ragged_args import lengths_int32, softmax_scale, timed_setup
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import torch_dtype
from harness.suite.ragged import RaggedInputs

WRAPPER = "BatchMLAPagedAttentionWrapper"
#: The latent widths (d_c, d_rope) FlashInfer's MLA kernels are compiled for.
LATENT_WIDTHS = (512, 64)


@dataclass
class MlaCall:
    """One planned call: the CSR metadata (MLAPlanMetadata.csr's arguments), plan()'s other keywords, run()'s keywords."""

    metadata: dict[str, torch.Tensor]
    plan_args: dict[str, Any]
    run_args: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)


def split_latent(inputs: RaggedInputs, d_c: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((q_nope, q_pe), (ckv, kpe)): the query and the latent pages split at d_c, views that copy nothing."""
    q = inputs.q.detach()
    latent = inputs.k_pages.detach()[:, :, 0]  # H_kv = 1: [num_pages, page_size, d_c + d_rope]
    return (q[..., :d_c], q[..., d_c:]), (latent[..., :d_c], latent[..., d_c:])


def flashinfer_mla_call(case: Case, inputs: RaggedInputs) -> MlaCall:
    """Translate a paged MLA batch into the wrapper's CSR metadata, plan() and run() arguments (untimed, host index tensors)."""
    d_c = case.d_v
    indptr, indices, _ = page_table_csr(inputs)
    metadata = {"qo_indptr": host_indptr(inputs.seq_lens_q), "kv_indptr": indptr, "kv_indices": indices,
                "kv_len_arr": lengths_int32(inputs.seq_lens_kv, "cpu")}
    dtype = torch_dtype(case)
    plan = {"num_heads": case.H, "head_dim_ckv": d_c, "head_dim_kpe": case.d_k - d_c, "page_size": inputs.page_size,
            "causal": bool(inputs.causal and max(inputs.seq_lens_q) > 1), "sm_scale": softmax_scale(inputs, case),
            "q_data_type": dtype, "kv_data_type": dtype, "query_layout": "split", "kv_cache_layout": "split"}
    query, kv_cache = split_latent(inputs, d_c)
    return MlaCall(metadata, plan, {"query": query, "kv_cache": kv_cache}, notes={"page_size": inputs.page_size})


@register
class FlashinferMlaBackend(Backend):
    """FlashInfer's MLA paged attention wrapper: absorbed MLA decode over the latent pages, planned untimed."""

    name = "flashinfer-mla"
    family = "mla"
    # The same function as the eager absorbed `mla` backend: ranked beside it, never against the attention cores.
    attention_core = False
    description = "FlashInfer BatchMLAPagedAttentionWrapper: absorbed MLA decode over a paged latent cache; plan() time in plan_ms"
    devices = ("cuda",)
    native_gqa = True
    supports_backward = False
    layouts = frozenset({"paged"})
    #: The model's softmax scale (an MLA case's `scale`) is plan()'s sm_scale.
    score_variants = frozenset({"scale"})
    dtypes = frozenset({"fp16", "bf16"})
    #: One of the kernels an MLA row must show (harness.backends.kernel_claims), by the backend "auto" plans: fa2's
    #: `flashinfer::mla::BatchMLAPagedAttentionKernel` (mla.cuh), fa3's `…::hopper::BatchMLAPageAttentionHopperKernel`
    #: (mla_hopper.cuh, SM90), trtllm-gen's `fmhaSm100…HQk576HV512…` (SM100). The cute-dsl, cutlass and xqa backends'
    #: kernel names are not known here: a row planned onto one reads kernel_mismatch until its name is added. Unverified on a GPU.
    mla_kernels = ("BatchMLAPagedAttentionKernel", "BatchMLAPageAttentionHopperKernel", "HQk576HV512")

    def version(self) -> str:
        """The installed FlashInfer version."""
        return str(getattr(importlib.import_module("flashinfer"), "__version__", "unknown"))

    def available(self) -> str | None:
        """Installed (flashinfer-python), a CUDA device, kernels prebuilt or a compiler to build them, and importable."""
        return flashinfer_unavailable("flashinfer.mla", "its MLA wrapper has no CPU kernel")

    def own_refusals(self, case: Case) -> list[str]:
        """MLA cases at FlashInfer's latent widths (paged, fp16/bf16, forward only: declared)."""
        if not case.mla:
            return [f"{self.name} {NOT_MLA}"]  # the latent widths below presume one
        widths = (case.d_v, case.d_k - case.d_v)
        if widths != LATENT_WIDTHS:
            return [f"flashinfer's MLA kernels are built for d_c={LATENT_WIDTHS[0]}, d_rope={LATENT_WIDTHS[1]} "
                    f"(case: d_c={widths[0]}, d_rope={widths[1]})"]
        return []

    def prepare(self, case: Case, inputs: RaggedInputs) -> Prepared:
        """Translate (untimed), plan twice (compile, then the per-step plan in plan_s), and time `run()`."""
        flashinfer = importlib.import_module("flashinfer")
        metadata_type = importlib.import_module("flashinfer.mla").MLAPlanMetadata
        call = flashinfer_mla_call(case, inputs)
        device = inputs.q.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = getattr(flashinfer, WRAPPER)(workspace)

        def plan() -> None:
            wrapper.plan(metadata=metadata_type.csr(**call.metadata), **call.plan_args)

        _, first_s = timed_setup(plan, device)
        _, plan_s = timed_setup(plan, device)
        run_args = call.run_args

        def fn() -> torch.Tensor:
            return wrapper.run(**run_args)

        # "auto" picks one of its MLA backends (fa2, fa3, cutlass, trtllm-gen, …) at plan(): the row says which.
        chosen = getattr(wrapper, "_planned_backend_name", None)
        notes = {"kernel": f"flashinfer.{WRAPPER}" + (f"[{chosen}]" if chosen else ""), "form": "absorbed",
                 "d_c": case.d_v, "d_rope": case.d_k - case.d_v, **call.notes}
        return Prepared(fn=fn, notes=notes, plan_s=plan_s, compile_s=max(0.0, first_s - plan_s))
