"""quick: the CPU sweep `make bench` runs without a GPU; under 5 minutes on 2 cores."""

from harness.cases import grid
from harness.suite import Suite
from harness.timing import QUICK_BUDGET

SUITE = Suite(
    name="quick",
    description="CPU: MHA, GQA and MQA at S 128–1024, fp32 and bf16, causal and not",
    cases=tuple(
        grid(B=[1, 4], S=[128, 256, 512, 1024], H=[8], H_kv=["H", 2, 1], d_k=[64], dtype=["fp32", "bf16"], causal=[False, True])
    ),
    budget=QUICK_BUDGET,
)
