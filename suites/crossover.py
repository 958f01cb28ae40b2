"""crossover: where the attention core's time overtakes the projections', against the model width D = H·d_k.

CPU-sized: D ∈ {256, 512, 1024} (H ∈ {4, 8, 16} at d_k = 64), S from 64 to 2048, so the sweep
reaches 8·D at the smallest width and 2·D (the FLOP model's S*) at the largest. On a GPU, run it
with `--device cuda` (the cases move) or write a wider sweep; the analysis finds S* in any of them.
"""

from harness.suite.cases import grid
from harness.suite.catalog import Suite
from harness.measure.timing import QUICK_BUDGET

#: The projections backend gives one curve, each attention backend the other.
BACKENDS = ("projections", "naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")

SUITE = Suite(
    name="crossover",
    description="projections vs attention core: D = H·64 ∈ {256, 512, 1024}, S 64–2048, B 1, fp32, MHA, not causal",
    cases=tuple(grid(B=[1], S=[64, 128, 256, 512, 1024, 2048], H=[4, 8, 16], d_k=[64], dtype=["fp32"])),
    backends=BACKENDS,
    budget=QUICK_BUDGET,
)
