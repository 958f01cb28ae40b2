"""default: the CUDA sweep `make bench` runs on a GPU box (the naive backend running out of memory at the top is a result)."""

from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET

SUITE = Suite(
    name="default",
    description="CUDA: B 1 and 8, S 512–16384, H 16 and 32, H_kv H/8/1, d_k 64 and 128, bf16 and fp16, causal and not",
    cases=tuple(
        grid(
            B=[1, 8], S=[512, 1024, 2048, 4096, 8192, 16384], H=[16, 32], H_kv=["H", 8, 1], d_k=[64, 128],
            dtype=["bf16", "fp16"], causal=[False, True], device="cuda",
        )
    ),
    # Every kernel that serves the plain attention core without compiling per shape, plus the
    # projections for S*. flex and naive-compiled compile once per shape (576 shapes here would
    # be hours of compiling): they run in `train` and `models`, or add them with --backends.
    # mha-layer and mla answer other questions (the whole layer; MLA decoding).
    backends=(
        "naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
        "xformers", "flash-attn2", "flash-attn3", "flash-attn4", "projections",
    ),
    budget=CUDA_BUDGET,
)
