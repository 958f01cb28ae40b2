"""models: the attention of published models (harness/suite/presets.py), prefill and decode.

CUDA: every preset at S 1 Ki, 4 Ki and 16 Ki (capped at its context), bf16, causal prefill in fwd plus
one-token decode against a cache of S (DeepSeek-V3 in MLA's absorbed form). On a CPU: the same heads
at S = 128 in fp32. The models of 2026 are the `models-2026` suite. One model alone: `attnbench run --model llama3-405b [--seq 1024,8192]`.
"""

from harness.suite.presets import CPU_SEQ, DEFAULT_SEQ, MODELS_2026, PRESETS, model_cases
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

#: The presets up to 2024; the models of 2026 (their sinks, softcaps and interleaved windows) are the models-2026 suite.
_PRESETS = [p for name, p in PRESETS.items() if name not in MODELS_2026]

SUITE = Suite(
    name="models",
    description="published models' attention (Transformer base … Llama 3.1 405B, Mistral 7B, DeepSeek-V3 MLA): prefill and decode",
    cases=tuple(dict.fromkeys(c for p in _PRESETS for c in model_cases(p, DEFAULT_SEQ, device="cuda"))),
    cpu_cases=tuple(dict.fromkeys(c for p in _PRESETS for c in model_cases(p, CPU_SEQ, dtype="fp32", device="cpu"))),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
