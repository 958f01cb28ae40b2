"""serving: batches of requests as a server sees them, on a GPU; on a CPU it runs serving-quick's batches.

For three model presets (Llama-2-7B MHA, Llama-3-8B and Llama-3-70B GQA), in bf16, causal, forward:
- ragged prefills from seeded length distributions (uniform, long-tailed, bimodal), padded, packed and paged;
- decodes over caches of ragged length, packed and paged at page sizes 1, 16, 64, 128 and 256
  (the paged decode bandwidth against page size), and padded (what padding wastes);
- mixed batches: prefills beside decodes, chunked prefill, speculative decoding, padded, packed and paged.
"""

from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET
from harness.suite.batch_axes import ragged_cases
from harness.suite.catalog import Suite
from harness.suite.presets import get_preset
from suites.serving_quick import SUITE as QUICK

PRESETS = ("llama2-7b", "llama3-8b", "llama3-70b")
LAYOUTS = ("padded", "packed", "paged")
PAGE_SIZES = (1, 16, 64, 128, 256)
#: (batch description, B for a bare distribution).
PREFILLS = (("uniform(128,4096)", 16), ("longtail(32,8192)", 32), ("bimodal(256,4096,0.2)", 16))
DECODES = ("64x1@uniform(1024,16384)", "128x1@longtail(256,32768)")
MIXED = ("2x2048 + 32x1@1024", "1x4096 + 64x1@uniform(512,8192)", "4x512@4096", "16x4@2048")


def _cases() -> list:
    cases = []
    for name in PRESETS:
        preset = get_preset(name)
        heads = dict(H=preset.H, H_kv=preset.H_kv, d_k=preset.d_k, d_v=preset.d_v, dtype="bf16", device="cuda", causal=True)
        for batch, B in PREFILLS:
            cases += ragged_cases([batch], LAYOUTS, B=B, **heads)
        cases += ragged_cases(DECODES, LAYOUTS, page_sizes=PAGE_SIZES, **heads)
        cases += ragged_cases(MIXED, LAYOUTS, **heads)
    return list(dict.fromkeys(cases))


SUITE = Suite(
    name="serving",
    description="GPU: model presets' ragged prefills, paged decodes over page sizes 1-256, and mixed prefill/decode batches",
    cases=tuple(_cases()),
    backends=("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "xformers", "flash-attn2", "flash-attn3",
              "flash-attn4", "flex", "flashinfer"),
    budget=CUDA_BUDGET,
    cpu_cases=QUICK.cases,
    cpu_budget=QUICK_BUDGET,
)
