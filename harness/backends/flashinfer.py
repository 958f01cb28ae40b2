"""FlashInfer (`flashinfer-python`): batch prefill over ragged or paged KV, batch decode over paged KV; CUDA only.

Every batch goes through one of FlashInfer's planned wrappers, in the NHD layout (`[tokens, heads, d]`):

    packed, dense  BatchPrefillWithRaggedKVCacheWrapper   plan(qo_indptr, kv_indptr, …); run(q, k, v)
    paged, q_len 1 BatchDecodeWithPagedKVCacheWrapper     plan(indptr, indices, last_page_len, …); run(q, (k_pages, v_pages))
    paged          BatchPrefillWithPagedKVCacheWrapper    plan(qo_indptr, paged_kv_indptr, paged_kv_indices,
                                                               paged_kv_last_page_len, …); run(q, (k_pages, v_pages))

A dense case is the ragged batch whose sequences all have S_q queries and S_kv keys (a dense decode,
its KV one page per sequence, runs the decode wrapper). Paged arguments
are FlashInfer's CSR page table: sequence i's pages are `indices[indptr[i]:indptr[i+1]]`, in the
sequence's own order (read from the block table, never assumed in order), and its KV length is
`page_size·(pages − 1) + last_page_len[i]` with 1 ≤ last_page_len ≤ page_size. Causal masks are
bottom-right (query j sees key t ≤ j + kv_len − qo_len), the harness's convention. GQA is native.
`plan()` is the per-batch set-up a server pays once per step: timed alone into `Prepared.plan_s` (a
second plan(); the first loads, on first use JIT-compiles, the kernel module: `compile_s`).
`flashinfer_call` is the translation, a plain function tested on the CPU; the kernels need a GPU and
are unverified until `make gpu-check` runs on one.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.ragged_args import is_paged, layout_refusal, lengths_int32, pages_used, softmax_scale, timed_setup
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, torch_dtype
from harness.suite.ragged import RaggedInputs

#: FlashInfer's float workspace (its examples allocate 128 MB; split-KV partial results live there).
WORKSPACE_BYTES = 128 * 1024 * 1024
RAGGED_PREFILL = "BatchPrefillWithRaggedKVCacheWrapper"
PAGED_PREFILL = "BatchPrefillWithPagedKVCacheWrapper"
PAGED_DECODE = "BatchDecodeWithPagedKVCacheWrapper"


@dataclass
class FlashinferCall:
    """One planned FlashInfer call: the wrapper's name, `plan()`'s keyword arguments, `run()`'s positional ones."""

    wrapper: str
    plan_args: dict[str, Any]
    run_args: tuple[Any, ...]
    #: The output `[T_q, H, d_v]` as the harness checks it (packed rows, or `[B, H, S_q, d_v]` for a dense case).
    to_checked: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda out: out)


def page_table_csr(inputs: RaggedInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len), int32, from the block table."""
    used = pages_used(inputs)
    if min(used) == 0:
        raise Unsupported("flashinfer's paged KV needs every sequence to hold at least one KV token (last_page_len ≥ 1)")
    device = inputs.q.device
    indptr = torch.zeros(len(used) + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(torch.tensor(used, device=device), 0).to(torch.int32)
    indices = torch.cat([inputs.block_table[b, :n] for b, n in enumerate(used)]).to(device=device, dtype=torch.int32)
    page_size = inputs.page_size
    last = lengths_int32([int(n) - (p - 1) * page_size for n, p in zip(inputs.seq_lens_kv, used)], device)
    return indptr, indices, last


def flashinfer_call(inputs: RaggedInputs, dtype: torch.dtype, window_left: int = -1) -> FlashinferCall:
    """Translate a packed or paged batch into a wrapper, its `plan()` arguments and its `run()` arguments (untimed)."""
    q = inputs.q.detach()
    H, d_k = q.shape[1:]
    H_kv, d_v = inputs.k.shape[1], inputs.v.shape[-1]
    common = {"num_qo_heads": H, "num_kv_heads": H_kv, "sm_scale": softmax_scale(inputs), "window_left": window_left,
              "q_data_type": dtype, "kv_data_type": dtype}
    qo_indptr = inputs.cu_seqlens_q.to(torch.int32)
    if not is_paged(inputs):
        plan = {"qo_indptr": qo_indptr, "kv_indptr": inputs.cu_seqlens_kv.to(torch.int32), "head_dim_qk": d_k, "head_dim_vo": d_v,
                "causal": inputs.causal, **common}
        return FlashinferCall(RAGGED_PREFILL, plan, (q, inputs.k.detach(), inputs.v.detach()))
    indptr, indices, last = page_table_csr(inputs)
    cache = (inputs.k_pages.detach(), inputs.v_pages.detach())
    if set(inputs.seq_lens_q) == {1} and d_k == d_v:
        # One query per request: decode, where causal changes nothing (the query sees its whole cache).
        plan = {"indptr": indptr, "indices": indices, "last_page_len": last, "head_dim": d_k, "page_size": inputs.page_size, **common}
        return FlashinferCall(PAGED_DECODE, plan, (q, cache))
    plan = {"qo_indptr": qo_indptr, "paged_kv_indptr": indptr, "paged_kv_indices": indices, "paged_kv_last_page_len": last,
            "head_dim_qk": d_k, "head_dim_vo": d_v, "page_size": inputs.page_size, "causal": inputs.causal, **common}
    return FlashinferCall(PAGED_PREFILL, plan, (q, cache))


def dense_as_ragged(case: Case, inputs: AttentionInputs) -> RaggedInputs:
    """A dense case as the ragged batch it is: B sequences of S_q queries and S_kv keys, packed (copies, untimed).

    A decode case (S_q = 1, no window) is also given its KV as a paged cache of one S_kv-token page per
    sequence, so that it runs FlashInfer's decode kernel, the one a server calls for decode steps.
    """
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.detach().transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1]).contiguous()

    device = inputs.q.device
    cu = lambda S: torch.arange(0, (case.B + 1) * S, S, dtype=torch.int32, device=device)  # noqa: E731
    ragged = RaggedInputs(rows(inputs.q), rows(inputs.k), rows(inputs.v), (case.S_q,) * case.B, (case.S_kv,) * case.B,
                          cu(case.S_q), cu(case.S_kv), causal=case.causal or case.window is not None)
    if case.S_q != 1 or case.window is not None or case.d_k != case.d_v:
        return ragged
    pages = lambda t: t.view(case.B, case.S_kv, *t.shape[1:])  # noqa: E731
    table = torch.arange(case.B, dtype=torch.int32, device=device)[:, None]
    return replace(ragged, page_size=case.S_kv, k_pages=pages(ragged.k), v_pages=pages(ragged.v), block_table=table)


def flashinfer_dense_call(case: Case, inputs: AttentionInputs) -> FlashinferCall:
    """A dense case through the ragged prefill wrapper (decode: the paged decode wrapper); a window of w keys is window_left = w − 1."""
    call = flashinfer_call(dense_as_ragged(case, inputs), torch_dtype(case.dtype), -1 if case.window is None else case.window - 1)
    call.to_checked = lambda out: out.reshape(case.B, case.S_q, case.H, out.shape[-1]).transpose(1, 2)
    return call


@register
class FlashinferBackend(Backend):
    """FlashInfer's planned batch wrappers (ragged prefill, paged prefill, paged decode), NHD, GQA native."""

    name = "flashinfer"
    family = "flashinfer"
    description = "FlashInfer batch prefill (ragged/paged) and paged decode wrappers; plan() time in plan_ms"
    devices = ("cuda",)
    native_gqa = True
    supports_backward = False
    layouts = frozenset({"dense", "packed", "paged"})

    def version(self) -> str:
        """The installed FlashInfer version."""
        return str(getattr(importlib.import_module("flashinfer"), "__version__", "unknown"))

    def available(self) -> str | None:
        """Installed (flashinfer-python), a CUDA device, and importable."""
        if importlib.util.find_spec("flashinfer") is None:
            return "flashinfer is not installed (pip install flashinfer-python; CUDA only, no CPU kernel)"
        if not torch.cuda.is_available():
            return "flashinfer needs CUDA: it has no CPU kernel"
        try:
            importlib.import_module("flashinfer")
        except Exception as exc:  # a build that does not match torch or the driver is unavailable, not a crash
            return f"flashinfer failed to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return None

    def supports(self, case: Case) -> str | None:
        """fp16/bf16, forward only, a layout it serves; a dense case neither padded nor MLA's shared latent."""
        reason = super().supports(case) or layout_refusal(self, case)
        if reason:
            return reason
        if case.dtype not in ("fp16", "bf16"):
            return f"flashinfer computes in fp16 and bf16 only (case is {case.dtype})"
        if case.mla:
            return "flashinfer's MLA kernels are separate wrappers (BatchMLAPagedAttentionWrapper), not adapted here"
        if case.padding:
            return "flashinfer serves a ragged batch unpadded (the packed layout); a padded dense case is not translated"
        return None

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Translate (untimed), build the wrapper on a workspace, time `plan()` into plan_s, and time `run()`."""
        flashinfer = importlib.import_module("flashinfer")
        if isinstance(inputs, RaggedInputs):
            call = flashinfer_call(inputs, torch_dtype(case.dtype))
        else:
            call = flashinfer_dense_call(case, inputs)
        device = inputs.q.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = getattr(flashinfer, call.wrapper)(workspace, "NHD")
        # The first plan() also loads the kernel module, JIT-compiling it on first use (seconds to minutes):
        # compile time, kept apart; the second is the per-step plan a server pays, the row's plan_ms.
        _, first_s = timed_setup(lambda: wrapper.plan(**call.plan_args), device)
        _, plan_s = timed_setup(lambda: wrapper.plan(**call.plan_args), device)
        run_args = call.run_args

        def fn() -> torch.Tensor:
            return wrapper.run(*run_args)

        notes = {"kernel": f"flashinfer.{call.wrapper}", "kv_layout": "NHD"}
        return Prepared(fn=fn, to_bhsd=call.to_checked, notes=notes, plan_s=plan_s, compile_s=max(0.0, first_s - plan_s))
