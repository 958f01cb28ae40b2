"""default: the CUDA sweep `make bench` runs on a GPU box (the naive backend running out of memory at the top is a result)."""

from harness.cases import grid
from harness.suite import Suite
from harness.timing import CUDA_BUDGET

SUITE = Suite(
    name="default",
    description="CUDA: B 1 and 8, S 512–16384, H 16 and 32, H_kv H/8/1, d_k 64 and 128, bf16 and fp16, causal and not",
    cases=tuple(
        grid(
            B=[1, 8], S=[512, 1024, 2048, 4096, 8192, 16384], H=[16, 32], H_kv=["H", 8, 1], d_k=[64, 128],
            dtype=["bf16", "fp16"], causal=[False, True], device="cuda",
        )
    ),
    budget=CUDA_BUDGET,
)
