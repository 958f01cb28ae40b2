"""The checks a JSON document's fields pass (a run folder's documents, a run's options): each returns the value, or
raises a one-line UserError naming the file and the field.

Apart from harness.results.documents so that the run options (harness.results.run_options), which the
manifest reads, check their fields the same way without importing the documents back.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from harness.errors import UserError

#: A field check: (value, file, field name) → the value, or UserError naming the file and the field.
Check = Callable[[Any, str, str], Any]


def _fail(where: str, name: str, value: Any, expected: str) -> UserError:
    shown = repr(value)
    return UserError(f"{where}: field {name!r} has value {shown if len(shown) <= 60 else shown[:57] + '...'}, expected {expected}")


def _accepting(test: Callable[[Any], bool], expected: str) -> Check:
    """The check that lets through the values `test` accepts, and names `expected` for the others."""
    def check(value: Any, where: str, name: str) -> Any:
        if not test(value):
            raise _fail(where, name, value, expected)
        return value
    return check


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


_string = _accepting(lambda v: isinstance(v, str), "a string")
_boolean = _accepting(lambda v: isinstance(v, bool), "true or false")
_count = _accepting(lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= 0, "a non-negative integer")
_number = _accepting(_is_number, "a finite number")
_positive = _accepting(lambda v: _is_number(v) and v > 0, "a positive number")
_scalar = _accepting(lambda v: isinstance(v, (str, int, float, bool)), "a string or a number")
_object = _accepting(lambda v: isinstance(v, dict), "an object")
# A suite copy is joined to the folder's path: a name with a '/' or '..' could point at any file.
_plain_name = _accepting(lambda v: isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\0" not in v,
                         "a file name inside the run folder")
_device = _accepting(lambda v: v in ("cpu", "cuda"), "'cpu' or 'cuda'")


def optional(check: Check) -> Check:
    """`check`, or null."""
    return lambda value, where, name: None if value is None else check(value, where, name)


def list_of(check: Check) -> Check:
    """A list whose every item passes `check` (the item named by its index)."""
    def checked(value: Any, where: str, name: str) -> list:
        if not isinstance(value, list):
            raise _fail(where, name, value, "a list")
        return [check(item, where, f"{name}[{i}]") for i, item in enumerate(value)]
    return checked


def object_of(check: Check) -> Check:
    """An object whose every value passes `check` (the value named by its key)."""
    def checked(value: Any, where: str, name: str) -> dict:
        return {key: check(item, where, f"{name}.{key}") for key, item in _object(value, where, name).items()}
    return checked


def fields_of(**checks: Check) -> Check:
    """An object whose named fields, where present, pass their checks; other fields are kept unchecked."""
    def checked(value: Any, where: str, name: str) -> dict:
        value = _object(value, where, name)
        return {key: checks[key](item, where, f"{name}.{key}") if key in checks else item for key, item in value.items()}
    return checked
