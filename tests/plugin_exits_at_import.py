"""Test-only plugin module that calls sys.exit() at import, with the code ATTNBENCH_TEST_EXIT says ("none", an integer, or text)."""

import os
import sys

_code = os.environ.get("ATTNBENCH_TEST_EXIT", "none")
sys.exit(None if _code == "none" else int(_code) if _code.lstrip("-").isdigit() else _code)


def add(registry) -> None:  # never reached
    """Unreachable: the module exits first."""
