"""fp8: FP8 attention, all-FP8 (Q, K, V in e4m3 or e5m2 with per-tensor descales) and an FP8 KV cache beside bf16 queries.

The reference is float64 attention over the dequantized inputs (the quantization error is the input's); the bound is
the FP8 eager model's (P rounded to FP8 before P·V, FlashAttention 3's recipe: harness.attention.fp8). Bytes count one
per FP8 element and two per bf16 output element. Every row beside its bf16 twin, so what FP8 buys is in one run.
CUDA: prefill B 1, S 2-16 Ki, H 32 / H_kv 8, d 128, causal and not; decode B 32 over 4-32 Ki FP8 caches. A CPU: S 64-256.
"""

from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET
from harness.suite.cases import grid
from harness.suite.catalog import Suite


def _cases(prefill: list[int], decode: list[int], B_decode: int, H: int, H_kv: int, d: int, device: str) -> tuple:
    cases = grid(B=[1], S=prefill, H=[H], H_kv=[H_kv], d_k=[d], dtype=["fp8_e4m3", "fp8_e5m2", "bf16"], causal=[False, True],
                 device=device)
    for kv_dtype in (None, "fp8_e4m3", "fp8_e5m2"):
        cases += grid(B=[B_decode], S_q=[1], S_kv=decode, H=[H], H_kv=[H_kv], d_k=[d], dtype=["bf16"], causal=[True],
                      kv_dtype=[kv_dtype], device=device)
    return tuple(dict.fromkeys(cases))


SUITE = Suite(
    name="fp8",
    description="FP8 attention: e4m3/e5m2 Q, K, V with per-tensor descales beside bf16, and FP8 KV-cache decode; CPU: S 64-256",
    cases=_cases([2048, 8192, 16384], [4096, 32768], 32, 32, 8, 128, "cuda"),
    cpu_cases=_cases([64, 256], [256], 4, 4, 2, 32, "cpu"),
    backends=("eager-fp8", "naive", "sdpa", "flash-attn3", "flashinfer", "flex", "sdpa-cudnn"),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
