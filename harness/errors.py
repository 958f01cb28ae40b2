"""Errors a user can cause, as opposed to bugs: the CLI prints them in one line and exits 2."""

from __future__ import annotations

import difflib
from typing import Iterable

#: The most close names an unknown name's refusal suggests.
MAX_SUGGESTIONS = 3


class UserError(ValueError):
    """A problem with what the user asked for; its message is one line that names it."""

    @classmethod
    def unknown(cls, kind: str, name: object, known: Iterable[str], listing: str) -> UserError:
        """`unknown KIND 'name' (did you mean 'x'?): LISTING`, suggesting the known names closest to `name` (difflib), if any is close.

        The one refusal of a mistyped backend, suite or model name; matched without case, since `SDPA` means `sdpa`.
        """
        by_lower = {str(k).lower(): str(k) for k in known}
        typed = str(name).strip().lower()
        close = [typed] if typed in by_lower else difflib.get_close_matches(typed, list(by_lower), n=MAX_SUGGESTIONS)
        named = [repr(by_lower[c]) for c in close]
        hint = f" (did you mean {', '.join(named[:-1])} or {named[-1]}?)" if len(named) > 1 else (f" (did you mean {named[0]}?)" if named else "")
        return cls(f"unknown {kind} {name!r}{hint}: {listing}")


class Unsupported(Exception):
    """A backend cannot serve a case; the message is the reason, in words a user understands."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, at most 300 characters of message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
