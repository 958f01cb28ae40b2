"""Attention backends behind one interface, and the registry that lists them.

The names below are imported on first use (PEP 562), so that reading a submodule that needs no torch
(`harness.backends.capabilities`, what the analysis reads) does not import torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type checker sees the real classes (harness/py.typed); at run time they load on first use
    from harness.backends.base import Backend, Prepared, expand_kv  # noqa: F401 - the names __all__ exports
    from harness.backends.registry import ENTRY_POINT_GROUP, BackendInfo, Registry, load_registry, register  # noqa: F401

#: Each public name and the submodule that defines it.
_EXPORTS = {"Backend": "base", "Prepared": "base", "expand_kv": "base", "ENTRY_POINT_GROUP": "registry", "BackendInfo": "registry",
            "Registry": "registry", "load_registry": "registry", "register": "registry"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """`harness.backends.Backend` and the rest of `__all__`, from their submodules when first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'harness.backends' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.backends.{_EXPORTS[name]}"), name)
