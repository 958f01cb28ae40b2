"""serving-quick: small batches of requests in every layout on the CPU (about a minute on 2 cores); what the tests and issue 21's check run.

Each batch runs padded (to its longest request, masked), packed (tokens concatenated) and paged (the KV
cache in scattered pages), so one batch's rows compare the layouts on the very same tokens and FLOPs.
The batches: ragged prefills (uniform, and long-tailed with causal), a mixed batch of prefills and
decodes, chunked prefill, speculative decoding, and a decode step over ragged caches at page sizes
1, 16 and 64 (the mixed batch's decodes run at 1 and 16).
"""

from harness.measure.timing import QUICK_BUDGET
from harness.suite.batch_axes import ragged_cases
from harness.suite.catalog import Suite

HEADS = dict(H=8, H_kv=2, d_k=64, dtype="fp32")
LAYOUTS = ("padded", "packed", "paged")

CASES = (
    *ragged_cases(["uniform(16,128)"], LAYOUTS, B=6, causal=False, **HEADS),
    *ragged_cases(["longtail(8,256)"], LAYOUTS, B=8, causal=True, **HEADS),
    *ragged_cases(["2x128 + 8x1@256"], LAYOUTS, page_sizes=(1, 16), causal=True, **HEADS),
    *ragged_cases(["4x32@256", "4x4@128"], LAYOUTS, causal=True, **HEADS),
    # A decode step (one query token per request) over ragged caches: the paged KV bandwidth view, per page size.
    *ragged_cases(["8x1@uniform(64,512)"], LAYOUTS, page_sizes=(1, 16, 64), causal=True, **HEADS),
)

SUITE = Suite(
    name="serving-quick",
    description="CPU: ragged, mixed prefill/decode, chunked-prefill and speculative batches, each padded, packed and paged",
    cases=CASES,
    # The CPU-capable cores, and the GPU-only kernels, which answer `unsupported` with their reason at no cost.
    backends=("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "xformers", "flash-attn2", "flash-attn3",
              "flash-attn4", "flashinfer"),
    budget=QUICK_BUDGET,
)
