"""The layer's projection term alone: Q, K, V and output projections of `[B, S, D]`, D = H·d_k.

Timed beside the attention core on the same cases, it gives the other curve of the S² crossover
(../shared/DESIGN.md): projections cost `8·B·S·D²` FLOPs, the core `4·B·S²·D`, so by FLOPs the
core overtakes at S = 2D; where it overtakes in *time* is measured, per backend.
It computes no attention, so its rows carry no agreement check (`computes_attention = False`).
"""

from __future__ import annotations

import torch

from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, torch_dtype
from harness.attention.theory import element_size


def projection_shapes(case: Case) -> dict[str, tuple[int, int]]:
    """Weight shapes `[in, out]` of W_Q, W_K, W_V and W_O for a case (K and V at H_kv heads)."""
    D = case.H * case.d_k
    return {
        "W_Q": (D, case.H * case.d_k),
        "W_K": (D, case.H_kv * case.d_k),
        "W_V": (D, case.H_kv * case.d_v),
        "W_O": (case.H * case.d_v, D),
    }


def projection_flops(case: Case) -> int:
    """FLOPs of the four projections: 2·rows·in·out each; Q and O over S_q rows, K and V over S_kv (8·B·S·D² for MHA)."""
    w = projection_shapes(case)
    rows_q, rows_kv = case.B * case.S_q, case.B * case.S_kv
    return 2 * (rows_q * w["W_Q"][0] * w["W_Q"][1] + rows_kv * w["W_K"][0] * w["W_K"][1]
                + rows_kv * w["W_V"][0] * w["W_V"][1] + rows_q * w["W_O"][0] * w["W_O"][1])


def projection_bytes(case: Case) -> int:
    """Fewest bytes the projections move: hidden states and context read, weights read, Q/K/V/O written."""
    w = projection_shapes(case)
    D = case.H * case.d_k
    hidden = case.B * case.S_q * D + (0 if case.S_kv == case.S_q else case.B * case.S_kv * D)
    context = case.B * case.S_q * case.H * case.d_v
    weights = sum(i * o for i, o in w.values())
    outputs = case.B * (case.S_q * w["W_Q"][1] + case.S_kv * (w["W_K"][1] + w["W_V"][1]) + case.S_q * D)
    return (hidden + context + weights + outputs) * element_size(case)


@register
class ProjectionsBackend(Backend):
    """The Q, K, V and output projections of the attention layer, without the core (for the crossover)."""

    name = "projections"
    family = "layer"
    description = "the layer's Q/K/V/O projections alone (4 matmuls against [B,S,D]); no attention, not checked"
    supports_backward = False
    computes_attention = False
    attention_core = False

    def own_refusals(self, case: Case) -> list[str]:
        """Not for MLA cases: their d_k is the latent width, and D = H·d_k would be a projection no model has."""
        if not case.mla:
            return []
        return ["an MLA case's d_k is the shared latent (d_c + d_rope), so H·d_k is not the model width; "
                "MLA's down/up projections are a different layer"]

    def costs(self, case: Case) -> tuple[int, int]:
        """The projections' FLOPs and bytes, not the attention core's."""
        return projection_flops(case), projection_bytes(case)

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Draw hidden states, the attention context and the four weights (seeded, untimed); time the four products."""
        device, dtype = inputs.q.device, torch_dtype(case)
        generator = torch.Generator(device=device).manual_seed(case.seed + 1)
        D = case.H * case.d_k

        def draw(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=generator, device=device, dtype=torch.float32) * scale).to(dtype)

        x_q = draw(case.B, case.S_q, D)
        x_kv = x_q if case.S_kv == case.S_q else draw(case.B, case.S_kv, D)
        # The output projection's input is the attention context; the core is not run here, so it is drawn.
        context = draw(case.B, case.S_q, case.H * case.d_v)
        # Held `[out, in]` and applied as x·Wᵀ, as nn.Linear holds and applies its weight: the layout every model's
        # projections run in. (On a CPU without native bf16, x·W with W `[in, out]` takes a bf16 GEMM path 8x slower.)
        w = {name: draw(o, i, scale=i**-0.5) for name, (i, o) in projection_shapes(case).items()}
        linear = torch.nn.functional.linear

        def project() -> torch.Tensor:
            q = linear(x_q, w["W_Q"])
            k = linear(x_kv, w["W_K"])
            v = linear(x_kv, w["W_V"])
            out = linear(context, w["W_O"])
            del q, k, v
            return out

        return Prepared(fn=project, notes={"D": D, "weights": {k: list(v) for k, v in projection_shapes(case).items()}})
