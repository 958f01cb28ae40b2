"""decode: one new token (and a few, as in speculative decoding) against a KV cache; bytes moved is the headline.

CUDA: H = 32 with H_kv ∈ {32, 8, 1} (MHA, GQA, MQA), d_k = 128, cache length L from 1 Ki to 128 Ki,
B ∈ {1, 16, 64}, bf16; plus S_q = 4 (causal), per-sequence cache lengths (padding), and DeepSeek-V3's
absorbed MLA (128 heads against one 576-wide latent). The records' `kv_cache_bytes` give
MHA : GQA : MQA = 1 : 8/32 : 1/32 on the same L and B. On a CPU the same shapes shrink (`cpu_cases`).
"""

from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

L_CUDA = [1024 * 2**i for i in range(8)]  # 1 Ki … 128 Ki

_cuda = [
    *grid(B=[1, 16, 64], S_q=[1], S_kv=L_CUDA, H=[32], H_kv=[32, 8, 1], d_k=[128], dtype=["bf16"], device="cuda"),
    *grid(B=[16], S_q=[4], S_kv=[4096, 32768], H=[32], H_kv=[32, 8, 1], d_k=[128], dtype=["bf16"], causal=[True], device="cuda"),
    *grid(B=[16, 64], S_q=[1], S_kv=[8192, 32768], H=[32], H_kv=[8], d_k=[128], dtype=["bf16"], padding=[True], device="cuda"),
    *grid(B=[1, 16], S_q=[1], S_kv=[4096, 32768], H=[128], H_kv=[1], d_k=[576], d_v=[512], dtype=["bf16"], mla=[True], device="cuda"),
]

_cpu = [
    *grid(B=[1, 4], S_q=[1], S_kv=[512, 2048], H=[8], H_kv=[8, 2, 1], d_k=[64], dtype=["fp32"]),
    *grid(B=[4], S_q=[4], S_kv=[512], H=[8], H_kv=[8, 2, 1], d_k=[64], dtype=["fp32"], causal=[True]),
    *grid(B=[4], S_q=[1], S_kv=[1024], H=[8], H_kv=[2], d_k=[64], dtype=["fp32"], padding=[True]),
    *grid(B=[2], S_q=[1], S_kv=[1024], H=[16], H_kv=[1], d_k=[72], d_v=[64], dtype=["fp32"], mla=[True]),
]

SUITE = Suite(
    name="decode",
    description="decoding: S_q 1 (and 4) against a KV cache of L 1Ki–128Ki, H 32, H_kv 32/8/1, B 1/16/64, MLA; CPU: smaller",
    cases=tuple(_cuda),
    cpu_cases=tuple(_cpu),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
