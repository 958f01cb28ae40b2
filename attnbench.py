"""The `attnbench` command's entry point, kept outside the `harness` package so that it can say when `harness` is not attnbench's.

`harness` is a generic name: another distribution may install a `harness/__init__.py` over attnbench's, or a folder
called harness/ may come first on the path (PYTHONPATH=. in a project that has one). Either would otherwise run
someone else's code or end in a traceback; here it is one line and exit status 2.
"""

from __future__ import annotations

import sys
from typing import Sequence


def foreign_harness() -> str | None:
    """Why the `harness` that imports is not attnbench's, in one line; None when it is."""
    try:
        import harness
    except Exception as exc:  # noqa: BLE001 - someone else's harness/__init__.py may raise anything
        return f"`import harness` fails ({type(exc).__name__}: {exc}): attnbench's package is missing or broken; reinstall attnbench"
    if getattr(harness, "DISTRIBUTION", None) == "attnbench":
        return None
    where = getattr(harness, "__file__", None) or ", ".join(getattr(harness, "__path__", [])) or "an unknown place"
    return (f"the `harness` package imported from {where} is not attnbench's (another distribution's, or a folder on the path "
            f"shadows it): remove it from PYTHONPATH or the working directory, or reinstall attnbench (pip install --force-reinstall)")


def main(argv: Sequence[str] | None = None) -> int:
    """The `attnbench` command: one line and exit 2 when `harness` is not attnbench's, else harness.cli.main.main."""
    problem = foreign_harness()
    if problem is not None:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return 2
    from harness.cli.main import main as cli_main

    return cli_main(None if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
