"""models-2026: the attention of current models (gpt-oss, Gemma 2 and 3, Qwen3, Llama 4, Kimi-K2, Mistral Nemo) per GPU.

CUDA: each of presets.MODELS_2026 at S 1 Ki, 4 Ki and 16 Ki (capped at its context), bf16, causal prefill in
fwd plus one-token decode against a cache of S, one set per layer kind (sliding-window and global layers,
softcap, sinks, scale: harness/suite/presets.py), at tensor parallel 1 and 8: at TP 8 each case is one GPU's
share, H/8 query heads and H_kv/8 KV heads, or one replicated KV head where H_kv < 8 (Qwen3-30B-A3B), and
MLA's latent cache replicated (Kimi-K2). Kimi-K2's decode also runs as ragged requests over a paged latent cache
(suites.decode.paged_mla_decodes: 64-token pages), what FlashMLA and FlashInfer's MLA wrapper read. A TP-8 case carries
no TP field: its heads are the share, and the description says which model each came from. On a CPU: three presets
at S = 160 in fp32, TP 1 and 8, and Kimi-K2's TP-8 paged decode over three short requests, small enough for
`make test`; run them with `--backends naive,sdpa,mla`.
Every case with a softcap or sinks comes with its twin without them, so that the report shows what each costs.
One model alone: `attnbench run --model gpt-oss-120b --tp 1,2,4,8`.
"""

from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET
from harness.suite.catalog import Suite
from harness.suite.presets import DEFAULT_SEQ, MODELS_2026, get_preset, model_cases, tp_note
from suites.decode import MLA_DECODES_CPU, MLA_DECODES_CUDA, paged_mla_decodes

TP = (1, 8)
#: The CPU variant: a sliding-window-with-sinks model, a softcapped one, and one whose KV heads are replicated at TP 8.
CPU_MODELS = ("gpt-oss-20b", "gemma2-9b", "qwen3-30b-a3b")
#: 160 tokens: past gpt-oss's 128-token window, so its sliding layers hide keys here too.
CPU_SEQ = (160,)


def _with_plain_twins(cases):
    """Each case, then the same case without its softcap, and without its sinks: what the report's Score variants section compares."""
    for case in cases:
        yield case
        if getattr(case, "softcap", None) is not None:
            yield case.replace(softcap=None)
        if getattr(case, "sinks", False):
            yield case.replace(sinks=False)


def _cases(names, seq, mla_batches, mla_tps=TP, **kwargs) -> tuple:
    cases = [c for name in names for tp in TP for c in model_cases(get_preset(name), seq, tp=tp, **kwargs)]
    # An MLA model's decode also as a server holds it: ragged requests over the paged latent cache, beside the dense absorbed form.
    mla = [name for name in MODELS_2026 if get_preset(name).mla]
    cases += paged_mla_decodes(mla, mla_batches, mla_tps, dtype=kwargs.get("dtype", "bf16"), device=kwargs["device"])
    return tuple(dict.fromkeys(_with_plain_twins(cases)))


SUITE = Suite(
    name="models-2026",
    description=("current models' attention per GPU at TP 1 and 8 (prefill and decode, each layer kind): "
                 + "; ".join(f"{name} {tp_note(get_preset(name), 8)}" for name in MODELS_2026)),
    cases=_cases(MODELS_2026, DEFAULT_SEQ, MLA_DECODES_CUDA, device="cuda"),
    # The CPU variant's one paged MLA decode: Kimi-K2's TP-8 share (8 heads) over a few short requests.
    cpu_cases=_cases(CPU_MODELS, CPU_SEQ, MLA_DECODES_CPU, (8,), dtype="fp32", device="cpu"),
    # The kernels that serve the variants (windows, softcap, sinks) or answer unsupported with the reason; mla, flashmla and
    # flashinfer-mla for Kimi-K2's decode (dense absorbed; paged latent).
    backends=("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn2", "flash-attn3", "flash-attn4",
              "flex", "flashinfer", "mla", "flashmla", "flashinfer-mla"),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)
