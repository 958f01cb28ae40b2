"""train: forward, backward and forward+backward of causal attention in bf16, as a training step runs it.

CUDA: B = 4, S 1 Ki–8 Ki, H = 16 (MHA and GQA with 4 K/V heads), d_k 64 and 128; a padded batch
and a sliding window (Mistral's pattern) at S = 4 Ki. On a CPU the same modes at S 128 and 256.

Packed documents, as pretraining packs them: documents whose lengths follow a long tail (most short, a few near
the cap), causal within each document, in the packed (varlen) and padded layouts, backward and forward+backward,
at Llama-3 8B's heads (32 query, 8 K/V, d 128; Qwen3-8B's are the same) and Qwen3-30B-A3B's (32 query, 4 K/V).
Each backward of those and of the S = 4 Ki dense batches runs once more deterministic (`-det`): the report's cost of
determinism is the ratio of the two rows.
"""

from harness.suite.batch_axes import ragged_cases
from harness.suite.cases import MODES, grid
from harness.suite.catalog import Suite
from harness.measure.timing import CUDA_BUDGET, QUICK_BUDGET

_cuda = [
    *grid(B=[4], S=[1024, 2048, 4096, 8192], H=[16], H_kv=["H", 4], d_k=[64, 128], dtype=["bf16"], causal=[True], mode=MODES, device="cuda"),
    *grid(B=[4], S=[4096], H=[16], H_kv=[4], d_k=[128], dtype=["bf16"], causal=[True], padding=[True], mode=MODES, device="cuda"),
    *grid(B=[4], S=[4096], H=[16], H_kv=[4], d_k=[128], dtype=["bf16"], causal=[True], window=[1024], mode=MODES, device="cuda"),
]

#: Documents of one packed step: 16 on a heavy tail from 256 to 8 Ki tokens (seed 0: 10,435 tokens, the longest 3,354; the case records them).
DOCUMENTS = "longtail(256,8192,1.1)"
TRAIN_MODES = ("bwd", "fwd_bwd")
for heads in ({"H": 32, "H_kv": 8}, {"H": 32, "H_kv": 4}):
    _cuda += ragged_cases([DOCUMENTS], ("packed", "padded"), B=16, d_k=128, dtype="bf16", causal=True, device="cuda", **heads)
    _cuda += [c.replace(mode=mode) for c in _cuda[-2:] for mode in TRAIN_MODES]

# What a deterministic backward costs (cuDNN publishes it per GPU; FlashAttention has `deterministic=True`): every
# backward of the packed documents and of the S = 4 Ki dense batches once more with the deterministic axis set.
_cuda += [c.replace(deterministic=True) for c in _cuda if c.mode != "fwd" and (c.ragged or c.S_kv == 4096)]

_cpu = [
    *grid(B=[1], S=[128, 256], H=[4], H_kv=["H", 1], d_k=[32], dtype=["bf16"], causal=[True], mode=MODES),
    *grid(B=[2], S=[128], H=[4], H_kv=[2], d_k=[32], dtype=["bf16"], causal=[True], padding=[True], mode=MODES),
    *grid(B=[1], S=[256], H=[4], H_kv=[2], d_k=[32], dtype=["bf16"], causal=[True], window=[64], mode=MODES),
    # Packed and padded documents in fp32 (whose bound resolves a 1 % error) and bf16, MHA and GQA.
    *[c.replace(mode=mode) for dtype in ("fp32", "bf16") for H_kv in (4, 2)
      for c in ragged_cases(["longtail(8,128)"], ("packed", "padded"), B=6, H=4, H_kv=H_kv, d_k=32, dtype=dtype, causal=True)
      for mode in TRAIN_MODES],
]
_cpu += [c.replace(deterministic=True) for c in _cpu if c.ragged and c.dtype == "fp32"]

SUITE = Suite(
    name="train",
    description="training: fwd, bwd, fwd_bwd, causal, bf16; B 4, S 1Ki–8Ki, MHA/GQA, padding, window; packed long-tail documents "
                "at Llama-3 and Qwen3 heads, deterministic twins; CPU: S 128–256",
    cases=tuple(_cuda),
    cpu_cases=tuple(_cpu),
    budget=CUDA_BUDGET,
    cpu_budget=QUICK_BUDGET,
)