"""The values a Case's fields take: dtype names, passes, devices, the largest integer, and the checks of one value.

Below `harness.suite.cases` so that the rules of a batch's layout (harness.suite.case_layout) and of a case's
id (harness.suite.case_id) check their values as the Case does, without importing the Case.
"""

from __future__ import annotations

import operator
from typing import Any

from harness.errors import UserError

#: Short dtype names used in ids, CSVs and suite files, mapped to torch dtype attribute names.
DTYPES: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    # FP8 (OCP): Q, K and V quantized per tensor with a float32 descale each (harness.attention.fp8); the output is bf16.
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
_DTYPE_ALIASES = {v: k for k, v in DTYPES.items()} | {"float": "fp32", "half": "fp16"}
#: Bytes per element of each dtype, torch-free, for the cost model a report reads (a test holds it to torch's itemsize).
DTYPE_BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
#: The FP8 formats: a case's dtype (Q, K and V in FP8) or its kv_dtype (an FP8 KV cache beside fp16/bf16 queries).
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")

MODES = ("fwd", "bwd", "fwd_bwd")
DEVICES = ("cpu", "cuda")
#: The largest size, window or seed a case may have: a tensor dimension (and a record's integer column) is an int64.
MAX_INT = 2**63 - 1


def is_bool(value: Any) -> bool:
    """A Python or numpy boolean scalar (numpy's is not a bool subclass, and its name changed in numpy 2)."""
    return isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0)


def integer(name: str, value: Any, *, minimum: int = 1, expected: str | None = None) -> int:
    """`value` as a plain int in [minimum, MAX_INT] (numpy integers accepted, bools and floats not), or UserError naming the field."""
    expected = expected or ("a positive integer" if minimum == 1 else "a non-negative integer")
    try:
        if is_bool(value):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise UserError(f"{name} must be {expected}, got {value!r}") from None
    if number < minimum:
        raise UserError(f"{name} must be {expected}, got {value!r}")
    if number > MAX_INT:
        raise UserError(f"{name}={number} is beyond int64 (at most {MAX_INT})")
    return int(number)


def boolean(name: str, value: Any) -> bool:
    """`value` as a plain bool (numpy bools accepted), or UserError naming the field."""
    if is_bool(value):
        return bool(value)
    raise UserError(f"{name} must be true or false, got {value!r}")


def canonical_dtype(name: str) -> str:
    """Return the short name (`bf16`) of a dtype given by short or torch name, or raise UserError."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        aliases = ", ".join(f"{alias} ({short})" for alias, short in _DTYPE_ALIASES.items())
        raise UserError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}, or an alias: {aliases}")
    return key


def canonical_mode(mode: Any) -> str:
    """`mode` when it is one of MODES, else UserError naming it."""
    if not isinstance(mode, str) or mode not in MODES:
        raise UserError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    return mode


#: A field's own check of one value where its type says too little (dtype's names and aliases, mode's passes):
#: the Case applies it, and a suite file's reader applies it to each value of an axis before any case is built.
VALUE_CHECKS = {"dtype": canonical_dtype, "mode": canonical_mode}


#: The ranges of the float fields: their `repr` then has no exponent and no '-', so a value survives an id token
#: (`cap30.5`, `scale0.125`) and a CSV cell exactly.
FLOAT_RANGES: dict[str, tuple[float, float]] = {"softcap": (1e-4, 1e6), "scale": (1e-4, 100.0)}


def positive_float(name: str, value: Any) -> float:
    """`value` as a plain finite float within FLOAT_RANGES[name] (ints and numpy floats accepted, bools not), or UserError naming the field."""
    low, high = FLOAT_RANGES[name]
    expected = f"a number in [{low:g}, {high:g}] or None (so that an id and a CSV carry it exactly)"
    if is_bool(value) or not isinstance(value, (int, float)) and not type(value).__name__.startswith(("float", "int")):
        raise UserError(f"{name} must be {expected}, got {value!r}")
    number = float(value)
    if not low <= number <= high:  # also refuses NaN
        raise UserError(f"{name} must be {expected}, got {value!r}")
    return number
