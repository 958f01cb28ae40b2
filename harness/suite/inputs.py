"""Seeded inputs for a Case, and the one definition of which (query, key) pairs a mask leaves visible."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.suite.case_values import DTYPES
from harness.suite.cases import Case

#: The FP8 formats, by the short names cases use, and their torch dtypes (OCP FP8: e4m3 has no infinities, e5m2 does).
FP8_FORMATS = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in the FP8 format `fmt` with one per-tensor float32 descale (`x ≈ q · descale`); the largest |x| maps to the format's max."""
    dtype = FP8_FORMATS[fmt]
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    descale = torch.tensor(amax / torch.finfo(dtype).max if amax > 0 else 1.0, dtype=torch.float32, device=x.device)
    return (x.detach().float() / descale).to(dtype), descale


def torch_dtype(case_or_name: Case | str) -> torch.dtype:
    """The torch dtype of a case (or of a short dtype name)."""
    name = case_or_name.dtype if isinstance(case_or_name, Case) else case_or_name
    return getattr(torch, DTYPES[name])


def output_dtype(case: Case) -> torch.dtype:
    """The dtype a case's output (and its gradients) must come back in: an FP8 attention writes bf16, every other case its dtype."""
    dtype = torch_dtype(case)
    return torch.bfloat16 if dtype.itemsize == 1 else dtype


@dataclass
class AttentionInputs:
    """Tensors for one case, all `[B, H, S, d]`; K and V at H_kv heads.

    `kv_lens[b]` is the number of real keys of sequence b (the rest is padding), or None
    when the case has no padding. `grad_out` is the upstream gradient for backward modes.
    `sinks`: the case's learned sink logits, float32 `[H]` (None unless `case.sinks`; harness.suite.inputs.draw_sinks).
    `descales`: for FP8 tensors, each one's float32 descale by name ("q", "k", "v"; harness.attention.fp8): the tensor holds
    x / descale in its FP8 format. None when no tensor is FP8.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_lens: torch.Tensor | None = None
    grad_out: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    descales: dict[str, torch.Tensor] | None = None


def input_leaves(inputs: Any) -> list[tuple[str, Any]]:
    """Every field of an inputs dataclass (AttentionInputs, RaggedInputs) down to its leaves, by path: a dict's entries
    ("descales.k") and a list's or tuple's items of tensors ("x[1]") each on their own, every other value as it is.

    What the input guard and the cached reference compare: a leaf held inside a container (an FP8 descale in the
    `descales` dict) is compared by value, never through the container's identity, which an in-place write keeps."""
    leaves: list[tuple[str, Any]] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(f"{path}.{key}", value[key])
        elif isinstance(value, (list, tuple)) and any(isinstance(item, (torch.Tensor, dict, list, tuple)) for item in value):
            for i, item in enumerate(value):
                walk(f"{path}[{i}]", item)
        else:
            leaves.append((path, value))

    names = [f.name for f in dataclasses.fields(inputs)] if dataclasses.is_dataclass(inputs) else list(vars(inputs))
    for name in names:
        walk(name, getattr(inputs, name))
    return leaves


def draw_sinks(case: Case, device: str | torch.device) -> torch.Tensor | None:
    """The sink logits of a case, float32 `[H]`, standard normal (gpt-oss's learned sinks are O(1)), or None without sinks.

    Drawn from a stream of their own (the seed and a tag), so that q, k and v stay what every case without sinks draws.
    """
    if not case.sinks:
        return None
    values = np.random.default_rng([case.seed, 0x5172]).standard_normal(case.H).astype(np.float32)
    return torch.as_tensor(values).to(device)


def query_positions(case: Case) -> np.ndarray:
    """Each query row's own key position `[B, S_q]`: `i + kv_len[b] − q_len[b]` (bottom-right, per sequence, as the mask aligns it).

    Without padding that is `i + S_kv − S_q`: what ALiBi measures a key's distance from.
    """
    i = np.arange(case.S_q, dtype=np.int64)[None, :]
    return i + (kv_lengths(case) - q_lengths(case))[:, None]


def kv_lengths(case: Case) -> np.ndarray:
    """Per-sequence key lengths: S_kv without padding, else drawn uniformly from [S_kv/2, S_kv] by the case's seed."""
    if not case.padding:
        return np.full(case.B, case.S_kv, dtype=np.int64)
    rng = np.random.default_rng([case.seed, 0x9AD])
    low = max(1, (case.S_kv + 1) // 2)
    lengths = rng.integers(low, case.S_kv + 1, size=case.B)
    lengths[0] = case.S_kv  # one full sequence, as in a real padded batch
    return lengths.astype(np.int64)


def q_lengths(case: Case) -> np.ndarray:
    """Per-sequence real query rows.

    With padding and S_q = S_kv the case is self-attention over a right-padded batch: queries are
    padded like keys (q_len[b] = kv_len[b]) and the padded query rows see nothing (zero output).
    Otherwise every query row is real (S_q of them): the newest S_q tokens against a KV cache.
    """
    if case.padding and case.S_q == case.S_kv:
        return kv_lengths(case)
    return np.full(case.B, case.S_q, dtype=np.int64)


def _visible_bounds(case: Case, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each (b, query i): the half-open key range [lo, hi) it may see. Shapes [B, S_q].

    Query i of sequence b sits at position `i + kv_len[b] − q_len[b]` (bottom-right alignment,
    per sequence, as FlashAttention's varlen kernels and a KV cache do); without padding that is
    `i + S_kv − S_q`. Causal: keys up to that position; window w: the w keys ending there.
    """
    q_lens = q_lengths(case)
    i = np.arange(case.S_q, dtype=np.int64)[None, :]
    hi = np.broadcast_to(lengths[:, None], (case.B, case.S_q)).copy()
    lo = np.zeros_like(hi)
    if case.causal or case.window is not None:
        q_pos = i + (lengths - q_lens)[:, None]
        hi = np.minimum(hi, q_pos + 1)
        if case.window is not None:
            lo = np.maximum(lo, q_pos - case.window + 1)
    hi = np.where(i < q_lens[:, None], hi, 0)  # padded query rows see nothing
    return lo, np.maximum(hi, lo)


def visible_pairs(case: Case) -> int:
    """The number of (query, key) pairs, summed over the batch, that the case's mask leaves visible (per head)."""
    lo, hi = _visible_bounds(case, kv_lengths(case))
    return int((hi - lo).sum())


def visible_key_rows(case: Case) -> int:
    """Key rows, summed over the batch, that at least one query sees: what a kernel must read of K and V."""
    lo, hi = _visible_bounds(case, kv_lengths(case))
    total = 0
    for b in range(case.B):
        seen = np.zeros(case.S_kv + 1, dtype=np.int64)
        rows = hi[b] > lo[b]
        # Each query's range is an interval: mark it with +1/−1 and count covered keys.
        np.add.at(seen, lo[b][rows], 1)
        np.add.at(seen, hi[b][rows], -1)
        total += int((np.cumsum(seen[:-1]) > 0).sum())
    return total


def empty_query_rows(case: Case) -> torch.Tensor | None:
    """Boolean `[B, S_q]`, True for query rows that see no key (padded rows, or rows a window leaves empty); None when unmasked."""
    if not case.masked:
        return None
    lo, hi = _visible_bounds(case, kv_lengths(case))
    return torch.as_tensor(hi <= lo)


def visible_mask(case: Case, device: str | torch.device = "cpu") -> torch.Tensor | None:
    """Boolean `[B, 1, S_q, S_kv]` mask, True where a key is visible, or None when nothing is masked."""
    if not case.masked:
        return None
    lo, hi = _visible_bounds(case, kv_lengths(case))
    j = torch.arange(case.S_kv, device=device)
    lo_t = torch.as_tensor(lo, device=device)[:, None, :, None]
    hi_t = torch.as_tensor(hi, device=device)[:, None, :, None]
    return (j >= lo_t) & (j < hi_t)


def make_inputs(case: Case, *, seed: int | None = None, device: str | torch.device | None = None) -> AttentionInputs:
    """Draw standard-normal inputs for a case from a seeded generator on its device (never zeros or constants)."""
    device = torch.device(device or case.device)
    generator = torch.Generator(device=device)
    generator.manual_seed(case.seed if seed is None else seed)
    dtype = torch_dtype(case)
    fp8 = dtype.itemsize == 1  # FP8 tensors are quantized from the float32 draw, never cast (that would saturate and lose the scale)

    def draw(*shape: int) -> torch.Tensor:
        drawn = torch.randn(*shape, generator=generator, device=device, dtype=torch.float32)
        return drawn if fp8 else drawn.to(dtype)

    q = draw(case.B, case.H, case.S_q, case.d_k)
    k = draw(case.B, case.H_kv, case.S_kv, case.d_k)
    # MLA: the values are the first d_c columns of the one latent cache; a contiguous copy, so that
    # backends that do not share the cache still get an ordinary V of the same values.
    v = k[..., : case.d_v].clone() if case.mla else draw(case.B, case.H_kv, case.S_kv, case.d_v)
    grad_out = draw(case.B, case.H, case.S_q, case.d_v) if case.mode != "fwd" else None
    kv_lens = torch.as_tensor(kv_lengths(case), device=device, dtype=torch.int32) if case.padding else None
    inputs = AttentionInputs(q=q, k=k, v=v, kv_lens=kv_lens, grad_out=grad_out, sinks=draw_sinks(case, device))
    fp8_names = ("q", "k", "v") if fp8 else ("k", "v") if case.kv_dtype else ()
    if fp8_names:

        inputs.descales = {}
        for name in fp8_names:
            tensor, inputs.descales[name] = quantize(getattr(inputs, name).float(), case.kv_dtype if name != "q" and case.kv_dtype else case.dtype)
            setattr(inputs, name, tensor)
    return inputs

