"""What a backend declares about itself, and the defaults an undeclared backend has: torch-free, for the readers of rows.

The analysis and the report read each row's capabilities (from the manifest, else these defaults) without
importing torch: reading a run's rows needs no tensor library.
"""

from __future__ import annotations

#: The capability attributes a backend declares (and a run's manifest records per backend), with the value a
#: backend that does not declare one has (`harness.backends.base.Backend` takes its class defaults from here).
CAPABILITY_DEFAULTS: dict[str, bool] = {
    "computes_attention": True,
    "attention_core": True,
    "materializes_scores": False,
    "baseline": False,
    "returns_weights": False,
}
CAPABILITIES = tuple(CAPABILITY_DEFAULTS)
