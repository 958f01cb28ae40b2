"""What differs between the Pythons attnbench supports, 3.10 and later (pyproject's requires-python).

TOML is read by the standard library's `tomllib` from 3.11 on; on 3.10 by `tomli`, the package it came from (the same
API: `loads`, `load`, `TOMLDecodeError`), which pyproject requires there. tests/test_python_floor.py keeps the rest of
the code inside 3.10's syntax and standard library.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Ubuntu 22.04's Python
    import tomli as tomllib

__all__ = ["tomllib"]
