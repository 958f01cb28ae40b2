"""decode: one new token (and a few, as in speculative decoding) against a KV cache; bytes moved is the headline.

CUDA: H = 32 with H_kv ∈ {32, 8, 1} (MHA, GQA, MQA), d_k = 128, cache length L from 1 Ki to 128 Ki,
B ∈ {1, 16, 64}, bf16; plus S_q = 4 (causal), per-sequence cache lengths (padding), and DeepSeek-V3's
absorbed MLA (128 heads against one 576-wide latent), dense and as a server holds it: ragged decode batches over a
paged latent cache (64-token pages, FlashMLA's) at DeepSeek-V3's and Kimi-K2's heads, at TP 1 and 8 (H/8 query
heads per GPU, the latent cache replicated), which FlashMLA and FlashInfer's MLA wrapper serve beside the eager `mla`.
The records' `kv_cache_bytes` give MHA : GQA : MQA = 1 : 8/32 : 1/32 on the same L and B. On a CPU the same shapes
shrink (`cpu_cases`); its paged MLA decodes keep the real latent widths at the TP-8 heads, over a few short requests.
"""

from harness.suite.batch_axes import ragged_cases
from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.suite.presets import get_preset, tp_heads
from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

#: MLA's paged decode: the models, the page size FlashMLA requires, and the ragged decode batches (one token per request).
MLA_MODELS = ("deepseek-v3", "kimi-k2")
MLA_PAGE = 64
MLA_DECODES_CUDA = ("16x1@uniform(1024,8192)", "64x1@uniform(1024,16384)")
MLA_DECODES_CPU = ("3x1@uniform(32,200)",)


def paged_mla_decodes(names, batches, tps, **fields) -> list:
    """Paged decode cases of MLA models' absorbed form: H/tp query heads against the replicated latent (d_c + d_rope, d_c)."""
    cases = []
    for name in names:
        preset = get_preset(name)
        for tp in tps:
            cases += ragged_cases(batches, ("paged",), page_sizes=(MLA_PAGE,), H=tp_heads(preset, tp)[0], H_kv=1,
                                  d_k=preset.d_c + preset.d_rope, d_v=preset.d_c, mla=True, causal=True, **fields)
    return cases

L_CUDA = [1024 * 2**i for i in range(8)]  # 1 Ki … 128 Ki

_cuda = [
    *grid(B=[1, 16, 64], S_q=[1], S_kv=L_CUDA, H=[32], H_kv=[32, 8, 1], d_k=[128], dtype=["bf16"], device="cuda"),
    *grid(B=[16], S_q=[4], S_kv=[4096, 32768], H=[32], H_kv=[32, 8, 1], d_k=[128], dtype=["bf16"], causal=[True], device="cuda"),
    *grid(B=[16, 64], S_q=[1], S_kv=[8192, 32768], H=[32], H_kv=[8], d_k=[128], dtype=["bf16"], padding=[True], device="cuda"),
    *grid(B=[1, 16], S_q=[1], S_kv=[4096, 32768], H=[128], H_kv=[1], d_k=[576], d_v=[512], dtype=["bf16"], mla=[True], device="cuda"),
    *paged_mla_decodes(MLA_MODELS, MLA_DECODES_CUDA, (1, 8), dtype="bf16", device="cuda"),
]

_cpu = [
    *grid(B=[1, 4], S_q=[1], S_kv=[512, 2048], H=[8], H_kv=[8, 2, 1], d_k=[64], dtype=["fp32"]),
    *grid(B=[4], S_q=[4], S_kv=[512], H=[8], H_kv=[8, 2, 1], d_k=[64], dtype=["fp32"], causal=[True]),
    *grid(B=[4], S_q=[1], S_kv=[1024], H=[8], H_kv=[2], d_k=[64], dtype=["fp32"], padding=[True]),
    *grid(B=[2], S_q=[1], S_kv=[1024], H=[16], H_kv=[1], d_k=[72], d_v=[64], dtype=["fp32"], mla=[True]),
    *paged_mla_decodes(MLA_MODELS, MLA_DECODES_CPU, (8,), dtype="fp32", device="cpu"),
]

SUITE = Suite(
    name="decode",
    description=("decoding: S_q 1 (and 4) against a KV cache of L 1Ki–128Ki, H 32, H_kv 32/8/1, B 1/16/64, MLA dense and paged "
                 "(DeepSeek-V3, Kimi-K2, TP 1 and 8); CPU: smaller"),
    cases=tuple(_cuda),
    cpu_cases=tuple(_cpu),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
