"""Attention backends behind one interface, and the registry that lists them."""

from harness.backends.base import Backend, Prepared, expand_kv
from harness.backends.registry import ENTRY_POINT_GROUP, BackendInfo, Registry, load_registry, register

__all__ = ["Backend", "BackendInfo", "ENTRY_POINT_GROUP", "Prepared", "Registry", "expand_kv", "load_registry", "register"]
