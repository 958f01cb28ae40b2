"""Test-only plugins that are broken in the ways a user's plugin can be: each must be listed unavailable, never crash a command.

Loaded with `ATTNBENCH_BACKENDS=tests.bad_plugins:<attr>`; `tests.plugin_exits_at_import` is the one that exits at import.
"""

from __future__ import annotations

import sys

from harness.backends.pytorch.naive import NaiveBackend


class _Renamed(NaiveBackend):
    """The naive backend under another name (a well-formed plugin, for the others to differ from)."""

    name = "plugin-ok"
    family = "test-plugin"


def _variant(label: str, **fields):
    """A subclass of _Renamed with `fields` overridden (class attributes, or `version` as the value version() returns)."""
    version = fields.pop("version", None)
    attrs = dict(fields)
    if version is not None:
        attrs["version"] = lambda self: version
    return type(label, (_Renamed,), attrs)


NameIsInt = _variant("NameIsInt", name=42)
NameIsEmpty = _variant("NameIsEmpty", name="")
NameIsNone = _variant("NameIsNone", name=None)
NameIsTuple = _variant("NameIsTuple", name=("a", "b"))
FamilyIsInt = _variant("FamilyIsInt", name="plugin-family-int", family=3)
FamilyIsNone = _variant("FamilyIsNone", name="plugin-family-none", family=None)
VersionIsFloat = _variant("VersionIsFloat", name="plugin-version-float", version=1.5)
VersionIsBytes = _variant("VersionIsBytes", name="plugin-version-bytes", version=b"1.0")
VersionIsList = _variant("VersionIsList", name="plugin-version-list", version=["1", "2"])
Fine = _Renamed


def exits_when_called(registry) -> None:
    """A registration hook that calls sys.exit() instead of adding a backend."""
    sys.exit(0)


def exits_with_text(registry) -> None:
    """A registration hook that exits with a message."""
    sys.exit("plugin gave up")
