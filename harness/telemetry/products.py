"""The CPU's compute ceiling as the best of a sweep of matrix products: the shapes the suite's own cases multiply.

One n = 2048 product is not what a CPU can do: a product that fits its caches runs faster per FLOP, and the
layer's projections ran at 0.188-0.199 TFLOP/s against a one-size "peak" of 0.187 (so every healthy row of
them read as impossible). The ceiling is therefore the fastest of:

- square products A·B and A·Bᵀ at a few sizes (the operand layout changes which kernel the BLAS takes), and
- the products the suite's cases perform: each projection ([B·S, D]·Wᵀ, W of [D_out, D]), the scores
  (B·H batched [S_q, d_k]·Kᵀ) and the weighted sum (B·H batched [S_q, S_kv]·[S_kv, d_v]),

within a time bound per dtype (`DTYPE_BOUND_S`): the cases' products first, then the squares; a product whose one
call would cost more than `MAX_CALL_S` is skipped (emulated bf16 runs 8-60× below fp32), and the sweep stops at the bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from harness.measure.timing import Budget, Clock, measure

#: Seconds a dtype's sweep may take, about (README: "about 2 s per dtype").
DTYPE_BOUND_S = 2.0
#: A product whose first call lasts longer than this is not timed: it would use up the bound for one sample.
MAX_CALL_S = 0.25
#: Square sizes always tried, both layouts.
SQUARE_SIZES = (256, 512, 1024, 2048)
#: At most this many of the suite's own products (spread over their sizes), beside the squares.
MAX_SUITE_PRODUCTS = 32
#: Each product's samples: the best of them is its figure, so the budget does not stop early.
PRODUCT_BUDGET = Budget(warmup_s=0.005, measure_s=0.05, min_sample_s=0.0, min_rounds=3, max_rounds=60, precision=0.0)


@dataclass(frozen=True)
class Product:
    """`batch` products of [m, k] by [k, n]; `transposed`: the right operand is stored [n, k] and read transposed (x·Wᵀ, q·kᵀ)."""

    m: int
    k: int
    n: int
    batch: int = 1
    transposed: bool = False
    #: Where the shape comes from: "square", or the case product it is ("projection", "scores", "weighted sum").
    source: str = "square"

    @property
    def flops(self) -> int:
        """2·batch·m·k·n: one multiply and one add per term."""
        return 2 * self.batch * self.m * self.k * self.n

    @property
    def label(self) -> str:
        """How the peaks table names it: '(256) 128×64·64×128ᵀ'."""
        right = f"{self.k}×{self.n}" + ("ᵀ" if self.transposed else "")
        return (f"({self.batch}) " if self.batch > 1 else "") + f"{self.m}×{self.k}·{right}"


def square_products() -> list[Product]:
    """The square sizes in both layouts."""
    return [Product(n, n, n, transposed=t) for n in SQUARE_SIZES for t in (False, True)]


def case_products(cases: Iterable[Any]) -> list[Product]:
    """The distinct products the cases' projections and attention perform (dense cases; a batch's requests are not one product)."""
    found: dict[tuple, Product] = {}
    for case in cases:
        if getattr(case, "layout", "dense") not in (None, "dense"):
            continue
        B, H, H_kv, d_k, d_v, S_q, S_kv = (int(getattr(case, f)) for f in ("B", "H", "H_kv", "d_k", "d_v", "S_q", "S_kv"))
        D = H * d_k
        for product in (Product(B * S_q, D, D, transposed=True, source="projection"),
                        Product(B * S_kv, D, H_kv * d_k, transposed=True, source="projection"),
                        Product(S_q, d_k, S_kv, batch=B * H, transposed=True, source="scores"),
                        Product(S_q, S_kv, d_v, batch=B * H, source="weighted sum")):
            found.setdefault((product.m, product.k, product.n, product.batch, product.transposed), product)
    return spread(sorted(found.values(), key=lambda p: p.flops), MAX_SUITE_PRODUCTS)


def spread(items: Sequence[Product], most: int) -> list[Product]:
    """At most `most` of `items` (sorted by size), evenly spaced, the smallest and the largest kept."""
    if len(items) <= most:
        return list(items)
    step = (len(items) - 1) / (most - 1)
    return [items[round(i * step)] for i in range(most)]


def _call(torch: Any, product: Product, tdtype: Any, device: str, generator: Any) -> Callable[[], object]:
    """The product as the cases call it, on seeded operands in `tdtype` (drawn in float32, as the case inputs are).

    An unbatched x·Wᵀ goes through `torch.nn.functional.linear`, as the projections do: on a CPU it takes oneDNN's
    path, which runs low precision faster than `matmul` of a transposed view; the rest through `torch.matmul`.
    """
    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(tdtype)

    if tdtype.is_floating_point and tdtype.itemsize == 1:  # FP8: no matmul kernel; the 2-D `_scaled_mm` the FP8 kernels run (sweep skips batched)
        from harness.attention.fp8 import scaled_mm_product
        from harness.suite.inputs import FP8_FORMATS

        fmt = next(name for name, dt in FP8_FORMATS.items() if dt == tdtype)
        return scaled_mm_product(product.m, product.k, product.n, fmt, device, generator)
    lead = (product.batch,) if product.batch > 1 else ()
    a = draw(*lead, product.m, product.k)
    if product.transposed and not lead:
        w = draw(product.n, product.k)
        return lambda: torch.nn.functional.linear(a, w)
    b = draw(*lead, product.n, product.k).transpose(-1, -2) if product.transposed else draw(*lead, product.k, product.n)
    return lambda: torch.matmul(a, b)


def sweep(torch: Any, dtype: str, products: Sequence[Product], clock: Clock = time.perf_counter, device: str = "cpu",
          bound_s: float = DTYPE_BOUND_S, budget: Budget = PRODUCT_BUDGET) -> list[dict[str, Any]]:
    """Time each product in `dtype` within `bound_s`: one row per product (TFLOP/s of its best and median sample, or why it was skipped)."""
    from harness.suite.inputs import torch_dtype

    tdtype = torch_dtype(dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    started = time.perf_counter()
    rows = []
    # The cases' own products first, smallest first, then the squares: where the bound cuts, it cuts what the suite never runs.
    for product in sorted(products, key=lambda p: (p.source == "square", p.flops)):
        fp8 = tdtype.is_floating_point and tdtype.itemsize == 1
        op = "_scaled_mm" if fp8 else "linear" if product.transposed and product.batch == 1 else "matmul"
        row: dict[str, Any] = {"product": product.label, "source": product.source, "op": op, "flops": product.flops}
        left = bound_s - (time.perf_counter() - started)
        if left <= 0:
            rows.append({**row, "skipped": f"the sweep's {bound_s:g} s bound was spent"})
            continue
        if fp8 and product.batch > 1:
            rows.append({**row, "skipped": "an FP8 product runs as torch._scaled_mm, which takes 2-D operands only"})
            continue
        call = _call(torch, product, tdtype, device, generator)
        first = time.perf_counter()
        call()  # thread-pool start-up, page faults: never a sample
        once = time.perf_counter() - first
        if once > min(MAX_CALL_S, left):
            rows.append({**row, "skipped": f"one call takes {once:.3g} s, more than {min(MAX_CALL_S, left):.3g} s"})
            continue
        timed = measure(call, clock, replace(budget, measure_s=min(budget.measure_s, left)))
        stats = timed.stats
        rows.append({**row, "best_s": stats.min, "median_s": stats.median, "samples": stats.n,
                     "tflops": product.flops / stats.min / 1e12, "tflops_median": product.flops / stats.median / 1e12,
                     "contended": timed.contended})
    return rows


def best_of(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest timed row of a sweep (None when none was timed)."""
    timed = [r for r in rows if r.get("tflops")]
    return max(timed, key=lambda r: r["tflops"]) if timed else None
