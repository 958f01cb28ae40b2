"""A JSON value checked against a dataclass field's annotation: how a stored record's columns are typed on read.

A reader never guesses whether `agree` is a bool, a 1 or "true": each column admits the types its field
declares (`int | None` admits an integer or null), as JSON holds them (a tuple is a JSON list).
"""

from __future__ import annotations

import math
import types
from typing import Any, Union, get_args, get_origin

from harness.errors import UserError
from harness.results.vocabulary import Status


def typed(name: str, value: Any, options: tuple[Any, ...], hint: Any, where: str) -> Any:
    """`value` as one of `options` (column `name`'s admitted types, `admitted(hint)`), or UserError naming the column and the value."""
    if value is None:
        if type(None) in options:
            return None
        raise UserError(f"{where}: field {name!r} is null")
    for kind in options:
        if kind is Status:
            try:
                return Status(value)
            except ValueError:
                continue
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind in (int, float) and isinstance(value, str):
            # Older writers stored numpy scalars with json's default=str: a number written as text is still that number.
            try:
                number = kind(value)
            except ValueError:
                continue
            if kind is float and not math.isfinite(number):
                return None
            return number
        if kind in (str, dict, list) and isinstance(value, kind):
            return value
    raise UserError(f"{where}: field {name!r} has value {value!r}, expected {describe(hint)}")


def options_of(hint: Any) -> tuple[Any, ...]:
    """The types a field's annotation admits (`int | None` → int, NoneType)."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)


def admitted(hint: Any) -> tuple[Any, ...]:
    """A field's admitted types as JSON holds them, generics by their origin (`list[float]` → list; a Case's tuples are JSON lists)."""
    return tuple(list if (get_origin(o) or o) is tuple else (get_origin(o) or o) for o in options_of(hint))


def describe(hint: Any) -> str:
    """The types an annotation admits, in words for an error (`an integer or a number`)."""
    names = {Status: "one of " + ", ".join(s.value for s in Status), bool: "true or false", int: "an integer",
             float: "a number", str: "a string", dict: "an object", list: "a list"}
    options = [o for o in options_of(hint) if o is not type(None)]
    return " or ".join(names.get(get_origin(o) or o, str(o)) for o in options)
