"""variants: the score variants of current models, each beside the plain case, for `attnbench check` and for their cost.

Logit softcap (Gemma 2's 50, and 30), attention sinks (gpt-oss), sinks beside a 128-token sliding window (gpt-oss's
sliding layers), ALiBi, and a model's own softmax scale, at head dims 64, 128 and 256, fp32 and bf16, causal and not,
with GQA. CUDA: B 1, S 2 Ki; a CPU: S 160 (past the 128-token window), the size `attnbench check --suite variants`
runs in a minute. A backend that cannot compute a variant exactly says why (unsupported), never an approximation.
"""

from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET
from harness.suite.cases import grid
from harness.suite.catalog import Suite

#: Each variant as Case fields; the plain case first, so every variant has its twin.
VARIANTS = ({}, {"softcap": 50.0}, {"softcap": 30.0}, {"sinks": True}, {"sinks": True, "window": 128}, {"alibi": True}, {"scale": 0.0625})


def _cases(S: int, device: str) -> tuple:
    cases = []
    for fields in VARIANTS:
        axes = {"B": [1], "S": [S], "H": [4], "H_kv": [2], "d_k": [64, 128, 256], "dtype": ["fp32", "bf16"], "causal": [False, True],
                "device": device, **{k: [v] for k, v in fields.items()}}
        if fields.get("window"):
            axes["causal"] = [True]  # a sliding window is causal by construction
        cases += grid(**axes)
    return tuple(dict.fromkeys(cases))


SUITE = Suite(
    name="variants",
    description="score variants (softcap 50 and 30, sinks, sinks + window 128, ALiBi, scale) beside the plain case; d_k 64/128/256, fp32/bf16, causal or not",
    cases=_cases(2048, "cuda"),
    cpu_cases=_cases(160, "cpu"),
    backends=("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "flash-attn2", "flash-attn3",
              "flash-attn4", "flashinfer", "xformers"),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
