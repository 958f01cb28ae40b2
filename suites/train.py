"""train: forward, backward and forward+backward of causal attention in bf16, as a training step runs it.

CUDA: B = 4, S 1 Ki–8 Ki, H = 16 (MHA and GQA with 4 K/V heads), d_k 64 and 128; a padded batch
and a sliding window (Mistral's pattern) at S = 4 Ki. On a CPU the same modes at S 128 and 256.
"""

from harness.suite.cases import MODES, grid
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

_cuda = [
    *grid(B=[4], S=[1024, 2048, 4096, 8192], H=[16], H_kv=["H", 4], d_k=[64, 128], dtype=["bf16"], causal=[True], mode=MODES, device="cuda"),
    *grid(B=[4], S=[4096], H=[16], H_kv=[4], d_k=[128], dtype=["bf16"], causal=[True], padding=[True], mode=MODES, device="cuda"),
    *grid(B=[4], S=[4096], H=[16], H_kv=[4], d_k=[128], dtype=["bf16"], causal=[True], window=[1024], mode=MODES, device="cuda"),
]

_cpu = [
    *grid(B=[1], S=[128, 256], H=[4], H_kv=["H", 1], d_k=[32], dtype=["bf16"], causal=[True], mode=MODES),
    *grid(B=[2], S=[128], H=[4], H_kv=[2], d_k=[32], dtype=["bf16"], causal=[True], padding=[True], mode=MODES),
    *grid(B=[1], S=[256], H=[4], H_kv=[2], d_k=[32], dtype=["bf16"], causal=[True], window=[64], mode=MODES),
]

SUITE = Suite(
    name="train",
    description="training: fwd, bwd, fwd_bwd, causal, bf16; B 4, S 1Ki–8Ki, MHA/GQA, padding, window; CPU: S 128–256",
    cases=tuple(_cuda),
    cpu_cases=tuple(_cpu),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)