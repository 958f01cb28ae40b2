"""quick: the CPU sweep `make bench` runs without a GPU; about 1.5 minutes on 2 cores.

B 1 and 2 answer how cost grows with the batch; B 4 at S 1024 made a third of the sweep's time
alone (its naive and math pairs run 0.1–0.25 s a call, six samples each) and answered nothing more.
"""

from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.measure.timing import QUICK_BUDGET

SUITE = Suite(
    name="quick",
    description="CPU: MHA, GQA and MQA at S 128–1024, fp32 and bf16, causal and not",
    cases=tuple(
        grid(B=[1, 2], S=[128, 256, 512, 1024], H=[8], H_kv=["H", 2, 1], d_k=[64], dtype=["fp32", "bf16"], causal=[False, True])
    ),
    # Every CPU-capable core backend, the projections (for the S* crossover) and the GPU-only
    # kernels, which answer `unsupported` with their reason at no cost. The compiled backends
    # (flex, naive-compiled) compile once per shape and the layer/MLA backends answer other
    # questions: they have their own suites (train, decode, models).
    backends=(
        "naive", "sdpa", "sdpa-math", "sdpa-flash", "projections",
        "sdpa-efficient", "sdpa-cudnn", "xformers", "flash-attn2", "flash-attn3", "flash-attn4",
    ),
    budget=QUICK_BUDGET,
)
