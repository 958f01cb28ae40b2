"""A Case's id: its tokens, one table of them, read by `Case.id` to write an id and by `parse_case_id` to read one back.

Below `harness.suite.cases`: the table works on any object with the Case's fields (writing) and on a dict of
them (reading), so the Case builds itself from what is read here. A field with an id token is one row of
`OPTIONAL_TOKENS`; its place in the table is its place in the id.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from harness.errors import UserError
from harness.suite.batch import case_batch, lengths_digest
from harness.suite.case_layout import RAGGED_LAYOUTS, draw_id_lengths
from harness.suite.case_values import DTYPES, FP8_DTYPES, MODES

#: The shape tokens in the order the id writes them: (field, prefix, required); d_v is written only when it is not d_k.
SHAPE_TOKENS = (("B", "B", True), ("S_q", "Sq", True), ("S_kv", "Skv", True), ("H", "H", True), ("H_kv", "Hkv", True),
                ("d_k", "dk", True), ("d_v", "dv", False))


def _is_number(text: str) -> bool:
    """ASCII digits only (`str.isdigit` also takes '²', which int() refuses), short enough for int() to parse."""
    return text.isascii() and text.isdigit() and len(text) < 4000


class Token(NamedTuple):
    """One optional token after the dtype: the field it sets, how the id's grammar writes it, the tokens of a case's
    value (none for the default), and the value a token stands for (None: not this field's token)."""

    field: str
    spelling: str
    write: Callable[[Any], list[str]]
    read: Callable[[str], Any]


def flag(field: str, word: str) -> Token:
    """The token of a boolean field: `word` when it is true, nothing when false."""
    return Token(field, word, lambda case: [word] if getattr(case, field) else [], lambda t: True if t == word else None)


def numbered(field: str, prefix: str, default: Any = None) -> Token:
    """The token of an integer field: `prefix<N>`, nothing when the field holds `default`."""
    return Token(field, f"{prefix}<N>", lambda case: [] if getattr(case, field) == default else [f"{prefix}{getattr(case, field)}"],
                 lambda t: int(t[len(prefix):]) if t.startswith(prefix) and _is_number(t[len(prefix):]) else None)


def _float_text(value: float) -> str:
    """A float as an id writes it: `30` for an integral value, else its repr (`30.5`, `0.125`; the Case's ranges keep out exponents)."""
    return str(int(value)) if value.is_integer() else repr(value)


def _read_float(text: str) -> float | None:
    """The float an id's number stands for (digits, at most one '.', no exponent or sign), or None."""
    whole, dot, fraction = text.partition(".")
    if not _is_number(whole) or (dot and not _is_number(fraction)):
        return None
    return float(text)


def decimal(field: str, prefix: str) -> Token:
    """The token of a float field: `prefix<number>` (see _float_text), nothing when the field is None."""
    return Token(field, f"{prefix}<number>", lambda case: [] if getattr(case, field) is None else [f"{prefix}{_float_text(getattr(case, field))}"],
                 lambda t: _read_float(t[len(prefix):]) if t.startswith(prefix) else None)


def _batch_tokens(case: Any) -> list[str]:
    """`L<batch>` for a ragged case, and `h<hash of the lengths>` when they come from a user's file (an id cannot redraw them)."""
    if case.length_dist is None:
        return []
    batch = case_batch(case.length_dist)
    return [f"L{batch.id_text}"] + ([f"h{lengths_digest(case.seq_lens_q, case.seq_lens_kv)}"] if batch.from_file else [])


def _is_hash(token: str) -> bool:
    return len(token) == 9 and token[0] == "h" and all(c in "0123456789abcdef" for c in token[1:])


#: The optional tokens, each at most once and in this order. `lengths_hash` is no field: `_batch_tokens` writes it after `L…`.
OPTIONAL_TOKENS = (
    Token("kv_dtype", "kv<fp8 format>", lambda c: [] if c.kv_dtype is None else [f"kv{c.kv_dtype}"],
          lambda t: t[2:] if t.startswith("kv") and t[2:] in FP8_DTYPES else None),
    flag("causal", "causal"),
    numbered("window", "win"),
    flag("padding", "pad"),
    flag("mla", "mla"),
    decimal("softcap", "cap"),
    flag("sinks", "sinks"),
    flag("alibi", "alibi"),
    decimal("scale", "scale"),
    Token("mode", "bwd|fwd_bwd", lambda c: [] if c.mode == "fwd" else [c.mode], lambda t: t if t in MODES and t != "fwd" else None),
    flag("deterministic", "det"),
    Token("layout", "|".join(RAGGED_LAYOUTS), lambda c: [] if c.layout == "dense" else [c.layout], lambda t: t if t in RAGGED_LAYOUTS else None),
    numbered("page_size", "page"),
    Token("length_dist", "L<batch>", _batch_tokens, lambda t: t[1:] if t.startswith("L") and len(t) > 1 else None),
    Token("lengths_hash", "h<hash>", lambda c: [], lambda t: t[1:] if _is_hash(t) else None),
    numbered("seed", "seed", default=0),
)


def id_tokens(case: Any) -> list[str]:
    """The tokens of a case's id, in order: shapes, dtype, then each optional token its fields call for."""
    parts = [f"{prefix}{getattr(case, name)}" for name, prefix, required in SHAPE_TOKENS if required or case.d_v != case.d_k]
    parts.append(case.dtype)
    for token in OPTIONAL_TOKENS:
        parts += token.write(case)
    return parts


def id_fields(case_id: str, device: str) -> dict[str, Any]:
    """The fields an id names (its ragged lengths drawn again from its batch and seed); UserError naming a bad token."""
    if not isinstance(case_id, str):
        raise UserError(f"a case id is a string such as 'B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16', got {case_id!r}")
    tokens = case_id.strip().split("-")
    fields: dict[str, Any] = {"device": device}
    position = 0
    for name, prefix, required in SHAPE_TOKENS:
        token = tokens[position] if position < len(tokens) else ""
        # `H` is a prefix of `Hkv`: a token must be the prefix followed by digits only.
        if token.startswith(prefix) and _is_number(token[len(prefix):]):
            fields[name] = int(token[len(prefix):])
            position += 1
        elif required and token:
            raise UserError(f"case id {case_id!r}: token {token!r} is not {prefix}<integer> ({name})")
        elif required:
            raise UserError(f"case id {case_id!r}: missing {prefix}<integer> ({name})")
    fields.setdefault("d_v", fields["d_k"])
    if position >= len(tokens) or tokens[position] not in DTYPES:
        raise UserError(f"case id {case_id!r}: expected a dtype ({', '.join(DTYPES)}) after the shapes")
    fields["dtype"] = tokens[position]
    optional = list(OPTIONAL_TOKENS)
    for token in tokens[position + 1:]:
        while optional and optional[0].read(token) is None:
            optional.pop(0)
        if not optional:
            raise UserError(f"case id {case_id!r}: unexpected token {token!r} (after the dtype come "
                            f"{', '.join(t.spelling for t in OPTIONAL_TOKENS)}, in that order)")
        match = optional.pop(0)
        fields[match.field] = match.read(token)
    if "length_dist" in fields:
        draw_id_lengths(case_id, fields)
    if fields.pop("lengths_hash", None) is not None:  # a hash without a file's batch: the id is not one attnbench writes
        raise UserError(f"case id {case_id!r}: a lengths hash (h<hex>) belongs to a batch drawn from a lengths file (L…file:…)")
    return fields
