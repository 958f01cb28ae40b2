"""The score variants and head dims of FlashInfer's planned wrappers, as flashinfer-python 0.7.2.post1 defines them.

- `sm_scale` and `logits_soft_cap` are plan() arguments of all three wrappers (the decode plan takes them through
  **kwargs); include/flashinfer/attention/variants.cuh's DefaultAttention applies the cap as
  cap·tanh(s/cap) on the scaled score s in its logits transform, before the mask: the harness's softcap.
- ALiBi is plan(pos_encoding_mode="ALIBI"), with FlashInfer's own slopes (utils.get_alibi_slopes: Press et al.'s,
  the harness's values): the same transform adds slope_h·(kv_idx − qo_idx) to the scaled score, a bias linear in the
  distance. A row constant cancels in the softmax, so it is the harness's −slope·|pos(i) − j| exactly where every
  visible key lies at or before its query's position (causal or windowed, or one query per sequence), and not otherwise.
- Sinks: run(sinks=) reaches only the trtllm-gen and cuDNN paths; the fa2 paged_run drops it (prefill.py), the
  CUDA-core decode run never passes it (decode.py), and the ragged run has no such argument. Its sink kernels are
  a separate JIT wrapper (BatchAttentionWithAttentionSinkWrapper), not adapted here.
- Head dims: no limit is stated here. The JIT-compiled batch modules take the head dim as a template constant;
  the DISPATCH_HEAD_DIM list of include/flashinfer/utils.cuh (64, 128, 256, 512) is not what they dispatch on,
  so a head dim a kernel lacks is its own error at plan() or run().
"""

from __future__ import annotations

from typing import Any

from harness.suite.cases import Case

SCORE_VARIANTS = frozenset({"softcap", "alibi", "scale"})
VARIANT_REASONS = {
    "sinks": ("the planned wrappers' fa2 kernels drop run(sinks=) (only its trtllm-gen and cuDNN paths take it); its sink "
              "kernels are a separate JIT wrapper, BatchAttentionWithAttentionSinkWrapper, not adapted here"),
}


def variant_refusal(case: Case) -> str | None:
    """Why FlashInfer cannot compute the case's declared variants exactly, or None."""
    if case.alibi and not (case.causal or case.window is not None or case.S_q == 1):
        return ("flashinfer's ALiBi adds slope·(j − i), linear in the distance: the harness's −slope·|pos(i) − j| only where no "
                f"query sees a later key, so a non-causal case with S_q={case.S_q} > 1 is not served")
    return None


def variant_plan_args(case: Case) -> dict[str, Any]:
    """plan()'s keyword arguments for the case's scale and score variants."""
    args: dict[str, Any] = {"sm_scale": case.softmax_scale}
    if case.softcap is not None:
        args["logits_soft_cap"] = float(case.softcap)
    if case.alibi:
        args["pos_encoding_mode"] = "ALIBI"
    return args
