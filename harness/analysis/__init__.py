"""From measured rows to answers: the analysis frame, scaling fits, the S² crossover, winners and recommend, run comparison.

`from harness import analysis` gives the whole public API; each part lives in its own module. The API is imported on
first use (PEP 562), so that importing one light submodule (the CLI's parser reads `gate` and `difference` for their
defaults) does not import pandas: a quarter of a second of every `attnbench` start, the runs' included.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: Each public name, by the submodule that defines it.
_SOURCES = {
    "crossover": ("Crossing", "crossovers", "find_crossing"),
    "fits": ("Fit", "fit_power_law", "memory_model", "memory_vs_model", "scaling_fits"),
    "frame": ("GROUP_FIELDS", "MIN_FIT_POINTS", "RunData", "agreeing_rows", "declared_capabilities", "derive_columns",
              "describe_group", "group_key_columns", "groups", "is_core", "load", "ok_rows", "trusted_rows", "with_roofline"),
    "recommend": ("Answer", "Recommendation", "model_shape", "recommend", "recommend_model"),
    "trust": ("LeftOut", "left_out", "trusted"),
    "winners": ("default_baseline", "speedups", "winner_map", "winners"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [name for names in _SOURCES.values() for name in names]


def __getattr__(name: str) -> Any:
    """A public name, imported from its submodule when first asked for, then kept here."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API beside the module's own names."""
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package, whose public functions `recommend` and `winners` are never replaced by their same-named submodules."""

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing harness.analysis.winners binds the submodule on the package; the function of that name must stay
        # what `analysis.winners` is, as it was when the API was imported eagerly (the function bound after its module).
        if name in _MODULE_OF and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
