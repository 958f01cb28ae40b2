"""`mha-layer`: the whole multi-head self-attention layer, `torch.nn.MultiheadAttention(batch_first=True)`.

Input `[B, S, D]` with D = H·d_k, output `[B, S, D]`: the Q/K/V projections (one packed
in_proj), the core, and the output projection, as ../shared/DESIGN.md's "layer". In eval mode
without grad, PyTorch takes its fused fast path; with grad, the composite one.

Agreement cannot use the core's reference (the output is not the core's), so the layer brings its
own, under the same rule: `ref` is the layer written out by hand (projections, split heads, masked
softmax, merge, output projection) in float64 with the very same weights, `lp` the same hand-written
layer in the case's dtype, and the module agrees when `max|out − ref| ≤ 2·max|lp − ref| + atol`.
Masks: causal (S_q = S_kv, so top-left = bottom-right), sliding window, and a key padding mask
`[B, S]`; the rows of padded queries are garbage by definition in a padded batch and are not compared.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.attention import theory
from harness.backends.base import Backend, Prepared
from harness.backends.registry import register
from harness.suite.cases import Case
from harness.suite.inputs import AttentionInputs, kv_lengths, torch_dtype, visible_mask

#: Largest float64 copy of the four weight matrices the CPU check may make (the check runs beside the layer).
CPU_WEIGHT_LIMIT = 2**30
#: Projection FLOPs per mode: backward computes dX and dW (twice the forward), fwd_bwd both.
PROJECTION_MODE_FACTOR = {"fwd": 1, "bwd": 2, "fwd_bwd": 3}


def layer_masks(case: Case, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """nn.MultiheadAttention's masks for a case: `attn_mask [S, S]` (True = hidden) and `key_padding_mask [B, S]` (True = padding)."""
    attn_mask = None
    if case.causal or case.window is not None:
        i = torch.arange(case.S_q, device=device)[:, None]
        j = torch.arange(case.S_kv, device=device)[None, :]
        visible = j <= i
        if case.window is not None:
            visible &= j > i - case.window
        attn_mask = ~visible
    key_padding = None
    if case.padding:
        lens = torch.as_tensor(kv_lengths(case), device=device)
        key_padding = torch.arange(case.S_kv, device=device)[None, :] >= lens[:, None]
    return attn_mask, key_padding


def real_query_rows(case: Case, device: torch.device) -> torch.Tensor:
    """Boolean `[B, S]`: the query rows a padded batch keeps (all of them without padding)."""
    lens = torch.as_tensor(kv_lengths(case), device=device)
    return torch.arange(case.S_q, device=device)[None, :] < lens[:, None]


def layer_by_hand(x: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor, case: Case) -> torch.Tensor:
    """The layer written out: `[B, S, D]` → projections → per-head masked softmax attention → output projection."""
    B, S, D = x.shape
    qkv = x @ w_in.T + b_in
    q, k, v = (t.view(B, S, case.H, case.d_k).transpose(1, 2) for t in qkv.split(D, dim=-1))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(case.d_k)
    mask = visible_mask(case.replace(padding=False), device=x.device)  # causal / window part, [1, 1, S, S]
    if case.padding:
        lens = torch.as_tensor(kv_lengths(case), device=x.device)
        keys = torch.arange(S, device=x.device)[None, None, None, :] < lens[:, None, None, None]
        mask = keys if mask is None else mask & keys
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    context = torch.softmax(scores, dim=-1) @ v
    return context.transpose(1, 2).reshape(B, S, D) @ w_out.T + b_out


@register
class MhaLayerBackend(Backend):
    """torch.nn.MultiheadAttention(batch_first=True): projections + core + output projection."""

    name = "mha-layer"
    family = "layer"
    attention_core = False
    description = "the whole layer: nn.MultiheadAttention(batch_first=True), [B,S,D] in and out, projections included"

    def own_refusals(self, case: Case) -> list[str]:
        """Self-attention with H heads of d_k = d_v (nn.MultiheadAttention has no grouped K/V heads), weights a CPU can check."""
        reasons = []
        if case.S_q != case.S_kv:
            reasons.append("mha-layer is self-attention over [B, S, D]: needs S_q = S_kv")
        if case.H_kv != case.H:
            reasons.append("nn.MultiheadAttention has no grouped or shared K/V heads (GQA/MQA)")
        if case.d_v != case.d_k or case.mla:
            reasons.append("nn.MultiheadAttention projects to D = H·d_k for Q, K and V alike (needs d_v = d_k)")
        D = case.H * case.d_k
        if case.device == "cpu" and 4 * D * D * 8 > CPU_WEIGHT_LIMIT:
            reasons.append(f"on a CPU the layer's float64 reference needs {4 * D * D * 8 / 2**30:.1f} GiB of weights at D={D} "
                           f"(limit {CPU_WEIGHT_LIMIT / 2**30:.0f} GiB)")
        return reasons

    def costs(self, case: Case) -> tuple[int, int]:
        """The layer's FLOPs and bytes: the four projections (8·B·S·D² forward) plus the core's."""
        from harness.backends.pytorch.projections import projection_bytes, projection_flops

        flops = projection_flops(case) * PROJECTION_MODE_FACTOR[case.mode] + theory.flops(case)
        return flops, projection_bytes(case) + theory.min_bytes(case)

    def prepare(self, case: Case, inputs: AttentionInputs) -> Prepared:
        """Build the module with seeded weights and seeded `[B, S, D]` input (untimed); time module(x, x, x)."""
        device, dtype = inputs.q.device, torch_dtype(case)
        D = case.H * case.d_k
        generator = torch.Generator(device=device).manual_seed(case.seed + 7)

        def draw(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=generator, device=device) * scale

        module = torch.nn.MultiheadAttention(D, case.H, dropout=0.0, bias=True, batch_first=True, device=device, dtype=dtype)
        with torch.no_grad():
            module.in_proj_weight.copy_(draw(3 * D, D, scale=D**-0.5))
            module.in_proj_bias.copy_(draw(3 * D, scale=0.02))
            module.out_proj.weight.copy_(draw(D, D, scale=D**-0.5))
            module.out_proj.bias.copy_(draw(D, scale=0.02))
        module.eval()
        backward = case.mode != "fwd"
        module.requires_grad_(backward)
        x = draw(case.B, case.S_q, D, scale=1.0).to(dtype).requires_grad_(backward)
        attn_mask, key_padding = layer_masks(case, device)
        params = (module.in_proj_weight, module.in_proj_bias, module.out_proj.weight, module.out_proj.bias)
        leaves = (x, *params) if backward else ()

        def fn() -> torch.Tensor:
            return module(x, x, x, key_padding_mask=key_padding, attn_mask=attn_mask, need_weights=False)[0]

        def from_bhsd(g: torch.Tensor) -> torch.Tensor:
            return g.transpose(1, 2).reshape(case.B, case.S_q, D)

        keep = real_query_rows(case, device)

        def check(result: Any) -> Any:
            return check_layer(case, (x, *params), result, from_bhsd(inputs.grad_out) if backward else None, keep)

        notes = {"D": D, "fast_path_possible": not backward}
        return Prepared(fn=fn, leaves=leaves, from_bhsd=from_bhsd, notes=notes, check=check)


def check_layer(case: Case, tensors: tuple[torch.Tensor, ...], result: Any, grad_out: torch.Tensor | None, keep: torch.Tensor) -> Any:
    """The agreement rule for the layer: against the hand-written layer in float64 (ref) and in the case's dtype (lp).

    Forward compares the output's real query rows; backward compares the gradients of x (real rows)
    and of the four parameters, and reports the worst.
    """
    from harness.attention.numerics import Agreement, error_against

    def run(dtype: torch.dtype) -> Any:
        leaves = [t.detach().to(dtype).requires_grad_(grad_out is not None) for t in tensors]
        with torch.set_grad_enabled(grad_out is not None):
            out = layer_by_hand(*leaves, case)
            if grad_out is None:
                return [out]
            return list(torch.autograd.grad(out, leaves, grad_out.to(dtype)))

    ref, lp = run(torch.float64), run(tensors[0].dtype)
    outs = [result] if grad_out is None else list(result)
    names = ["out"] if grad_out is None else ["dx", "d_in_proj_weight", "d_in_proj_bias", "d_out_proj_weight", "d_out_proj_bias"]
    results = []
    for name, o, r, low in zip(names, outs, ref, lp):
        if name in ("out", "dx"):
            o, r, low = (t[keep] for t in (o, r, low))
        results.append((name, error_against(o, r, low, case.dtype)))
    failing = [n for n, a in results if not a.agree]
    worst = max((a for _, a in results), key=lambda a: (not a.agree, (a.max_abs_err or 0) / (a.err_bound or 1)))
    note = f"layer reference; disagreeing: {', '.join(failing)}" if failing else "checked against the hand-written layer in float64"
    rels = [a.rel_err for _, a in results if a.rel_err is not None]
    return Agreement(worst.max_abs_err, worst.err_bound, max(rels) if rels else None, not failing, note)
