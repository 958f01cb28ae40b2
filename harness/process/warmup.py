"""One tiny attention forward and backward per worker process, before its first pair is timed.

A process's first backward starts torch's autograd engine and its lazy kernel set-up: measured here, a causal
SDPA backward of 56 tokens cost 434 ms on its first call and 1.6 ms on the second. The first backward pair of a
worker then recorded that start-up as its latency (its first call cost five budgets, so it was the row's one
sample: `first_call`), 250x the same pair in a warm process. The start-up belongs to the process, not to a pair.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_warmed = False


def warm_process() -> None:
    """Run a tiny attention forward and backward once in this process (later calls return at once); never raises."""
    global _warmed
    if _warmed:
        return
    _warmed = True
    try:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(1, 2, 8, 16, dtype=dtype, requires_grad=True) for _ in range(3))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            scores = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
            torch.autograd.grad(scores @ v, (q, k, v), torch.ones_like(out))
    except Exception:  # noqa: BLE001 - a warm-up that fails costs nothing but the warmth: the pairs say what is wrong
        pass
