"""Errors a user can cause, as opposed to bugs: the CLI prints them in one line and exits 2."""


class UserError(ValueError):
    """A problem with what the user asked for; its message is one line that names it."""


class Unsupported(Exception):
    """A backend cannot serve a case; the message is the reason, in words a user understands."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, at most 300 characters of message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
