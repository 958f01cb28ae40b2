"""FlashInfer (`flashinfer-python`): batch prefill over ragged or paged KV, batch decode over paged KV; CUDA only.

Every batch goes through one of FlashInfer's planned wrappers, in the NHD layout (`[tokens, heads, d]`):

    packed, dense  BatchPrefillWithRaggedKVCacheWrapper   plan(qo_indptr, kv_indptr, …); run(q, k, v)
    paged, q_len 1 BatchDecodeWithPagedKVCacheWrapper     plan(indptr, indices, last_page_len, …); run(q, (k_pages, v_pages))
    paged          BatchPrefillWithPagedKVCacheWrapper    plan(qo_indptr, paged_kv_indptr, paged_kv_indices,
                                                               paged_kv_last_page_len, …); run(q, (k_pages, v_pages))

A dense case is the ragged batch whose sequences all have S_q queries and S_kv keys; a dense decode
views its contiguous KV as pages of DENSE_DECODE_PAGE_SIZE tokens (no copy) and runs the decode wrapper.
Paged arguments are FlashInfer's CSR page table: sequence i's pages are `indices[indptr[i]:indptr[i+1]]`, in the
sequence's own order (read from the block table, never assumed in order), and its KV length is
`page_size·(pages − 1) + last_page_len[i]` with 1 ≤ last_page_len ≤ page_size. Causal masks are
bottom-right (query j sees key t ≤ j + kv_len − qo_len), the harness's convention. GQA is native; a
decode whose head group the CUDA-core decode kernel lacks runs the tensor-core one (CUDA_CORE_DECODE_GROUPS).
Every index tensor handed to plan() is on the host, as a server's are: plan() reads them there (its
schedule is computed on the CPU) and copies them to the device itself.
`plan()` is the per-batch set-up a server pays once per step: timed alone into `Prepared.plan_s` (a
second plan(); the first loads, on first use JIT-compiles, the kernel module: `compile_s`).
`flashinfer_call` is the translation, a plain function tested on the CPU (its calls bound to the
installed library's signatures in tests/test_flashinfer_library.py); the kernels need a GPU and
are unverified until `make gpu-check` runs on one.

The score variants and head dims of FlashInfer's planned wrappers, as flashinfer-python 0.7.2.post1 defines them.

- `sm_scale` and `logits_soft_cap` are plan() arguments of all three wrappers (the decode plan takes them through
  **kwargs); include/flashinfer/attention/variants.cuh's DefaultAttention applies the cap as
  cap·tanh(s/cap) on the scaled score s in its logits transform, before the mask: the harness's softcap.
- ALiBi is plan(pos_encoding_mode="ALIBI"), with FlashInfer's own slopes (utils.get_alibi_slopes: Press et al.'s,
  the harness's values): the same transform adds slope_h·(kv_idx − qo_idx) to the scaled score, a bias linear in the
  distance. A row constant cancels in the softmax, so it is the harness's −slope·|pos(i) − j| exactly where every
  visible key lies at or before its query's position (causal or windowed, or one query per sequence), and not otherwise.
- Sinks: run(sinks=) reaches only the trtllm-gen and cuDNN paths; the fa2 paged_run drops it (prefill.py), the
  CUDA-core decode run never passes it (decode.py), and the ragged run has no such argument. Its sink kernels are
  a separate JIT wrapper (BatchAttentionWithAttentionSinkWrapper), not adapted here.
- Head dims: no limit is stated here. The JIT-compiled batch modules take the head dim as a template constant;
  the DISPATCH_HEAD_DIM list of include/flashinfer/utils.cuh (64, 128, 256, 512) is not what they dispatch on,
  so a head dim a kernel lacks is its own error at plan() or run().
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import math
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.ragged_args import is_paged, lengths_int32, pages_used, softmax_scale, timed_setup, translation_refusals
from harness.backends.registry import register
from harness.errors import Unsupported
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, torch_dtype
from harness.suite.ragged import RaggedInputs

SCORE_VARIANTS = frozenset({"softcap", "alibi", "scale"})
VARIANT_REASONS = {
    "sinks": ("the planned wrappers' fa2 kernels drop run(sinks=) (only its trtllm-gen and cuDNN paths take it); its sink "
              "kernels are a separate JIT wrapper, BatchAttentionWithAttentionSinkWrapper, not adapted here"),
}


def alibi_refusal(case: Case) -> str | None:
    """Why FlashInfer's ALiBi is not the case's (a non-causal case with several queries), or None."""
    if case.alibi and not (case.causal or case.window is not None or case.S_q == 1):
        return ("flashinfer's ALiBi adds slope·(j − i), linear in the distance: the harness's −slope·|pos(i) − j| only where no "
                f"query sees a later key, so a non-causal case with S_q={case.S_q} > 1 is not served")
    return None


def variant_plan_args(case: Case) -> dict[str, Any]:
    """plan()'s keyword arguments for the case's scale and score variants."""
    args: dict[str, Any] = {"sm_scale": case.softmax_scale}
    if case.softcap is not None:
        args["logits_soft_cap"] = float(case.softcap)
    if case.alibi:
        args["pos_encoding_mode"] = "ALIBI"
    return args


#: FlashInfer's float workspace (its examples allocate 128 MB; split-KV partial results live there).
WORKSPACE_BYTES = 128 * 1024 * 1024
RAGGED_PREFILL = "BatchPrefillWithRaggedKVCacheWrapper"
PAGED_PREFILL = "BatchPrefillWithPagedKVCacheWrapper"
PAGED_DECODE = "BatchDecodeWithPagedKVCacheWrapper"
#: The query-per-KV head groups FlashInfer's CUDA-core decode kernel is compiled for (0.7.2: the
#: DISPATCH_GQA_GROUP_SIZE macro of include/flashinfer/utils.cuh, which csrc/batch_decode.cu's plan
#: dispatches on); any other group fails at plan() with "Unsupported group_size", so it runs tensor cores.
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
#: The page a dense decode's contiguous cache is viewed in: vLLM's default block size and FlashInfer's own
#: examples'. Both decode schedulers split a sequence's KV only at page boundaries, in chunks of at least
#: max(128 / page_size, 1) pages (include/flashinfer/attention/scheduler.cuh), so one page of S_kv tokens
#: would run B·H_kv thread blocks; 16-token pages keep the 128-token chunks a server's cache gets.
DENSE_DECODE_PAGE_SIZE = 16
#: Where FlashInfer looks for nvcc when neither CUDA_HOME, CUDA_PATH nor PATH names one (jit/cpp_ext.py).
DEFAULT_CUDA_HOME = "/usr/local/cuda"


@dataclass
class FlashinferCall:
    """One planned FlashInfer call: the wrapper's name, `plan()`'s keyword arguments, `run()`'s positional ones."""

    wrapper: str
    plan_args: dict[str, Any]
    run_args: tuple[Any, ...]
    #: The output `[T_q, H, d_v]` as the harness checks it (packed rows, or `[B, H, S_q, d_v]` for a dense case).
    to_checked: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda out: out)
    #: The wrapper constructor's keyword arguments after (workspace, "NHD"): `use_tensor_cores` for a decode that needs it.
    init_args: dict[str, Any] = field(default_factory=dict)
    #: What the row records about the call (the decode kernel, the page size).
    notes: dict[str, Any] = field(default_factory=dict)
    #: `run()`'s keyword arguments: an FP8 KV cache's `k_scale` and `v_scale` (its descales, as floats).
    run_kwargs: dict[str, Any] = field(default_factory=dict)


def host_indptr(lengths: Sequence[int]) -> torch.Tensor:
    """Cumulative offsets [0, n_0, n_0 + n_1, …] as a host int32 tensor, from lengths the host already holds."""
    return torch.tensor([0, *itertools.accumulate(int(n) for n in lengths)], dtype=torch.int32)


def page_table_csr(inputs: RaggedInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len), int32, on the host, from the block table."""
    used = pages_used(inputs)
    if min(used) == 0:
        raise Unsupported("flashinfer's paged KV needs every sequence to hold at least one KV token (last_page_len ≥ 1)")
    table = inputs.block_table.to("cpu")  # a server keeps its block table on the host; here, one untimed copy
    indices = torch.cat([table[b, :n] for b, n in enumerate(used)]).to(torch.int32)
    page_size = inputs.page_size
    last = lengths_int32([int(n) - (p - 1) * page_size for n, p in zip(inputs.seq_lens_kv, used)], "cpu")
    return host_indptr(used), indices, last


def decode_kernel(H: int, H_kv: int) -> tuple[dict[str, Any], str]:
    """The decode wrapper's constructor arguments for a head group, and the kernel they select, in the row's words."""
    if H // H_kv in CUDA_CORE_DECODE_GROUPS:
        return {}, "cuda-core decode kernel"
    return {"use_tensor_cores": True}, (f"tensor-core decode (FlashInfer's prefill kernel): its CUDA-core decode kernel has no "
                                        f"head group of {H // H_kv} (it takes {', '.join(map(str, CUDA_CORE_DECODE_GROUPS))})")


def flashinfer_call(inputs: RaggedInputs, dtype: torch.dtype, window_left: int = -1) -> FlashinferCall:
    """Translate a packed or paged batch into a wrapper, its `plan()` arguments and its `run()` arguments (untimed)."""
    q = inputs.q.detach()
    H, d_k = q.shape[1:]
    H_kv, d_v = inputs.k.shape[1], inputs.v.shape[-1]
    common = {"num_qo_heads": H, "num_kv_heads": H_kv, "sm_scale": softmax_scale(inputs), "window_left": window_left,
              "q_data_type": dtype, "kv_data_type": dtype}
    # The offsets come from the host's lengths (the contract's cumulative sums), never copied back from the device.
    qo_indptr = host_indptr(inputs.seq_lens_q)
    if not is_paged(inputs):
        plan = {"qo_indptr": qo_indptr, "kv_indptr": host_indptr(inputs.seq_lens_kv), "head_dim_qk": d_k, "head_dim_vo": d_v,
                "causal": inputs.causal, **common}
        return FlashinferCall(RAGGED_PREFILL, plan, (q, inputs.k.detach(), inputs.v.detach()))
    indptr, indices, last = page_table_csr(inputs)
    cache = (inputs.k_pages.detach(), inputs.v_pages.detach())
    if set(inputs.seq_lens_q) == {1} and d_k == d_v:
        # One query per request: decode, where causal changes nothing (the query sees its whole cache).
        plan = {"indptr": indptr, "indices": indices, "last_page_len": last, "head_dim": d_k, "page_size": inputs.page_size, **common}
        init, kernel = decode_kernel(H, H_kv)
        return FlashinferCall(PAGED_DECODE, plan, (q, cache), init_args=init,
                              notes={"decode_kernel": kernel, "page_size": inputs.page_size})
    plan = {"qo_indptr": qo_indptr, "paged_kv_indptr": indptr, "paged_kv_indices": indices, "paged_kv_last_page_len": last,
            "head_dim_qk": d_k, "head_dim_vo": d_v, "page_size": inputs.page_size, "causal": inputs.causal, **common}
    return FlashinferCall(PAGED_PREFILL, plan, (q, cache), notes={"page_size": inputs.page_size})


def dense_as_ragged(case: Case, inputs: AttentionInputs) -> RaggedInputs:
    """A dense case as the ragged batch it is: B sequences of S_q queries and S_kv keys, packed (copies, untimed).

    A decode case (S_q = 1, no window) is also given its KV as a paged cache, so that it runs FlashInfer's
    decode kernel, the one a server calls for decode steps: the packed KV viewed (same storage) as pages of
    `dense_page_size(S_kv)` tokens, sequence b's pages in order after sequence b − 1's.
    """
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.detach().transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1]).contiguous()

    device = inputs.q.device
    cu = lambda S: torch.arange(0, (case.B + 1) * S, S, dtype=torch.int32, device=device)  # noqa: E731
    ragged = RaggedInputs(rows(inputs.q), rows(inputs.k), rows(inputs.v), (case.S_q,) * case.B, (case.S_kv,) * case.B,
                          cu(case.S_q), cu(case.S_kv), causal=case.causal or case.window is not None)
    if case.S_q != 1 or case.window is not None or case.d_k != case.d_v:
        return ragged
    page = dense_page_size(case.S_kv)
    per_sequence = case.S_kv // page
    pages = lambda t: t.view(case.B * per_sequence, page, *t.shape[1:])  # noqa: E731
    table = torch.arange(case.B * per_sequence, dtype=torch.int32).view(case.B, per_sequence)  # host, as a server's
    return replace(ragged, page_size=page, k_pages=pages(ragged.k), v_pages=pages(ragged.v), block_table=table)


def dense_page_size(S_kv: int) -> int:
    """The page a dense decode's S_kv-token cache is viewed in: DENSE_DECODE_PAGE_SIZE, or the largest power of two dividing S_kv below it.

    A view needs every sequence to start on a page boundary, so the page must divide S_kv; the suites' lengths are
    powers of two of at least 16 and get 16, an odd length gets 1 (still a view, only more pages).
    """
    return math.gcd(S_kv, DENSE_DECODE_PAGE_SIZE)


def flashinfer_dense_call(case: Case, inputs: AttentionInputs) -> FlashinferCall:
    """A dense case through the ragged prefill wrapper (decode: the paged decode wrapper); a window of w keys is window_left = w − 1."""
    call = flashinfer_call(dense_as_ragged(case, inputs), torch_dtype(case.dtype), -1 if case.window is None else case.window - 1)
    call.to_checked = lambda out: out.reshape(case.B, case.S_q, case.H, out.shape[-1]).transpose(1, 2)
    if call.wrapper == PAGED_DECODE:
        call.notes["kv_view"] = f"the contiguous cache viewed as {call.plan_args['page_size']}-token pages (no copy)"
    if case.kv_dtype is not None:
        if call.wrapper != PAGED_DECODE:
            raise Unsupported(f"flashinfer reads an FP8 KV cache here in its paged decode only (one query, no window, d_k = d_v); "
                              f"this case plans {call.wrapper}")
        # The cache is planned in its FP8 format beside the queries' dtype; run() takes the descales as k_scale and v_scale.
        call.plan_args["kv_data_type"] = torch_dtype(case.kv_dtype)
        call.run_kwargs = {"k_scale": float(inputs.descales["k"]), "v_scale": float(inputs.descales["v"])}
        call.notes["kv_cache"] = f"{case.kv_dtype}, k_scale and v_scale at run()"
    return call


#: How a planned module is named among the traced kernels (the kernels column, a mismatch line).
PLANNED_PREFIX = "planned module "


def planned_decode_module(wrapper: Any, head_dim: int) -> str | None:
    """The CUDA-core decode module the wrapper's last plan() built, as FlashInfer names it (its URI, which holds dtype_kv), or None.

    BatchDecodeWithPagedKVCacheWrapper.plan() records the data types it planned (`_cached_q/kv/o_data_type`, `_pos_encoding_mode`,
    `_window_left`, `_logits_soft_cap`) and, without tensor cores, loads `get_batch_decode_module(q, kv, o, indptr.dtype, head_dim,
    head_dim, PosEncodingMode[pos_encoding_mode].value, window_left != -1, logits_soft_cap > 0)`, whose URI
    `get_batch_decode_uri(*args)` is computed here from what plan() recorded (flashinfer 0.7.2.post1's decode.py). None on the
    tensor-core path (another module, whose kernel name holds the type) or where the wrapper records none of it.
    """
    if getattr(wrapper, "use_tensor_cores", True) or getattr(wrapper, "_jit_module", None) is not None:
        return None
    decode = importlib.import_module("flashinfer.decode")
    try:
        args = (wrapper._cached_q_data_type, wrapper._cached_kv_data_type, wrapper._cached_o_data_type, wrapper._paged_kv_indptr_buf.dtype,
                head_dim, head_dim, decode.PosEncodingMode[wrapper._pos_encoding_mode].value, wrapper._window_left != -1,
                (wrapper._logits_soft_cap or 0) > 0)
    except (AttributeError, KeyError):
        return None  # another FlashInfer's wrapper: the kernel-name claim stands alone
    return PLANNED_PREFIX + decode.get_batch_decode_uri(*args)


def kernel_build_refusal() -> str | None:
    """Why FlashInfer could get no kernels here, or None: no prebuilt ones, and no nvcc or ninja to JIT-compile them.

    FlashInfer loads a wrapper's kernel module prebuilt, from flashinfer-jit-cache (module flashinfer_jit_cache) or
    its own data/aot folder (jit/env.py), else builds it on first use: ninja from PATH running
    $CUDA_HOME/bin/nvcc, CUDA_HOME being CUDA_HOME, CUDA_PATH, nvcc's on PATH or /usr/local/cuda (jit/cpp_ext.py).
    flashinfer-cubin does not count: it holds TensorRT-LLM cubins, not these wrappers' FA2 modules.
    """
    if importlib.util.find_spec("flashinfer_jit_cache") is not None or _packaged_aot():
        return None
    prebuilt = "no prebuilt kernels (pip install flashinfer-jit-cache, its wheel for your CUDA)"
    if os.environ.get("FLASHINFER_DISABLE_JIT"):
        return f"flashinfer finds {prebuilt}, and FLASHINFER_DISABLE_JIT forbids compiling them"
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        found = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(found)) if found else DEFAULT_CUDA_HOME
    nvcc = os.environ.get("FLASHINFER_NVCC") or os.path.join(home, "bin", "nvcc")
    if not os.path.isdir(home) or shutil.which(nvcc) is None:
        return (f"flashinfer compiles its kernels on first use but finds no nvcc (not at {nvcc}: set CUDA_HOME or put nvcc on PATH) "
                f"and {prebuilt}")
    if shutil.which("ninja") is None:
        return f"flashinfer compiles its kernels with ninja, which is not on PATH (pip install ninja), and finds {prebuilt}"
    return None


def _packaged_aot() -> bool:
    """Whether the installed flashinfer package ships its own AOT-built kernels (data/aot, jit/env.py's FLASHINFER_AOT_DIR)."""
    spec = importlib.util.find_spec("flashinfer")
    roots = (spec.submodule_search_locations or []) if spec is not None else []
    return any(Path(root, "data", "aot").is_dir() and any(Path(root, "data", "aot").iterdir()) for root in roots)


def flashinfer_unavailable(module: str, no_cpu: str) -> str | None:
    """Why FlashInfer's `module` cannot run here (not installed, no CUDA, no way to build its kernels, a broken import), or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python; CUDA only, no CPU kernel)"
    if not torch.cuda.is_available():
        return f"flashinfer needs CUDA: {no_cpu}"
    # Without it every row would fail at its first plan(), each with the compiler's error.
    reason = kernel_build_refusal()
    if reason:
        return reason
    try:
        importlib.import_module(module)
    except Exception as exc:  # a build that does not match torch or the driver is unavailable, not a crash
        return f"flashinfer failed to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None


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
    score_variants = SCORE_VARIANTS
    feature_reasons = {**VARIANT_REASONS, "deterministic": "FlashInfer's wrappers are forward only: there is no backward to make deterministic",
                       **dict.fromkeys(("dtype:fp8_e4m3", "dtype:fp8_e5m2"),
                                       "FlashInfer has FP8 prefill (e4m3/e5m2 q data types with their scales at run()), "
                                       "which this adapter does not pass yet; its FP8 KV-cache decode it does (kv_dtype)")}
    #: An FP8 KV cache beside fp16/bf16 queries, in the paged decode wrapper (kv_data_type at plan(), k_scale/v_scale at run()).
    kv_dtypes = frozenset({"fp8_e4m3", "fp8_e5m2"})
    dtypes = frozenset({"fp16", "bf16"})
    #: What an FP8-cache row's trace must show: a name holding the cache's FP8 type (the tensor-core path's prefill kernel is
    #: templated on __nv_fp8_e4m3/e5m2), or, for the CUDA-core decode kernel, whose traced name (`…, Params>`) holds none and
    #: whose module loads through TVM-FFI (no operator names it), the module plan() built for kv_data_type (planned_decode_module).
    fp8_kernels = ("fp8", "e4m3", "e5m2")

    def version(self) -> str:
        """The installed FlashInfer version."""
        return str(getattr(importlib.import_module("flashinfer"), "__version__", "unknown"))

    def available(self) -> str | None:
        """Installed (flashinfer-python), a CUDA device, its kernels prebuilt or a compiler to build them, and importable."""
        return flashinfer_unavailable("flashinfer", "it has no CPU kernel")

    def own_refusals(self, case: Case) -> list[str]:
        """Its ragged translations; a dense case neither padded nor MLA's shared latent; ALiBi where its bias is the harness's."""
        reasons = translation_refusals(self, case)
        if case.mla:
            reasons.append("flashinfer's MLA kernels are the flashinfer-mla backend (BatchMLAPagedAttentionWrapper over a paged latent cache)")
        if case.padding:
            reasons.append("flashinfer serves a ragged batch unpadded (the packed layout); a padded dense case is not translated")
        alibi = alibi_refusal(case)
        return reasons + ([alibi] if alibi else [])

    def prepare(self, case: Case, inputs: AttentionInputs | RaggedInputs) -> Prepared:
        """Translate (untimed), build the wrapper on a workspace, time `plan()` into plan_s, and time `run()`."""
        flashinfer = importlib.import_module("flashinfer")
        if isinstance(inputs, RaggedInputs):
            call = flashinfer_call(inputs, torch_dtype(case.dtype))
        else:
            call = flashinfer_dense_call(case, inputs)
        call.plan_args.update(variant_plan_args(case))
        device = inputs.q.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = getattr(flashinfer, call.wrapper)(workspace, "NHD", **call.init_args)
        # The first plan() also loads the kernel module, JIT-compiling it on first use (seconds to minutes):
        # compile time, kept apart; the second is the per-step plan a server pays, the row's plan_ms.
        _, first_s = timed_setup(lambda: wrapper.plan(**call.plan_args), device)
        _, plan_s = timed_setup(lambda: wrapper.plan(**call.plan_args), device)
        run_args, run_kwargs = call.run_args, call.run_kwargs

        def fn() -> torch.Tensor:
            return wrapper.run(*run_args, **run_kwargs)

        built_with = ", ".join(f"{key}={value}" for key, value in call.init_args.items())
        notes = {"kernel": f"flashinfer.{call.wrapper}" + (f"({built_with})" if built_with else ""), "kv_layout": "NHD", **call.notes}
        planned = planned_decode_module(wrapper, call.plan_args["head_dim"]) if call.wrapper == PAGED_DECODE else None
        return Prepared(fn=fn, to_bhsd=call.to_checked, notes=notes, plan_s=plan_s, compile_s=max(0.0, first_s - plan_s),
                        planned_kernels=(planned,) if planned else ())
