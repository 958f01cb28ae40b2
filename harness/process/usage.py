"""The one-line usage error: a parser whose mistakes are UserErrors, and the exit status of a command's body (2 for a mistake).

Shared by the `attnbench` command and `python -m harness.child`, so both say a user's mistake the same way.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from harness.errors import UserError

#: The exit status of a user's mistake (a bad option, an unknown name): one line on stderr, no traceback.
EXIT_USAGE = 2


class UsageParser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other user mistake."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


def exit_status(command: Callable[[], int], prog: str = "attnbench") -> int:
    """Run a command's body: its exit status, or 2 with one line for a user mistake (130 on Ctrl-C)."""
    try:
        return command()
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
