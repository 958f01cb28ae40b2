"""The description of one attention problem (a Case) and grids of them.

A Case is frozen and hashable: it is the key of a record, never the measurement itself
(the split torch.utils.benchmark makes between TaskSpec and Measurement).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from harness.errors import UserError
from harness.suite.case_id import id_fields, id_tokens
from harness.suite.case_layout import RAGGED_FIELDS, check_layout, layout_from_record
from harness.suite.case_values import DEVICES, FP8_DTYPES, MAX_INT, MODES, boolean, canonical_dtype, canonical_mode, integer, positive_float

#: MODES and canonical_dtype live in harness.suite.case_values; many callers take them from here, beside the Case.
__all__ = ["Case", "CASE_FIELDS", "CASE_FIELDS_ADDED",
           "MAX_PADDED_B", "MODES", "canonical_dtype", "case_from_fields", "grid", "parse_case_id"]

#: The most sequences a padded case may have: it draws one length per sequence (inputs.kv_lengths), which every
#: input, mask and FLOP count then walks through; 2³¹ − 1 of them already take a minute to draw and count.
MAX_PADDED_B = 2**31 - 1


def added_later(default: Any) -> Any:
    """A Case field added after records were first written: a record without it reads with `default`, which is what every
    case measured before the field existed computed (harness.results.store). Declared on the field: there is no list."""
    return dataclasses.field(default=default, metadata={"added_later": True})


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

    Score variants (harness.attention.variants): `softcap` c turns each scaled score s into c·tanh(s/c) before
    masking; `sinks` adds one learned logit per query head (`inputs.sinks`) to every row's softmax denominator;
    `alibi` adds −slope_h·|pos(i) − j| (Press et al.'s slopes, pos(i) the query's bottom-right key position);
    `scale` is the softmax scale where a model's is not 1/√d_k (`softmax_scale`).
    `deterministic`: the backward pass must be bitwise repeatable (FlashAttention's `deterministic=True`, torch's
    `use_deterministic_algorithms`); a backward property, so only for modes bwd and fwd_bwd (harness.backends.determinism).

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
    softcap: float | None = added_later(None)
    sinks: bool = added_later(False)
    alibi: bool = added_later(False)
    scale: float | None = added_later(None)
    deterministic: bool = added_later(False)
    kv_dtype: str | None = added_later(None)
    seed: int = 0
    layout: str = "dense"
    page_size: int | None = None
    seq_lens_q: tuple[int, ...] | None = None
    seq_lens_kv: tuple[int, ...] | None = None
    length_dist: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        for name in SIZE_FIELDS:
            object.__setattr__(self, name, integer(name, getattr(self, name)))
        for name in BOOL_FIELDS:
            object.__setattr__(self, name, boolean(name, getattr(self, name)))
        object.__setattr__(self, "seed", integer("seed", self.seed, minimum=0))
        if self.H % self.H_kv:
            raise UserError(f"H={self.H} is not divisible by H_kv={self.H_kv}")
        device = self.device.split(":")[0] if isinstance(self.device, str) else None
        if device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}: expected one of {', '.join(DEVICES)}")
        canonical_mode(self.mode)
        self._check_fp8()
        if self.deterministic and self.mode == "fwd":  # forward kernels are deterministic already
            raise UserError("deterministic is a backward property; give mode bwd or fwd_bwd")
        for name in OPTIONAL_INT_FIELDS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, integer(name, getattr(self, name), expected="a positive integer or None"))
        if self.padding and self.B > MAX_PADDED_B:
            raise UserError(f"B={self.B} is too many sequences for a padded case (one length is drawn per sequence): at most {MAX_PADDED_B}")
        if self.mla and (self.H_kv != 1 or self.d_v > self.d_k):
            raise UserError(f"an MLA case has one shared latent cache: needs H_kv=1 and d_v <= d_k, got H_kv={self.H_kv}, d_k={self.d_k}, d_v={self.d_v}")
        for name in OPTIONAL_FLOAT_FIELDS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_float(name, getattr(self, name)))
        self._check_variants()
        check_layout(self)
        largest = max(self.B * self.H * self.S_q * max(self.d_k, self.d_v), self.B * self.H_kv * self.S_kv * max(self.d_k, self.d_v))
        if largest > MAX_INT:
            raise UserError(f"B={self.B}, H={self.H}, S={self.S_kv}, d={max(self.d_k, self.d_v)}: one input tensor would hold "
                            f"{largest:.3g} elements, more than a tensor can index (2^63 - 1)")

    def _check_fp8(self) -> None:
        """kv_dtype is an FP8 format beside fp16/bf16 queries, on a dense case; an FP8 case has no score variant (no FP8 kernel here takes one)."""
        if self.kv_dtype is not None:
            object.__setattr__(self, "kv_dtype", canonical_dtype(self.kv_dtype))
            if self.kv_dtype not in FP8_DTYPES:
                raise UserError(f"kv_dtype {self.kv_dtype!r} is not an FP8 format: expected one of {', '.join(FP8_DTYPES)} (or none)")
            if self.dtype not in ("fp16", "bf16"):
                raise UserError(f"an FP8 KV cache sits beside fp16 or bf16 queries, not {self.dtype} ones (an all-FP8 case is dtype {self.kv_dtype})")
        fp8 = self.dtype in FP8_DTYPES or self.kv_dtype is not None
        used = [name for name in ("softcap", "sinks", "alibi", "mla", "padding") if getattr(self, name) not in (None, False)]
        if fp8 and used:
            raise UserError(f"an FP8 case has no {used[0]}: FP8 cases here are plain, causal or windowed attention")
        if fp8 and self.layout != "dense":
            raise UserError(f"an FP8 case is dense here (a {self.layout} batch has no FP8 layout yet)")

    def _check_variants(self) -> None:
        """Refuse score variants together that no model has and no definition here covers."""
        used = [name for name in ("softcap", "sinks", "alibi") if getattr(self, name) not in (None, False)]
        if self.mla and used:
            # A scale it has: DeepSeek's absorbed attention scales by its 192-wide q-k head's 1/√192 (times YaRN's mscale²), not 1/√576.
            raise UserError(f"an MLA case has no {used[0]}: DeepSeek's latent attention uses none of softcap, sinks or alibi")
        if self.alibi and (self.softcap is not None or self.sinks):
            other = "softcap" if self.softcap is not None else "sinks"
            raise UserError(f"alibi with {other}: no model combines them, so no definition says in which order they apply")

    @property
    def softmax_scale(self) -> float:
        """The scale of the scores: `scale` where the case sets one, else 1/√d_k."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d_k)

    @property
    def ragged(self) -> bool:
        """True for a batch of requests with lengths of their own (padded, packed or paged), False for a dense rectangle."""
        return self.layout != "dense"

    @property
    def id(self) -> str:
        """A stable, readable key such as `B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16-causal` (its tokens: harness.suite.case_id)."""
        return "-".join(id_tokens(self))

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


CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))
#: The fields a record may lack (`added_later`): a record written before them reads with their defaults.
CASE_FIELDS_ADDED = tuple(f.name for f in dataclasses.fields(Case) if f.metadata.get("added_later"))
#: The Case's fields by their annotations (text, under `from __future__ import annotations`), so that a new field is
#: checked by its type: the integers (all positive but the seed), the booleans, and the integers that may be None
#: (page_size is the layout's: harness.suite.case_layout checks it).
_TYPES = {f.name: f.type for f in dataclasses.fields(Case)}
SIZE_FIELDS = tuple(name for name, kind in _TYPES.items() if kind == "int" and name != "seed")
BOOL_FIELDS = tuple(name for name, kind in _TYPES.items() if kind == "bool")
OPTIONAL_INT_FIELDS = tuple(name for name, kind in _TYPES.items() if kind == "int | None" and name not in RAGGED_FIELDS)
OPTIONAL_FLOAT_FIELDS = tuple(name for name, kind in _TYPES.items() if kind == "float | None")


def parse_case_id(case_id: str, device: str = "cpu") -> Case:
    """Parse an id such as `B1-Sq1024-Skv1024-H16-Hkv4-dk64-bf16-causal` back into its Case; UserError names a bad token."""
    case = Case(**id_fields(case_id, device))
    if case.id != case_id.strip():
        raise UserError(f"case id {case_id!r} is not canonical: the same case is written {case.id!r}")
    return case


def case_from_fields(fields: Mapping[str, Any]) -> Case:
    """Rebuild a Case from a record's fields, ignoring the non-case ones; UserError names a missing or ill-typed field.

    Tolerates what a CSV round-trip does to a record (integral floats such as 4.0, NaN for an unset optional
    integer), never a truncation (2.5 is not an integer) or a string standing for a number.
    """
    required = [f.name for f in dataclasses.fields(Case) if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in fields]
    if missing:
        raise UserError(f"missing case field {missing[0]!r}")
    kwargs = {name: fields[name] for name in CASE_FIELDS if name in fields}
    for name in (name for name, kind in _TYPES.items() if kind in ("int", "int | None")):
        value = kwargs.get(name)
        if isinstance(value, float) or type(value).__name__.startswith("float"):
            if _TYPES[name] == "int | None" and value != value:  # NaN from a CSV round-trip: unset
                kwargs[name] = None
            elif math.isfinite(value) and float(value).is_integer():
                kwargs[name] = int(value)
            else:
                raise UserError(f"{name} must be an integer, got {value!r}")
    for name in OPTIONAL_FLOAT_FIELDS:
        value = kwargs.get(name)
        if (isinstance(value, float) or type(value).__name__.startswith("float")) and value != value:  # NaN: unset
            kwargs[name] = None
    return Case(**layout_from_record(kwargs))


#: What grid() takes for an axis it is not given, where the Case has no default: H_kv = H (MHA), d_v = d_k.
_GRID_DEFAULTS = {"H_kv": ("H",), "d_v": (None,)}


def _axis(name: str, axis: Any) -> list:
    """One value or a list of them as a list; a string is one value (not its characters)."""
    if isinstance(axis, (str, bytes)) or not isinstance(axis, Iterable):
        return [axis]
    values = list(axis)
    if not values:
        raise UserError(f"grid axis {name!r} is empty")
    return values


def grid(**axes: Any) -> list[Case]:
    """The Cartesian product of the given axes (any Case field, one value or a list of them) as Cases, in a stable order.

    The order is the Case's field order, the first field outermost. `S` sets S_q = S_kv; give `S_q` and
    `S_kv` instead for cross attention or decoding. `H_kv` accepts `"H"` (MHA, its default) and skips a value
    for the H it does not divide, so that one grid can sweep H ∈ {12, 16} against H_kv ∈ {H, 8, 1}; a value
    that divides no H is an error. `d_v=None` (its default) means d_v = d_k. B, H and d_k have no default.
    """
    unknown = next((name for name in axes if name not in CASE_FIELDS and name != "S"), None)
    if unknown is not None:
        raise UserError(f"grid has no axis {unknown!r}: its axes are S and the Case's fields ({', '.join(CASE_FIELDS)})")
    lists = {name: _axis(name, axis) for name, axis in {**_GRID_DEFAULTS, **axes}.items()}
    needed = [f.name for f in dataclasses.fields(Case) if f.default is dataclasses.MISSING and f.name not in ("S_q", "S_kv")]
    missing = next((name for name in needed if name not in lists), None)
    if missing is not None:
        raise UserError(f"grid axis {missing!r} is missing: give it one value or a list of them")
    S = lists.pop("S", None)
    if S is not None and ("S_q" in lists or "S_kv" in lists):
        raise UserError("give either S or S_q/S_kv, not both")
    if S is None and ("S_q" not in lists or "S_kv" not in lists):
        raise UserError("give S, or both S_q and S_kv")
    seq_pairs = [(s, s) for s in S] if S is not None else list(itertools.product(lists.pop("S_q"), lists.pop("S_kv")))
    for h in lists["H"]:
        integer("H", h)  # before H_kv is checked against it
    for hkv in lists["H_kv"]:
        # A value that fits some H but not another is skipped for that H; one that fits none is a mistake.
        if isinstance(hkv, int) and not isinstance(hkv, bool) and hkv > 0 and all(h % hkv for h in lists["H"]):
            raise UserError(f"H={'/'.join(map(str, lists['H']))} is not divisible by H_kv={hkv}")
    # One slot per axis in the Case's field order; the sequence lengths are one slot of (S_q, S_kv) pairs.
    slots = [[{"S_q": q, "S_kv": kv} for q, kv in seq_pairs] if name == "S_q" else [{name: v} for v in lists[name]]
             for name in CASE_FIELDS if name == "S_q" or name in lists]
    cases: dict[Case, None] = {}
    for combination in itertools.product(*slots):
        fields = {name: value for slot in combination for name, value in slot.items()}
        h, hkv = fields["H"], fields["H"] if fields["H_kv"] == "H" else fields["H_kv"]
        if isinstance(hkv, int) and not isinstance(hkv, bool) and hkv > 0 and h % hkv:
            continue
        fields["H_kv"] = hkv
        fields["d_v"] = fields["d_k"] if fields["d_v"] is None else fields["d_v"]
        cases.setdefault(Case(**fields))
    return list(cases)
