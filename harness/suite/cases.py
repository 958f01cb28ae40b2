"""The description of one attention problem (a Case) and grids of them.

A Case is frozen and hashable: it is the key of a record, never the measurement itself
(the split torch.utils.benchmark makes between TaskSpec and Measurement).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from harness.errors import UserError
from harness.suite.case_layout import RAGGED_LAYOUTS, check_layout, draw_id_lengths, layout_from_record, layout_id_tokens

#: Short dtype names used in ids, CSVs and suite files, mapped to torch dtype attribute names.
DTYPES: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
}
_DTYPE_ALIASES = {v: k for k, v in DTYPES.items()} | {"float": "fp32", "half": "fp16"}

MODES = ("fwd", "bwd", "fwd_bwd")
DEVICES = ("cpu", "cuda")
#: The largest size, window or seed a case may have: a tensor dimension (and a record's integer column) is an int64.
MAX_INT = 2**63 - 1
#: The most sequences a padded case may have: it draws one length per sequence (inputs.kv_lengths), which every
#: input, mask and FLOP count then walks through; 2³¹ − 1 of them already take a minute to draw and count.
MAX_PADDED_B = 2**31 - 1
#: The integer fields of a case (all positive), and its boolean ones.
SIZE_FIELDS = ("B", "S_q", "S_kv", "H", "H_kv", "d_k", "d_v")
BOOL_FIELDS = ("causal", "padding", "mla")


def _is_bool(value: Any) -> bool:
    """A Python or numpy boolean scalar (numpy's is not a bool subclass, and its name changed in numpy 2)."""
    return isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0)


def _integer(name: str, value: Any, *, minimum: int = 1, expected: str | None = None) -> int:
    """`value` as a plain int in [minimum, MAX_INT] (numpy integers accepted, bools and floats not), or UserError naming the field."""
    expected = expected or ("a positive integer" if minimum == 1 else "a non-negative integer")
    try:
        if _is_bool(value):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise UserError(f"{name} must be {expected}, got {value!r}") from None
    if number < minimum:
        raise UserError(f"{name} must be {expected}, got {value!r}")
    if number > MAX_INT:
        raise UserError(f"{name}={number} is beyond int64 (at most {MAX_INT})")
    return int(number)


def _boolean(name: str, value: Any) -> bool:
    """`value` as a plain bool (numpy bools accepted), or UserError naming the field."""
    if _is_bool(value):
        return bool(value)
    raise UserError(f"{name} must be true or false, got {value!r}")


def canonical_dtype(name: str) -> str:
    """Return the short name (`bf16`) of a dtype given by short or torch name, or raise UserError."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UserError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return key


@dataclass(frozen=True)
class Case:
    """One attention problem: shapes, dtype, device, mask and pass.

    Layout convention for every tensor the harness hands a backend: `[B, H, S, d]`.
    Causal and sliding-window masks are aligned bottom-right (query i sees key j when
    j <= i + S_kv - S_q), the convention of FlashAttention and of a decoder with a KV cache.
    `window` w: a query sees the w keys ending at its own position (itself included; causal by
    construction, as Mistral's sliding window). `padding`: per-sequence key lengths drawn from the
    seed (`inputs.kv_lengths`); the alignment above is then per sequence, against its own length,
    and with S_q = S_kv the queries are padded too (a right-padded batch: padded rows see nothing).
    `mla`: K and V are one shared latent cache (DeepSeek's multi-head latent attention with the
    up-projections absorbed): V is the first d_v columns of K, H_kv = 1, d_k = d_c + d_rope, d_v = d_c.

    A ragged case (`layout` padded, packed or paged) is a batch of requests, each with its own query and
    KV lengths (`seq_lens_q`, `seq_lens_kv`), drawn from `length_dist` (harness.suite.batch) by the seed:
    B is the number of requests, S_q and S_kv the longest. The case carries its lengths, so a record
    rebuilds it exactly; the id carries the distribution and the seed, which draw them again, or, for a
    user's lengths file, the file's name and a hash of the lengths (rebuilt from a record, not an id).
    `page_size`: the KV cache's page size (paged only).
    """

    B: int
    S_q: int
    S_kv: int
    H: int
    H_kv: int
    d_k: int
    d_v: int
    dtype: str = "fp32"
    device: str = "cpu"
    causal: bool = False
    mode: str = "fwd"
    window: int | None = None
    padding: bool = False
    mla: bool = False
    seed: int = 0
    layout: str = "dense"
    page_size: int | None = None
    seq_lens_q: tuple[int, ...] | None = None
    seq_lens_kv: tuple[int, ...] | None = None
    length_dist: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        for name in SIZE_FIELDS:
            object.__setattr__(self, name, _integer(name, getattr(self, name)))
        for name in BOOL_FIELDS:
            object.__setattr__(self, name, _boolean(name, getattr(self, name)))
        object.__setattr__(self, "seed", _integer("seed", self.seed, minimum=0))
        if self.H % self.H_kv:
            raise UserError(f"H={self.H} is not divisible by H_kv={self.H_kv}")
        device = self.device.split(":")[0] if isinstance(self.device, str) else None
        if device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}: expected one of {', '.join(DEVICES)}")
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise UserError(f"unknown mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.window is not None:
            object.__setattr__(self, "window", _integer("window", self.window, expected="a positive integer or None"))
        if self.padding and self.B > MAX_PADDED_B:
            raise UserError(f"B={self.B} is too many sequences for a padded case (one length is drawn per sequence): at most {MAX_PADDED_B}")
        if self.mla and (self.H_kv != 1 or self.d_v > self.d_k):
            raise UserError(f"an MLA case has one shared latent cache: needs H_kv=1 and d_v <= d_k, got H_kv={self.H_kv}, d_k={self.d_k}, d_v={self.d_v}")
        check_layout(self, _integer)
        largest = max(self.B * self.H * self.S_q * max(self.d_k, self.d_v), self.B * self.H_kv * self.S_kv * max(self.d_k, self.d_v))
        if largest > MAX_INT:
            raise UserError(f"B={self.B}, H={self.H}, S={self.S_kv}, d={max(self.d_k, self.d_v)}: one input tensor would hold "
                            f"{largest:.3g} elements, more than a tensor can index (2^63 - 1)")

    @property
    def ragged(self) -> bool:
        """True for a batch of requests with lengths of their own (padded, packed or paged), False for a dense rectangle."""
        return self.layout != "dense"

    @property
    def id(self) -> str:
        """A stable, readable key such as `B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16-causal`."""
        parts = [f"B{self.B}", f"Sq{self.S_q}", f"Skv{self.S_kv}", f"H{self.H}", f"Hkv{self.H_kv}", f"dk{self.d_k}"]
        if self.d_v != self.d_k:
            parts.append(f"dv{self.d_v}")
        parts.append(self.dtype)
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"win{self.window}")
        if self.padding:
            parts.append("pad")
        if self.mla:
            parts.append("mla")
        if self.mode != "fwd":
            parts.append(self.mode)
        parts += layout_id_tokens(self)
        if self.seed:
            parts.append(f"seed{self.seed}")
        return "-".join(parts)

    @property
    def attention_kind(self) -> str:
        """`MHA`, `GQA` or `MQA`, from the ratio of query heads to key/value heads."""
        if self.H_kv == self.H:
            return "MHA"
        return "MQA" if self.H_kv == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """Query heads that share one key/value head."""
        return self.H // self.H_kv

    @property
    def masked(self) -> bool:
        """True when some (query, key) pairs are hidden."""
        return self.causal or self.window is not None or self.padding

    def fields(self) -> dict[str, Any]:
        """The case's fields as a plain dict (for records)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Case":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_id(cls, case_id: str, device: str = "cpu") -> "Case":
        """The Case whose `.id` is `case_id` (the id leaves the device out, so give it)."""
        return parse_case_id(case_id, device)


CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))

#: The id's tokens in the order `Case.id` writes them: (field, prefix, required); dtype is matched by name.
_ID_TOKENS = (("B", "B", True), ("S_q", "Sq", True), ("S_kv", "Skv", True), ("H", "H", True), ("H_kv", "Hkv", True), ("d_k", "dk", True), ("d_v", "dv", False))


def _is_number(text: str) -> bool:
    """ASCII digits only (`str.isdigit` also takes '²', which int() refuses), short enough for int() to parse."""
    return text.isascii() and text.isdigit() and len(text) < 4000


def parse_case_id(case_id: str, device: str = "cpu") -> Case:
    """Parse an id such as `B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16-causal` back into its Case; UserError names a bad token."""
    if not isinstance(case_id, str):
        raise UserError(f"a case id is a string such as 'B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16', got {case_id!r}")
    tokens = case_id.strip().split("-")
    fields: dict[str, Any] = {"device": device}
    position = 0

    def bad(token: str, expected: str) -> UserError:
        return UserError(f"case id {case_id!r}: token {token!r} is not {expected}")

    for name, prefix, required in _ID_TOKENS:
        token = tokens[position] if position < len(tokens) else ""
        # `H` is a prefix of `Hkv`: a token must be the prefix followed by digits only.
        if token.startswith(prefix) and _is_number(token[len(prefix):]):
            fields[name] = int(token[len(prefix):])
            position += 1
        elif required:
            raise bad(token, f"{prefix}<integer> ({name})") if token else UserError(f"case id {case_id!r}: missing {prefix}<integer> ({name})")
    fields.setdefault("d_v", fields["d_k"])
    if position >= len(tokens) or tokens[position] not in DTYPES:
        raise UserError(f"case id {case_id!r}: expected a dtype ({', '.join(DTYPES)}) after the shapes")
    fields["dtype"] = tokens[position]
    position += 1
    # The optional tokens, each at most once and in the order `.id` writes them.
    optional = [
        ("causal", lambda t: t == "causal", lambda t: True),
        ("window", lambda t: t.startswith("win") and _is_number(t[3:]), lambda t: int(t[3:])),
        ("padding", lambda t: t == "pad", lambda t: True),
        ("mla", lambda t: t == "mla", lambda t: True),
        ("mode", lambda t: t in MODES and t != "fwd", lambda t: t),
        ("layout", lambda t: t in RAGGED_LAYOUTS, lambda t: t),
        ("page_size", lambda t: t.startswith("page") and _is_number(t[4:]), lambda t: int(t[4:])),
        ("length_dist", lambda t: t.startswith("L") and len(t) > 1, lambda t: t[1:]),
        ("lengths_hash", lambda t: len(t) == 9 and t[0] == "h" and all(c in "0123456789abcdef" for c in t[1:]), lambda t: t[1:]),
        ("seed", lambda t: t.startswith("seed") and _is_number(t[4:]), lambda t: int(t[4:])),
    ]
    for token in tokens[position:]:
        while optional and not optional[0][1](token):
            optional.pop(0)
        if not optional:
            raise UserError(f"case id {case_id!r}: unexpected token {token!r} (after the dtype come causal, win<N>, pad, mla, bwd|fwd_bwd, "
                            f"padded|packed|paged, page<N>, L<batch>, h<hash>, seed<N>, in that order)")
        name, _, value = optional.pop(0)
        fields[name] = value(token)
    if "length_dist" in fields:
        draw_id_lengths(case_id, fields)
    if fields.pop("lengths_hash", None) is not None:  # a hash without a file's batch: the id is not one attnbench writes
        raise UserError(f"case id {case_id!r}: a lengths hash (h<hex>) belongs to a batch drawn from a lengths file (L…file:…)")
    case = Case(**fields)
    if case.id != case_id.strip():
        raise UserError(f"case id {case_id!r} is not canonical: the same case is written {case.id!r}")
    return case


def case_from_fields(fields: Mapping[str, Any]) -> Case:
    """Rebuild a Case from a record's fields, ignoring the non-case ones; UserError names a missing or ill-typed field.

    Tolerates what a CSV round-trip does to a record (integral floats such as 4.0, NaN for no window),
    never a truncation (2.5 is not an integer) or a string standing for a number.
    """
    required = [f.name for f in dataclasses.fields(Case) if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in fields]
    if missing:
        raise UserError(f"missing case field {missing[0]!r}")
    kwargs = {name: fields[name] for name in CASE_FIELDS if name in fields}
    for name in (*SIZE_FIELDS, "seed", "window"):
        value = kwargs.get(name)
        if isinstance(value, float) or type(value).__name__.startswith("float"):
            if name == "window" and value != value:  # NaN from a CSV round-trip: no window
                kwargs[name] = None
            elif math.isfinite(value) and float(value).is_integer():
                kwargs[name] = int(value)
            else:
                raise UserError(f"{name} must be an integer, got {value!r}")
    return Case(**layout_from_record(kwargs))


def grid(
    *,
    B: Iterable[int],
    S: Iterable[int] | None = None,
    S_q: Iterable[int] | None = None,
    S_kv: Iterable[int] | None = None,
    H: Iterable[int],
    H_kv: Iterable[int | str] = ("H",),
    d_k: Iterable[int],
    d_v: Iterable[int | None] = (None,),
    dtype: Iterable[str] = ("fp32",),
    device: str = "cpu",
    causal: Iterable[bool] = (False,),
    mode: Iterable[str] = ("fwd",),
    window: Iterable[int | None] = (None,),
    padding: Iterable[bool] = (False,),
    mla: Iterable[bool] = (False,),
    seed: int = 0,
) -> list[Case]:
    """The Cartesian product of the given axes as Cases, in a stable order.

    `S` sets S_q = S_kv; give `S_q` and `S_kv` instead for cross attention or decoding.
    `H_kv` accepts `"H"` (MHA) and skips a value for the H it does not divide, so that one grid
    can sweep H ∈ {12, 16} against H_kv ∈ {H, 8, 1}; a value that divides no H is an error. `d_v=None` means d_v = d_k.
    """
    def values(name: str, axis: Any) -> list:
        # One value or a list of them; a string is one value (not its characters).
        if isinstance(axis, (str, bytes)) or not isinstance(axis, Iterable):
            return [axis]
        values = list(axis)
        if not values:
            raise UserError(f"grid axis {name!r} is empty")
        return values

    B, H, H_kv, d_k, d_v = values("B", B), values("H", H), values("H_kv", H_kv), values("d_k", d_k), values("d_v", d_v)
    dtype, causal, mode, window = values("dtype", dtype), values("causal", causal), values("mode", mode), values("window", window)
    padding, mla = values("padding", padding), values("mla", mla)
    S, S_q, S_kv = (None if axis is None else values(name, axis) for name, axis in (("S", S), ("S_q", S_q), ("S_kv", S_kv)))
    if S is not None and (S_q is not None or S_kv is not None):
        raise UserError("give either S or S_q/S_kv, not both")
    if S is None and (S_q is None or S_kv is None):
        raise UserError("give S, or both S_q and S_kv")
    seq_pairs = [(s, s) for s in S] if S is not None else list(itertools.product(S_q, S_kv))
    for h in H:
        _integer("H", h)  # before H_kv is checked against it
    for hkv in H_kv:
        # A value that fits some H but not another is skipped for that H; one that fits none is a mistake.
        if isinstance(hkv, int) and not isinstance(hkv, bool) and hkv > 0 and all(h % hkv for h in H):
            raise UserError(f"H={'/'.join(map(str, H))} is not divisible by H_kv={hkv}")
    cases: list[Case] = []
    seen: set[Case] = set()
    for b, (sq, skv), h, hkv, dk, dv, dt, c, m, w, p, la in itertools.product(
        B, seq_pairs, H, H_kv, d_k, d_v, dtype, causal, mode, window, padding, mla
    ):
        hkv_value = h if hkv == "H" else hkv
        if isinstance(hkv_value, int) and not isinstance(hkv_value, bool) and hkv_value > 0 and h % hkv_value:
            continue
        case = Case(
            B=b, S_q=sq, S_kv=skv, H=h, H_kv=hkv_value, d_k=dk, d_v=dk if dv is None else dv,
            dtype=dt, device=device, causal=c, mode=m, window=w, padding=p, mla=la, seed=seed,
        )
        if case not in seen:
            seen.add(case)
            cases.append(case)
    return cases
