"""gpu-check's grid: the cases every backend's child runs, what each case past the first eight reaches, and what a backend
declares it cannot serve (which the schedule's cost model leaves out). harness/checks/gpu.py runs them.
"""

from __future__ import annotations

from harness.suite.batch_axes import ragged_cases
from harness.suite.cases import Case

#: The train suite's packed documents (suites/train.py DOCUMENTS): 16 on a heavy tail from 256 to 8 Ki tokens.
TRAIN_DOCUMENTS = "longtail(256,8192,1.1)"


def check_cases(device: str) -> list[Case]:
    """The grid: realistic but small on CUDA, tiny on the CPU (--cpu); `PATHS` names the cases past the first eight."""
    if device == "cuda":
        B, S, H, H_kv, d, dtype, L, mla, window = 2, 1024, 16, 4, 128, "bf16", 4096, (128, 576, 512), 128
        mla_paged, documents, train = (16, 576, 512, "2x1@uniform(1024,4096)"), TRAIN_DOCUMENTS, {"B": 16, "H": 32, "H_kv": 8, "d_k": 128}
    else:
        B, S, H, H_kv, d, dtype, L, mla, window = 2, 64, 4, 2, 32, "bf16", 256, (8, 72, 64), 32
        mla_paged, documents, train = (8, 72, 64, "2x1@uniform(32,200)"), "longtail(8,128)", {"B": 6, "H": 4, "H_kv": 2, "d_k": 32}
    cases = [
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, causal=causal, mode=mode)
        for mode in ("fwd", "bwd") for causal in (False, True)
    ]
    cases += [
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H, d_k=d // 2, d_v=d // 2, dtype=dtype, device=device, causal=True),
        Case(B=B, S_q=S, S_kv=S, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, causal=True, padding=True),
        Case(B=B, S_q=1, S_kv=L, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, padding=True),
        Case(B=B, S_q=1, S_kv=L, H=mla[0], H_kv=1, d_k=mla[1], d_v=mla[2], dtype=dtype, device=device, mla=True),
    ]
    gqa = {"B": B, "S_q": S, "S_kv": S, "H": H, "H_kv": H_kv, "d_k": d, "d_v": d, "device": device}
    cases += [
        # FP8: all-FP8 Q, K, V (FA3's FP8 kernel, eager-fp8) and bf16 queries over an FP8 KV cache (FlashInfer's decode).
        Case(**gqa, dtype="fp8_e4m3", causal=True),
        Case(B=B, S_q=1, S_kv=L, H=H, H_kv=H_kv, d_k=d, d_v=d, dtype=dtype, device=device, kv_dtype="fp8_e4m3"),
        # Score variants, gpt-oss's sinks in a sliding window, Gemma's softcap, ALiBi.
        Case(**gqa, dtype=dtype, causal=True, sinks=True, window=window),
        Case(**gqa, dtype=dtype, causal=True, softcap=50.0),
        Case(**gqa, dtype=dtype, causal=True, alibi=True),
    ]
    # MLA decode over a paged latent cache (FlashMLA's 64-token pages; DeepSeek-V3's heads at TP 8): flashmla, flashinfer-mla, mla.
    cases += ragged_cases([mla_paged[3]], ("paged",), page_sizes=(64,), H=mla_paged[0], H_kv=1, d_k=mla_paged[1], d_v=mla_paged[2],
                          mla=True, causal=True, dtype=dtype, device=device)
    # The train suite's packed-documents backward, and its deterministic twin.
    (packed,) = ragged_cases([documents], ("packed",), dtype=dtype, causal=True, device=device, **train)
    cases += [packed.replace(mode="bwd"), packed.replace(mode="bwd", deterministic=True)]
    return cases


#: What each case past the first eight reaches: its index in check_cases and the backends whose path it is (a test holds each
#: of those exists and serves the case, by its own `supports`, on the CUDA grid).
PATHS = {
    "fp8 q/k/v": (8, ("flash-attn3", "eager-fp8")),
    "fp8 kv cache decode": (9, ("flashinfer", "naive")),
    "sinks + window": (10, ("flash-attn4", "naive")),
    "softcap": (11, ("flash-attn2", "flash-attn3", "flash-attn4", "flashinfer", "naive")),
    "alibi": (12, ("sdpa", "flash-attn2", "flashinfer", "naive")),
    "paged mla decode": (13, ("flashmla", "flashinfer-mla", "mla")),
    "packed backward": (14, ("flash-attn2", "flash-attn3", "flash-attn4", "sdpa")),
    "deterministic packed backward": (15, ("flash-attn2", "flash-attn3", "flash-attn4")),
}


def declared_refusal(backend, case: Case) -> str | None:
    """Why `backend` declares it cannot serve `case` (every feature of harness.backends.features it lacks: no import), or None.

    Such a pair is answered unsupported in well under a second, so gpu-check's cost model counts only the others.
    """
    from harness.backends.features import feature_refusals, joined

    return joined(feature_refusals(backend, case))
