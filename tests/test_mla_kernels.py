"""The real MLA decode kernels (FlashMLA, FlashInfer's MLA wrapper) and the paged MLA cases they serve, on the CPU.

The kernels need a GPU. What is held here: a paged MLA case and its latent pages; the eager `mla` backend's paged
form against the float64 reference; every call the two adapters make bound to the real library's signature (FlashInfer
from its installed source, FlashMLA from its interface's source as fetched from deepseek-ai/FlashMLA); and each
adapter's prepare() run against a stand-in library that computes the documented math from the arguments it is handed,
checked through `check_ragged_forward`.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import types

import pytest
import torch

from harness.attention.numerics import check_ragged_forward
from harness.backends import registry as registry_module
from harness.backends.flashinfer.mla import WRAPPER, FlashinferMlaBackend, flashinfer_mla_call
from harness.backends.flashmla.adapter import FlashmlaBackend, flashmla_call
from harness.backends.pytorch.mla import MlaBackend
from harness.execution.execute import PairRunner, execute
from harness.measure.timing import Budget
from harness.suite.batch_axes import ragged_case
from harness.suite.catalog import load_suite
from harness.suite.ragged import make_ragged_inputs, page_rows
from tests.flashinfer_sources import NO_SOURCE, SOURCE, signature
from tests.real_signatures import signature_from_source

FAST = PairRunner(budget=Budget(warmup_s=0.0, measure_s=0.005, min_sample_s=0.0, min_rounds=1, max_rounds=3))
MINE = ("harness.backends.flashmla.adapter", "harness.backends.flashinfer.mla")


def mla_case(batch="3x1@uniform(40,200)", *, H=4, d_k=576, d_v=512, page_size=64, dtype="bf16", device="cpu", causal=True, seed=0):
    """A paged MLA batch at DeepSeek's latent widths (d_c 512 + d_rope 64) unless told otherwise."""
    return ragged_case(batch, "paged", page_size=page_size, H=H, H_kv=1, d_k=d_k, d_v=d_v, dtype=dtype, device=device,
                       causal=causal, mla=True, seed=seed)


def pages_in_order(inputs) -> None:
    """Rewrite the block table as if each request's pages were consecutive (the usual translation bug), in place."""
    start = 0
    for b, n in enumerate(math.ceil(kv / inputs.page_size) for kv in inputs.seq_lens_kv):
        inputs.block_table[b, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n


def latent_attention(q, latent, d_v, scale, causal):
    """One request in float64: q `[S_q, H, d]` over its latent rows `[L, d]`, the values their first d_v columns; bottom-right causal."""
    q, latent = q.double(), latent.double()
    scores = torch.einsum("qhd,ld->hql", q, latent) * scale
    if causal:
        S_q, L = q.shape[0], latent.shape[0]
        hidden = torch.arange(L)[None, :] > torch.arange(S_q)[:, None] + (L - S_q)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hql,lv->qhv", torch.softmax(scores, -1), latent[:, :d_v])


# -- the paged MLA case and its eager baseline --


def test_a_paged_mla_case_holds_one_latent_cache_and_v_inside_it():
    case = mla_case(H=8, d_k=72, d_v=64, dtype="fp32")
    assert "mla" in case.id and "paged" in case.id
    inputs = make_ragged_inputs(case)
    assert inputs.k_pages.shape[2:] == (1, 72) and inputs.v_pages.shape[2:] == (1, 64)
    assert torch.equal(inputs.v, inputs.k[..., :64]) and torch.equal(inputs.v_pages, inputs.k_pages[..., :64])
    assert torch.equal(inputs.k_pages.reshape(-1, 1, 72)[page_rows(inputs)], inputs.k)
    # The reference's cache key re-lays the batch as packed: that case must build too.
    assert case.replace(layout="packed", page_size=None).mla


@pytest.mark.parametrize("batch, causal", [("4x1@uniform(16,200)", True), ("2x3@uniform(20,130)", True), ("2x3@uniform(20,130)", False)])
def test_the_eager_mla_backend_serves_the_paged_form_and_agrees(batch, causal):
    case = mla_case(batch, H=8, d_k=72, d_v=64, dtype="fp32", causal=causal)
    record = execute(case, MlaBackend(), FAST)
    assert record.status == "ok" and record.agree is True, (record.reason, record.max_abs_err, record.err_bound)
    assert record.notes["paged_via"] == "gather_then_absorbed" and record.notes["kv_cache_bytes_per_token"] == 72 * 4


def test_the_eager_mla_backend_agrees_at_deepseek_width_in_bf16():
    case = mla_case("2x1@uniform(60,140)", H=16)
    inputs = make_ragged_inputs(case)
    prepared = MlaBackend().prepare(case, inputs)
    assert check_ragged_forward(case, inputs, prepared.to_bhsd(prepared.fn())).agree


def test_the_kernels_refuse_what_they_cannot_serve_and_are_unavailable_here_with_a_reason():
    gpu = mla_case(device="cuda")
    flashmla, flashinfer = FlashmlaBackend(), FlashinferMlaBackend()
    for backend in (flashmla, flashinfer):
        assert backend.supports(gpu) is None, backend.name
        assert backend.family == "mla" and backend.attention_core == MlaBackend.attention_core
        assert "latent-cache cases only" in backend.supports(gpu.replace(mla=False, d_v=576))
        assert "CPU" in backend.supports(gpu.replace(device="cpu"))
        assert "fp16" in backend.supports(gpu.replace(dtype="fp32"))
        assert "does not take" in backend.supports(gpu.replace(layout="packed", page_size=None))
    assert "64-token pages only" in flashmla.supports(gpu.replace(page_size=16))
    assert flashinfer.supports(gpu.replace(page_size=16)) is None
    assert "d_k=576" in flashmla.supports(mla_case(d_k=72, d_v=64, device="cuda"))
    assert "d_c=512" in flashinfer.supports(mla_case(d_k=72, d_v=64, device="cuda"))
    assert "one query length" in flashmla.supports(mla_case("1x2 + 2x1@128", device="cuda"))
    if not torch.cuda.is_available():
        assert flashmla.available().startswith("flash_mla is not installed (")
        assert "CUDA" in flashinfer.available() or "not installed" in flashinfer.available()
        assert execute(gpu, flashmla, FAST).status == "unsupported"


def test_both_are_listed_with_their_availability(monkeypatch, capsys):
    # Until registry.BUILTIN_MODULES names these modules (an edit outside this change) they are added here.
    missing = tuple(m for m in MINE if m not in registry_module.BUILTIN_MODULES)
    monkeypatch.setattr(registry_module, "BUILTIN_MODULES", registry_module.BUILTIN_MODULES + missing)
    rows = {row.name: row for row in registry_module.load_registry(plugins=False).describe()}
    for name in ("flashmla", "flashinfer-mla"):
        assert rows[name].family == "mla"
        assert rows[name].available == (rows[name].reason is None)
    if not torch.cuda.is_available():
        assert "flash_mla is not installed" in rows["flashmla"].reason and not rows["flashinfer-mla"].available
    from harness.cli.main import main

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "flashmla" in out and "flashinfer-mla" in out


# -- every call held to the real library's signature --

#: flash_mla/flash_mla_interface.py's two functions as deepseek-ai/FlashMLA defines them (signatures only, bodies
#: elided), at the newest stored commit (FlashMLASchedMeta: a lazy schedule) and an older one (get_mla_metadata's tensors).
FLASHMLA_SOURCES = {
    "02fe0d02e83f15ae5a049cc4acc009a50553e64c": '''
def get_mla_metadata(*args, **kwargs): ...
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits=None,
                           softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None): ...
''',
    "323f076dd194c18be9d569d1fdf3c2fd8903e2af": '''
def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None, is_fp8_kvcache=False, topk=None): ...
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                           softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, descale_q=None, descale_k=None): ...
''',
}
NEWEST_FLASHMLA = signature_from_source(FLASHMLA_SOURCES["02fe0d02e83f15ae5a049cc4acc009a50553e64c"], "flash_mla_with_kvcache")


@pytest.mark.parametrize("commit", list(FLASHMLA_SOURCES))
def test_flashmla_calls_bind_to_its_interface(commit):
    call = flashmla_call(mla_case(), make_ragged_inputs(mla_case()))
    source = FLASHMLA_SOURCES[commit]
    signature_from_source(source, "get_mla_metadata").bind(*call.metadata_args)
    signature_from_source(source, "flash_mla_with_kvcache").bind(**call.kernel_args, tile_scheduler_metadata=None, num_splits=None)


def _wrapper_source() -> ast.ClassDef:
    """flashinfer.BatchMLAPagedAttentionWrapper as written: flashinfer/__init__.py → mla/_core.py → mla/_batch_mla/_wrapper.py."""
    init = ast.parse((SOURCE / "__init__.py").read_text())
    assert any(isinstance(n, ast.ImportFrom) and n.module == "mla" and any(a.name == WRAPPER for a in n.names) for n in init.body)
    core = ast.parse((SOURCE / "mla" / "_core.py").read_text())
    assert any(isinstance(n, ast.ImportFrom) and n.module == "_batch_mla._wrapper" and any(a.name == WRAPPER for a in n.names)
               for n in ast.walk(core))
    tree = ast.parse((SOURCE / "mla" / "_batch_mla" / "_wrapper.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == WRAPPER)


def _methods(cls: ast.ClassDef, name: str) -> tuple[inspect.Signature, list[inspect.Signature]]:
    """A method's real signature and those of its @overload forms."""
    defs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    overload = lambda d: any(getattr(x, "id", getattr(x, "attr", "")) == "overload" for x in d.decorator_list)  # noqa: E731
    return signature(next(d for d in reversed(defs) if not overload(d))), [signature(d) for d in defs if overload(d)]


def _metadata_source() -> inspect.Signature:
    tree = ast.parse((SOURCE / "mla" / "_batch_mla" / "_contracts.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MLAPlanMetadata")
    return signature(next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "csr"))


needs_flashinfer = pytest.mark.skipif(SOURCE is None or not (SOURCE / "mla" / "_batch_mla" / "_wrapper.py").is_file(), reason=NO_SOURCE)


@needs_flashinfer
def test_flashinfer_mla_calls_bind_to_the_installed_wrapper_and_its_preferred_forms():
    call = flashinfer_mla_call(mla_case(), make_ragged_inputs(mla_case()))
    cls = _wrapper_source()
    _metadata_source().bind("cls", **call.metadata)
    plan, plan_forms = _methods(cls, "plan")
    run, run_forms = _methods(cls, "run")
    plan.bind("self", metadata="metadata", **call.plan_args)
    run.bind("self", **call.run_args)
    # Not only accepted: the forms the source calls preferred (metadata=; query=/kv_cache=), not its deprecated ones.
    assert any(_binds(form, metadata="metadata", **call.plan_args) for form in plan_forms)
    assert sum(_binds(form, **call.run_args) for form in run_forms) == 1
    init, _ = _methods(cls, "__init__")
    init.bind("self", "workspace")


def _binds(sig: inspect.Signature, **kwargs) -> bool:
    try:
        sig.bind("self", **kwargs)
        return True
    except TypeError:
        return False


# -- prepare() against stand-ins that compute the documented math from what they are handed --


def fake_flash_mla(log: list, lazy: bool) -> types.ModuleType:
    """A `flash_mla` whose kernel binds its arguments to the real signature and attends over the pages the block table names."""
    mod = types.ModuleType("flash_mla")

    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
        log.append("metadata")
        return (object(), None) if lazy else (torch.zeros(4, 8, dtype=torch.int32), torch.zeros(len(cache_seqlens) + 1, dtype=torch.int32))

    def flash_mla_with_kvcache(*args, **kwargs):
        a = NEWEST_FLASHMLA.bind(*args, **kwargs).arguments
        log.append("kernel")
        q, cache, table, lens = a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"]
        assert q.dim() == 4 and cache.shape[1:3] == (64, 1) and table.dtype == lens.dtype == torch.int32
        assert bool((table >= 0).all()), "a -1 block-table entry is an out-of-bounds page"
        out = []
        for b in range(q.shape[0]):
            t = torch.arange(int(lens[b]))
            latent = cache[table[b, t // 64].long(), t % 64, 0]
            out.append(latent_attention(q[b], latent, a["head_dim_v"], a["softmax_scale"], a.get("causal", False)))
        return torch.stack(out).to(q.dtype), None

    mod.get_mla_metadata, mod.flash_mla_with_kvcache = get_mla_metadata, flash_mla_with_kvcache
    return mod


@pytest.mark.parametrize("lazy", [True, False], ids=["sched-meta", "metadata-tensors"])
@pytest.mark.parametrize("batch", ["3x1@uniform(40,200)", "2x2@uniform(70,150)"])
def test_flashmla_prepare_meets_the_reference_through_a_stand_in(monkeypatch, lazy, batch):
    log: list = []
    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla(log, lazy))
    case = mla_case(batch)
    inputs = make_ragged_inputs(case)
    prepared = FlashmlaBackend().prepare(case, inputs)
    assert log == ["metadata", "kernel"] and prepared.plan_s >= 0  # the schedule and the first call, untimed
    assert check_ragged_forward(case, inputs, prepared.to_bhsd(prepared.fn())).agree and log[-1] == "kernel"
    assert prepared.notes["scheduler"] == ("filled by the first (untimed) call" if lazy else "get_mla_metadata")
    # The stand-in is strict enough: pages assumed in order give another answer.
    pages_in_order(inputs)
    wrong = FlashmlaBackend().prepare(case, inputs)
    assert not check_ragged_forward(case, make_ragged_inputs(case), wrong.to_bhsd(wrong.fn())).agree


def fake_flashinfer_mla(log: list) -> tuple[types.ModuleType, types.ModuleType]:
    """`flashinfer` and `flashinfer.mla` stand-ins: the wrapper binds plan()/run() to the real source and reads the CSR page table."""
    cls = _wrapper_source()
    plan_sig, run_sig, init_sig = (_methods(cls, name)[0] for name in ("plan", "run", "__init__"))
    csr_sig = _metadata_source()

    class MLAPlanMetadata(types.SimpleNamespace):
        @classmethod
        def csr(cls, *args, **kwargs):
            return cls(**csr_sig.bind("cls", *args, **kwargs).arguments)

    class Wrapper:
        def __init__(self, *args, **kwargs):
            init_sig.bind(self, *args, **kwargs)
            log.append("init")

        def plan(self, *args, **kwargs):
            self.plan_args = plan_sig.bind(self, *args, **kwargs).arguments
            log.append("plan")

        def run(self, *args, **kwargs):
            a, p = run_sig.bind(self, *args, **kwargs).arguments, self.plan_args
            log.append("run")
            q, latent = torch.cat(a["query"], -1), torch.cat(a["kv_cache"], -1)
            assert latent.dim() == 3 and latent.shape[1] == p["page_size"] and q.shape[-1] == p["head_dim_ckv"] + p["head_dim_kpe"]
            m = p["metadata"]
            out = torch.empty(q.shape[0], q.shape[1], p["head_dim_ckv"], dtype=q.dtype)
            for b in range(len(m.kv_len_arr)):
                pages, n = m.kv_indices[m.kv_indptr[b]:m.kv_indptr[b + 1]].long(), int(m.kv_len_arr[b])
                assert len(pages) == math.ceil(n / p["page_size"])
                rows = slice(int(m.qo_indptr[b]), int(m.qo_indptr[b + 1]))
                out[rows] = latent_attention(q[rows], latent[pages].reshape(-1, q.shape[-1])[:n], p["head_dim_ckv"], p["sm_scale"],
                                             p["causal"]).to(q.dtype)
            return out

    flashinfer = types.ModuleType("flashinfer")
    setattr(flashinfer, WRAPPER, Wrapper)
    mla = types.ModuleType("flashinfer.mla")
    mla.MLAPlanMetadata = MLAPlanMetadata
    return flashinfer, mla


@needs_flashinfer
@pytest.mark.parametrize("batch", ["3x1@uniform(40,200)", "1x3 + 2x1@uniform(70,150)"])
def test_flashinfer_mla_prepare_plans_untimed_and_meets_the_reference_through_a_stand_in(monkeypatch, batch):
    log: list = []
    flashinfer, mla = fake_flashinfer_mla(log)
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", mla)
    case = mla_case(batch)
    inputs = make_ragged_inputs(case)
    prepared = FlashinferMlaBackend().prepare(case, inputs)
    assert log == ["init", "plan", "plan"] and prepared.plan_s >= 0 and prepared.compile_s is not None
    assert check_ragged_forward(case, inputs, prepared.to_bhsd(prepared.fn())).agree and log[-1] == "run"
    query, kv_cache = flashinfer_mla_call(case, inputs).run_args.values()
    assert query[0].data_ptr() == inputs.q.data_ptr() and kv_cache[0].data_ptr() == inputs.k_pages.data_ptr()  # views, no copy
    pages_in_order(inputs)
    wrong = FlashinferMlaBackend().prepare(case, inputs)
    assert not check_ragged_forward(case, make_ragged_inputs(case), wrong.to_bhsd(wrong.fn())).agree


# -- the suites --


def test_the_suites_hold_paged_mla_decodes_at_deepseek_and_kimi_shapes_with_tp_shards():
    for name in ("decode", "models-2026"):
        suite = load_suite(name)
        paged = [c for c in suite.cases if c.mla and c.layout == "paged"]
        assert paged and all(c.page_size == 64 and c.H_kv == 1 and (c.d_k, c.d_v) == (576, 512) and c.S_q == 1 for c in paged), name
        assert any(c.mla and c.layout == "dense" for c in suite.cases), name  # beside the eager absorbed form
        cpu = [c for c in suite.on_device("cpu").cases if c.mla and c.layout == "paged"]
        assert cpu and all(c.H <= 16 and sum(c.seq_lens_kv) <= 1024 for c in cpu), name
    heads = {c.H for c in load_suite("decode").cases if c.mla and c.layout == "paged"}
    assert heads >= {128, 16, 64, 8}  # DeepSeek-V3 and Kimi-K2, TP 1 and 8
    assert {c.H for c in load_suite("models-2026").cases if c.mla and c.layout == "paged"} == {64, 8}
