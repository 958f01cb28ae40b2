"""published: each published figure's exact configuration (suites/published_figures.toml), to reproduce it and say why not.

FlashAttention-3's paper (H100, fp16, head dim 128, forward and backward), cudnn-frontend's dated H200 CSVs (Llama-3.1
70B's heads: FlashAttention-4 and cuDNN bf16 forward and backward, deterministic too, cuDNN FP8 forward; paged decode
bandwidth). The report's "Published figures" section sets each row beside its figure: % of published, % of the
datasheet and of the measured peak at the row's clock, and the gap split into clock, flags and the rest
(harness.analysis.published). CUDA only: on a CPU every pair is unsupported, with why, and the section says no GPU row exists.
"""

from harness.analysis.published import load_figures
from harness.measure.timing import CUDA_BUDGET
from harness.suite.catalog import Suite

FIGURES = load_figures()

SUITE = Suite(
    name="published",
    description="published figures at their exact configurations (FA3 paper on H100; cudnn-frontend's H200 CSVs: FA4, cuDNN bf16/FP8, "
                "decode); CUDA only",
    cases=tuple(dict.fromkeys(figure.case for figure in FIGURES)),
    backends=tuple(dict.fromkeys(name for figure in FIGURES for name in figure.ours)),
    budget=CUDA_BUDGET,
    cuda_only=True,
)
