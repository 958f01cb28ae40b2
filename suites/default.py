"""default: the CUDA sweep `make bench` runs on a GPU box (the naive backend running out of memory at the top is a result).

Each axis is swept where it answers a question, not crossed with every other one:
- S 512–16384 everywhere (how cost grows with S, where S² overtakes the projections);
- (H, d_k) ∈ {(16, 64), (32, 64), (32, 128)}: the width D = H·d_k at 1024, 2048 and 4096 for the
  crossover S*, the head count at fixed d_k and the head size at fixed H (a fourth pair, 16 × 128,
  would repeat D = 2048);
- H_kv H/8/1 (MHA, GQA, MQA), causal and not, B 1 and 8 (an under-filled GPU and a full one);
- bf16 throughout, fp16 beside it on one slice (B 8, H 32, d_k 128): the kernels are the same
  templates at the same tensor-core rate, so a whole second grid would repeat the first.
252 cases instead of the full product's 576, so that one H200 runs every installed backend on all
of them within minutes.
"""

from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET

SEQ = [512, 1024, 2048, 4096, 8192, 16384]
_COMMON = dict(S=SEQ, H_kv=["H", 8, 1], causal=[False, True], device="cuda")

SUITE = Suite(
    name="default",
    description=("CUDA: S 512–16384, (H, d_k) (16, 64), (32, 64), (32, 128), H_kv H/8/1, causal and not, B 1 and 8, bf16; "
                 "fp16 at B 8, H 32, d_k 128"),
    cases=tuple(dict.fromkeys([
        *grid(B=[1, 8], H=[16, 32], d_k=[64], dtype=["bf16"], **_COMMON),
        *grid(B=[1, 8], H=[32], d_k=[128], dtype=["bf16"], **_COMMON),
        *grid(B=[8], H=[32], d_k=[128], dtype=["fp16"], **_COMMON),
    ])),
    # Every kernel that serves the plain attention core without compiling per shape, plus the
    # projections for S*. flex and naive-compiled compile once per shape (hundreds of shapes here
    # would be hours of compiling): they run in `train` and `models`, or add them with --backends.
    # mha-layer and mla answer other questions (the whole layer; MLA decoding).
    backends=(
        "naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
        "xformers", "flash-attn2", "flash-attn3", "flash-attn4", "projections",
    ),
    budget=CUDA_BUDGET,
)
