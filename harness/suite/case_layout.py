"""A Case's batch-of-requests fields (layout, page_size, seq_lens_q/kv, length_dist): their check and their record form.

Kept beside `harness.suite.cases` so the Case stays the one description of a problem while the rules of
ragged batches (harness.suite.batch draws their lengths) live in one place.
"""

from __future__ import annotations

import json
from typing import Any

from harness.errors import UserError
from harness.suite.batch import case_batch, from_id_text
from harness.suite.case_values import MAX_INT, integer

#: How a batch's tensors are laid out (harness.suite.ragged): a rectangle, or a batch of requests with lengths of their own.
LAYOUTS = ("dense", "padded", "packed", "paged")
RAGGED_LAYOUTS = LAYOUTS[1:]
#: The fields a batch's lengths set (B too, unless a bare distribution takes it), those only a ragged case has,
#: and the dense case's own ways of varying lengths, which a ragged case cannot also have. MLA is not among them: a
#: ragged MLA batch is one shared latent cache per request (a paged one its latent pages), as real MLA decode kernels read it.
DRAWN_FIELDS = ("S_q", "S_kv", "seq_lens_q", "seq_lens_kv", "length_dist")
RAGGED_FIELDS = ("page_size", "seq_lens_q", "seq_lens_kv", "length_dist")
DENSE_ONLY = ("padding",)


def check_layout(case) -> None:
    """UserError unless the layout fields are right: none on a dense case; on a ragged one, lengths that match
    B, S_q, S_kv and what the case's batch text draws from its seed."""
    if not isinstance(case.layout, str) or case.layout not in LAYOUTS:
        raise UserError(f"unknown layout {case.layout!r}: expected one of {', '.join(LAYOUTS)}")
    if case.layout == "dense":
        given = [name for name in RAGGED_FIELDS if getattr(case, name) is not None]
        if given:
            raise UserError(f"a dense case has no {given[0]}: give layout padded, packed or paged for a batch of requests")
        return
    dense = next((name for name in DENSE_ONLY if getattr(case, name)), None)
    if dense:
        raise UserError(f"a {case.layout} case cannot also be {dense} (that is a dense case's field)")
    if case.layout == "paged":
        object.__setattr__(case, "page_size", integer("page_size", case.page_size))
    elif case.page_size is not None:
        raise UserError(f"page_size is for paged cases, not {case.layout} ones")
    if not isinstance(case.length_dist, str):
        raise UserError(f"a {case.layout} case needs length_dist, the batch description its lengths were drawn from")
    batch = case_batch(case.length_dist)
    if batch.text != case.length_dist:
        raise UserError(f"length_dist {case.length_dist!r} is not canonical: write {batch.text!r}")
    for name in ("seq_lens_q", "seq_lens_kv"):
        value = getattr(case, name)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not len(value):
            raise UserError(f"{name} must be a non-empty list of lengths, got {value!r}")
        object.__setattr__(case, name, tuple(integer(f"{name}[{i}]", n) for i, n in enumerate(value)))
    q, kv = case.seq_lens_q, case.seq_lens_kv
    if len(q) != len(kv):
        raise UserError(f"seq_lens_q has {len(q)} requests, seq_lens_kv {len(kv)}")
    short = next((i for i in range(len(q)) if kv[i] < q[i]), None)
    if short is not None:
        raise UserError(f"request {short} has {q[short]} queries over {kv[short]} keys: its keys include its queries, so KV >= Q")
    derived = {"B": len(q), "S_q": max(q), "S_kv": max(kv)}
    for name, value in derived.items():
        if getattr(case, name) != value:
            raise UserError(f"{name}={getattr(case, name)} contradicts the lengths, which make {name}={value}")
    if not batch.from_file and batch.draw(case.seed, case.B) != (q, kv):
        raise UserError(f"the lengths are not those {case.length_dist!r} draws from seed {case.seed}")
    if case.layout == "paged":
        _check_pages(case)


#: Page numbers sit in an int32 block table (harness.suite.ragged), and kernels take the page size as a 32-bit integer.
MAX_INT32 = 2**31 - 1


def _check_pages(case) -> None:
    """UserError unless the paged cache can be built: a 32-bit page size and page count, and a cache tensor that can be indexed.

    The case's own size guard counts the packed K/V, not the pages: a page far longer than the requests makes a
    cache of pages x page_size rows, almost all of it padding, that no device holds.
    """
    size = case.page_size
    if size > MAX_INT32:
        raise UserError(f"page_size={size} is beyond a kernel's 32-bit page size (at most {MAX_INT32})")
    pages = sum(-(-n // size) for n in case.seq_lens_kv)
    if pages > MAX_INT32:
        raise UserError(f"page_size={size}: the paged cache would take {pages:,} pages, more than its int32 block table "
                        f"can number (at most {MAX_INT32:,})")
    elements = pages * size * case.H_kv * max(case.d_k, case.d_v)
    if elements > MAX_INT:
        raise UserError(f"page_size={size}: the paged cache ({pages:,} pages of {size} rows, H_kv={case.H_kv}, d={max(case.d_k, case.d_v)}) "
                        f"would hold {elements:.3g} elements, more than a tensor can index (2^63 - 1)")


def draw_id_lengths(case_id: str, fields: dict[str, Any]) -> None:
    """Fill in the lengths an id's batch draws from its seed; UserError for one drawn from a user's file, which an id cannot redraw."""
    batch = from_id_text(fields["length_dist"])
    if batch.from_file:
        raise UserError(f"case id {case_id!r} draws its lengths from a user's file: rebuild it from a record's fields "
                        f"(seq_lens_q, seq_lens_kv), which carry them")
    fields["length_dist"] = batch.text
    fields["seq_lens_q"], fields["seq_lens_kv"] = batch.draw(fields.get("seed", 0), fields.get("B"))


def layout_from_record(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A record's layout fields as a Case takes them: JSON lists (a CSV's text) as tuples, NaN (an empty CSV cell) as unset."""
    for name in ("seq_lens_q", "seq_lens_kv"):
        value = kwargs.get(name)
        if isinstance(value, str):
            kwargs[name] = json_lengths(name, value)
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
    for name in ("layout", "length_dist"):
        if isinstance(kwargs.get(name), float) and kwargs[name] != kwargs[name]:
            kwargs.pop(name)
    return kwargs


def json_lengths(name: str, text: str) -> tuple[int, ...]:
    """A CSV cell's JSON list of lengths as a tuple; UserError naming the field when it is not one."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # nesting past the parser's depth is as malformed as any bad JSON
        raise UserError(f"{name} must be a JSON list of lengths, got {text[:60]!r}") from None
    if not isinstance(value, list):
        raise UserError(f"{name} must be a JSON list of lengths, got {text[:60]!r}")
    return tuple(value)
