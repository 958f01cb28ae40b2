"""The FlashInfer adapter against the installed library's own source, not an emulation of it.

flashinfer cannot import without CUDA, so its source is read instead: every wrapper constructor, plan()
and run() call the adapter makes is bound to the signature `ast` builds from the installed .py file
(following a `**kwargs` that plan() forwards to its implementation), the decode kernel's head groups are
read from its CUDA headers, and plan()'s handling of host index tensors from its body. Tests that read
the source skip only where flashinfer-python's source is absent (CI installs it with --no-deps).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import importlib.util
import os
import re
import shutil

import pytest
import torch

import harness.backends.flashinfer.adapter as fi
from harness.attention.numerics import check_forward
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from tests.flashinfer_sources import NO_SOURCE, SOURCE, bind, class_node, method_node, needs_source, prepared_calls, signature
from tests.library_contracts import flashinfer_emulator
from tests.ragged_fixtures import ragged_batch, serving_case

def adapter_batches():
    """(id, case, inputs) for every wrapper and path the adapter has: ragged and paged, dense, decode at 2:1 and 32:1."""
    paged = lambda lq, lkv, **kw: ragged_batch(lq, lkv, page_size=4, causal=True, seed=3, **kw)  # noqa: E731
    dense = [Case(B=2, S_q=5, S_kv=7, H=4, H_kv=2, d_k=16, d_v=16, causal=True), Case(B=2, S_q=1, S_kv=32, H=32, H_kv=1, d_k=16, d_v=16),
             Case(B=2, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16, window=3)]
    out = [("packed", serving_case(dtype="fp32"), ragged_batch([3, 2], [8, 5], causal=True, seed=3)),
           ("paged-prefill", serving_case(dtype="fp32"), paged([3, 2], [8, 5])),
           ("paged-decode-2:1", serving_case(dtype="fp32"), paged([1, 1], [8, 5])),
           ("paged-decode-32:1", serving_case(dtype="fp32"), paged([1, 1], [8, 5], H=32, H_kv=1))]
    return out + [(case.id, case, make_inputs(case)) for case in dense]


@needs_source
def test_every_call_the_adapter_makes_binds_to_the_installed_signature(monkeypatch):
    bound = set()
    for name, case, inputs in adapter_batches():
        log, _ = prepared_calls(monkeypatch, case, inputs)
        assert [m for _, m, _, _ in log] == ["__init__", "plan", "plan", "run"], name
        for wrapper, method, args, kwargs in log:
            bound.update((wrapper, m) for m in bind(wrapper, method, args, kwargs))
    # Every wrapper's constructor, plan() and run() was bound; the decode plan's keywords reached _plan_impl.
    assert {m for _, m in bound} >= {"__init__", "plan", "run"} and (fi.PAGED_DECODE, "_plan_impl") in bound
    assert {w for w, _ in bound} == {fi.RAGGED_PREFILL, fi.PAGED_PREFILL, fi.PAGED_DECODE}
    # The binding is strict: a keyword plan() does not take, or run()'s arguments of another wrapper, fail.
    decode = fi.flashinfer_call(ragged_batch([1, 1], [8, 5], page_size=4), torch.float32)
    with pytest.raises(TypeError, match="head_dim_qk"):
        bind(fi.PAGED_DECODE, "plan", (), {**decode.plan_args, "head_dim_qk": 16})
    with pytest.raises(TypeError):
        bind(fi.RAGGED_PREFILL, "run", decode.run_args, {})


@needs_source
def test_a_decode_whose_head_group_the_cuda_core_kernel_lacks_runs_the_tensor_core_decode(monkeypatch):
    from suites.decode import SUITE

    utils = (SOURCE / "data" / "include" / "flashinfer" / "utils.cuh").read_text()
    macro = utils[utils.index("#define DISPATCH_GQA_GROUP_SIZE"):]
    macro = macro[:macro.index("#define", 1)]
    groups = {int(g) for g in re.findall(r"group_size == (\d+)", macro)}
    # The CUDA-core decode plan dispatches on that macro; the adapter's copy of its groups must be the library's.
    assert "DISPATCH_GQA_GROUP_SIZE(num_qo_heads / num_kv_heads" in (SOURCE / "data" / "csrc" / "batch_decode.cu").read_text()
    assert 32 not in groups and "use_tensor_cores" in signature(method_node(fi.PAGED_DECODE, "__init__")).parameters
    heads = {(c.H, c.H_kv) for c in SUITE.cases if c.S_q == 1 and not c.mla and not c.padding}
    assert (32, 1) in heads
    for H, H_kv in sorted(heads, key=lambda h: -(h[0] // h[1])):  # MQA's 32:1 first
        case = Case(B=2, S_q=1, S_kv=32, H=H, H_kv=H_kv, d_k=16, d_v=16)
        inputs = make_inputs(case)
        call = fi.flashinfer_dense_call(case, inputs)
        tensor_cores = H // H_kv not in groups
        assert call.wrapper == fi.PAGED_DECODE and getattr(call, "init_args", {}).get("use_tensor_cores", False) is tensor_cores, (H, H_kv)
        assert call.notes["decode_kernel"].startswith("tensor-core" if tensor_cores else "cuda-core"), (H, H_kv)
        assert check_forward(case, inputs, call.to_checked(flashinfer_emulator(call))).agree, (H, H_kv)
        _, prepared = prepared_calls(monkeypatch, case, inputs)
        assert prepared.notes["kernel"].endswith("(use_tensor_cores=True)") is tensor_cores
        assert prepared.notes["decode_kernel"] == call.notes["decode_kernel"]
    paged = fi.flashinfer_call(ragged_batch([1, 1], [8, 5], H=32, H_kv=1, page_size=4), torch.float32)
    assert paged.init_args == {"use_tensor_cores": True}
    assert set(fi.CUDA_CORE_DECODE_GROUPS) == groups  # the adapter's copy of the rule is the library's


def test_a_dense_decode_views_its_cache_as_16_token_pages_of_the_same_storage(monkeypatch):
    for S_kv, page in ((64, 16), (131072, 16), (24, 8), (9, 1)):
        case = Case(B=2 if S_kv < 1000 else 1, S_q=1, S_kv=S_kv, H=2, H_kv=1, d_k=8, d_v=8)
        inputs = make_inputs(case)
        ragged = fi.dense_as_ragged(case, inputs)
        assert ragged.page_size == page and ragged.k_pages.shape == (case.B * S_kv // page, page, 1, 8)
        for pages, packed in ((ragged.k_pages, ragged.k), (ragged.v_pages, ragged.v)):
            assert pages.data_ptr() == packed.data_ptr()
            assert pages.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()  # a view, not a copy
        call = fi.flashinfer_dense_call(case, inputs)
        n = S_kv // page
        assert call.plan_args["page_size"] == page and call.notes["page_size"] == page
        assert call.plan_args["indptr"].tolist() == [b * n for b in range(case.B + 1)]
        assert call.plan_args["indices"].tolist() == list(range(case.B * n)) and call.plan_args["last_page_len"].tolist() == [page] * case.B
        if S_kv < 1000:
            assert check_forward(case, inputs, call.to_checked(flashinfer_emulator(call))).agree, S_kv
    _, prepared = prepared_calls(monkeypatch, case, inputs)
    assert prepared.notes["page_size"] == 1 and "1-token pages (no copy)" in prepared.notes["kv_view"]


def test_available_says_what_is_missing_to_get_the_kernels(monkeypatch, tmp_path):
    package, cuda = tmp_path / "site" / "flashinfer", tmp_path / "cuda"
    package.mkdir(parents=True)
    jit_cache: list = [None]
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "flashinfer":
            spec = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
            spec.submodule_search_locations = [str(package)]
            return spec
        return jit_cache[0] if name == "flashinfer_jit_cache" else real_find_spec(name, *args, **kwargs)

    on_path: dict = {}
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    def which(cmd, *args, **kwargs):
        return (cmd if os.access(cmd, os.X_OK) else None) if os.path.isabs(cmd) else on_path.get(cmd)

    monkeypatch.setattr(shutil, "which", which)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fi, "DEFAULT_CUDA_HOME", str(tmp_path / "no-cuda"), raising=False)
    for name in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC", "FLASHINFER_DISABLE_JIT"):
        monkeypatch.delenv(name, raising=False)
    backend = fi.FlashinferBackend()

    reason = backend.available()  # checked before flashinfer is imported: here it could not be
    assert "nvcc" in reason and "CUDA_HOME" in reason and "pip install flashinfer-jit-cache" in reason and "\n" not in reason
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    assert "ninja, which is not on PATH" in backend.available()
    on_path["ninja"] = "/venv/bin/ninja"
    assert fi.kernel_build_refusal() is None
    monkeypatch.delenv("CUDA_HOME")
    on_path["nvcc"] = str(cuda / "bin" / "nvcc")  # found on PATH: CUDA_HOME is its parent's parent
    assert fi.kernel_build_refusal() is None
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    assert "FLASHINFER_DISABLE_JIT forbids compiling" in backend.available()
    jit_cache[0] = importlib.machinery.ModuleSpec("flashinfer_jit_cache", None)  # prebuilt: no compiler needed
    assert fi.kernel_build_refusal() is None
    jit_cache[0] = None
    (package / "data" / "aot" / "batch_decode_module").mkdir(parents=True)  # an AOT build of flashinfer itself
    assert fi.kernel_build_refusal() is None


def _on_device(obj, fields):
    """obj with the named tensors moved to the meta device: a stand-in for the GPU whose data cannot be read back."""
    return dataclasses.replace(obj, **{f: getattr(obj, f).to("meta") for f in fields if getattr(obj, f) is not None})


def test_plan_is_handed_host_index_tensors_and_the_library_copies_them_itself():
    device_fields = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv", "k_pages", "v_pages")
    calls = [fi.flashinfer_call(_on_device(ragged_batch(lq, lkv, page_size=ps, seed=4), device_fields), torch.bfloat16)
             for lq, lkv, ps in (([3, 2], [8, 5], None), ([3, 2], [8, 5], 4), ([1, 1], [8, 5], 4))]
    for case in (Case(B=2, S_q=1, S_kv=32, H=4, H_kv=1, d_k=16, d_v=16), Case(B=2, S_q=4, S_kv=8, H=4, H_kv=2, d_k=16, d_v=16)):
        calls.append(fi.flashinfer_dense_call(case, _on_device(make_inputs(case), ("q", "k", "v"))))
    assert {c.wrapper for c in calls} == {fi.RAGGED_PREFILL, fi.PAGED_PREFILL, fi.PAGED_DECODE}
    for call in calls:
        indexes = {k: v for k, v in call.plan_args.items() if isinstance(v, torch.Tensor)}
        assert len(indexes) >= 2 and all(t.device.type == "cpu" and t.dtype == torch.int32 for t in indexes.values()), call.wrapper
        assert all(t.device.type == "meta" for t in call.run_args if isinstance(t, torch.Tensor))  # the data stays on the device
    if SOURCE is None:
        pytest.skip(NO_SOURCE)
    # plan() reads each index tensor on the host (`.to("cpu")`) and moves it to the device itself (`.to(self.device`).
    for call in calls:
        body = "\n".join(ast.unparse(method_node(call.wrapper, m)) for m in ("plan", "_plan_impl") if _defines(call.wrapper, m))
        for name, t in call.plan_args.items():
            if isinstance(t, torch.Tensor):
                assert re.search(rf"\b{name}\.to\((self\.device|'cpu')", body), (call.wrapper, name)


def _defines(cls: str, method: str) -> bool:
    """Whether the class's source defines the method."""
    return any(isinstance(n, ast.FunctionDef) and n.name == method for n in class_node(cls).body)


def _real_decode_module_namespace():
    """flashinfer.decode's two names planned_decode_module reads, from the installed source: PosEncodingMode (utils.py) and
    get_batch_decode_uri (jit/attention/modules.py) over the dtype names of jit/utils.py, none of which imports without CUDA whole."""
    import types
    from enum import Enum

    spec = importlib.util.spec_from_file_location("flashinfer_jit_utils", SOURCE / "jit" / "utils.py")
    jit_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jit_utils)
    namespace = {"Enum": Enum, **vars(jit_utils)}
    for path, name in ((SOURCE / "utils.py", "PosEncodingMode"), (SOURCE / "jit" / "attention" / "modules.py", "get_batch_decode_uri")):
        node = next(n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == name)
        exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return types.SimpleNamespace(PosEncodingMode=namespace["PosEncodingMode"], get_batch_decode_uri=namespace["get_batch_decode_uri"])


#: What the CUDA-core decode kernel's traced name looks like: its template ends in `Params`, no dtype (issue 45).
DECODE_KERNEL = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, Params>"


@needs_source
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_decode_on_the_cuda_core_kernel_is_proved_fp8_by_the_module_its_plan_built(kv_dtype, monkeypatch):
    """The CUDA-core decode kernel's name holds no dtype: the proof reads the module plan() built for kv_data_type (its URI)."""
    import sys
    import types

    from harness.backends.kernel_claims import claimed_kernels, mismatch

    plan = method_node(fi.PAGED_DECODE, "_plan_impl")  # plan() hands every argument to it
    # What the adapter reads back is what the real plan() records, and the CUDA-core module it loads is built from exactly that.
    assigned = {ast.unparse(t): ast.unparse(n.value) for n in ast.walk(plan) if isinstance(n, ast.Assign) for t in n.targets}
    recorded = {"_cached_q_data_type": "q_data_type", "_cached_kv_data_type": "kv_data_type", "_cached_o_data_type": "o_data_type",
                "_pos_encoding_mode": "pos_encoding_mode", "_window_left": "window_left", "_logits_soft_cap": "logits_soft_cap"}
    assert {a: assigned.get(f"self.{a}") for a in recorded} == recorded
    assert assigned["self._paged_kv_indptr_buf"].startswith("indptr.to(")
    builds = [ast.unparse(n) for n in ast.walk(plan) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "get_batch_decode_module"]
    assert builds == ["get_batch_decode_module(q_data_type, kv_data_type, o_data_type, indptr.dtype, head_dim, head_dim, "
                      "PosEncodingMode[pos_encoding_mode].value, window_left != -1, logits_soft_cap > 0)"]
    module_fn = next(n for n in ast.parse((SOURCE / "decode.py").read_text()).body if getattr(n, "name", "") == "get_batch_decode_module")
    assert "uri = get_batch_decode_uri(*args)" in ast.unparse(module_fn)

    class DecodeWrapper:  # records what plan() records, in the names and from the arguments asserted above
        use_tensor_cores, _jit_module = False, None

        def __init__(self, workspace, layout, **kwargs):
            assert not kwargs.get("use_tensor_cores")

        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode="NONE",
                 window_left=-1, logits_soft_cap=None, q_data_type=torch.float16, kv_data_type=None, **_):
            self._cached_q_data_type, self._cached_kv_data_type = q_data_type, kv_data_type or q_data_type
            self._cached_o_data_type, self._paged_kv_indptr_buf = q_data_type, indptr.to("cpu")
            self._pos_encoding_mode, self._window_left, self._logits_soft_cap = pos_encoding_mode, window_left, logits_soft_cap

        def run(self, q, cache, **_):
            return torch.zeros(q.shape[0], q.shape[1], cache[1].shape[-1], dtype=q.dtype)

    decode = _real_decode_module_namespace()
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(**{fi.PAGED_DECODE: DecodeWrapper}, decode=decode))
    monkeypatch.setitem(sys.modules, "flashinfer.decode", decode)
    case = Case(B=2, S_q=1, S_kv=64, H=8, H_kv=2, d_k=64, d_v=64, dtype="bf16", kv_dtype=kv_dtype, device="cpu")
    prepared = fi.FlashinferBackend().prepare(case, make_inputs(case))
    short = kv_dtype.removeprefix("fp8_")
    assert prepared.planned_kernels == (fi.PLANNED_PREFIX + "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_" + short +
                                        "_dtype_o_bf16_dtype_idx_i32_head_dim_qk_64_head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False",)
    claim = claimed_kernels(fi.FlashinferBackend(), case)
    trace = [DECODE_KERNEL]
    assert mismatch(claim, trace, trace) is not None  # the name alone proves nothing
    assert mismatch(claim, trace, [*trace, *prepared.planned_kernels]) is None
    # A plan that left the cache in bf16 (kv_data_type not passed) builds the bf16 module: no proof, the row is kernel_mismatch.
    wrapper = DecodeWrapper(None, "NHD")
    wrapper.plan(torch.zeros(3, dtype=torch.int32), None, None, 8, 2, 64, 16, q_data_type=torch.bfloat16)
    bf16_plan = fi.planned_decode_module(wrapper, 64)
    assert "dtype_kv_bf16" in bf16_plan and mismatch(claim, trace, [*trace, bf16_plan]) is not None
