"""The one rule every command that writes follows for where it writes (report, compare, stability, export, site, the database).

An output is never written into a run folder (nor one inside it), never over a file or folder that is not attnbench's own of
the same kind (unless the user says --force, for a single file), never through a symbolic link; a path that cannot be written
is one line. Files are written beside their target and renamed over it (`harness.results.store.write_file`); a folder is
built beside its target and renamed into place (`replace_folder`), so no reader ever sees half of one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from harness.errors import UserError
from harness.results.store import resolved, run_folder_of


def refuse_in_run_folder(out: Path, target: Path, what: str, flag: str = "--out") -> None:
    """UserError when `target` (resolved) is, or lies inside, a run folder: results are never written into a run."""
    held = run_folder_of(target)
    if held is not None:
        raise UserError(f"{flag} {out} is inside the run folder {held}: {what} is never written into a run; give a path outside it")


def check_output_file(out: Path, what: str, kind: str, ours: Callable[[Path], bool] | None = None, *, force: bool = False,
                      flag: str = "--out") -> Path:
    """Refuse (UserError) a path for `what` ("a comparison") in a run folder, not a plain file, or over an existing file that is
    not ours (`ours` says which non-empty files are; without it, any existing file needs `force`); return it resolved."""
    target = resolved(out, flag)
    if target.is_dir():
        raise UserError(f"{flag} {out} is a folder: give the path of the {kind} file to write")
    refuse_in_run_folder(out, target.parent, what, flag)
    if out.is_symlink() or (target.exists() and not target.is_file()):
        raise UserError(f"{flag} {out} is not a plain file: give the path of the {kind} file to write")
    if target.exists() and not force:
        if ours is None:
            raise UserError(f"{flag} {out} exists: give another path, or --force to replace it")
        if target.stat().st_size and not ours(target):
            raise UserError(f"{flag} {out} exists and is not {what} attnbench wrote: give another path, or remove it first")
    return target


def check_output_folder(out: Path, what: str, ours: Callable[[Path], bool], flag: str = "--out") -> Path:
    """Refuse (UserError) a folder for `what` ("a site") that is or lies in a run folder, is not a plain folder, or holds anything
    but an earlier one `ours` recognises (a user's files, a checkout); return it resolved."""
    target = resolved(out, flag)
    refuse_in_run_folder(out, target, what, flag)
    if out.is_symlink() or (target.exists() and not target.is_dir()):
        raise UserError(f"{flag} {out} is not a plain folder: give the folder to write {what} into")
    try:
        foreign = target.exists() and any(target.iterdir()) and not ours(target)
    except OSError as exc:  # a folder this user cannot list is no place to write either
        raise UserError(f"cannot use {flag} {out}: {exc.strerror or exc}") from None
    if foreign:
        raise UserError(f"{flag} {out} exists and is not {what} attnbench wrote: give a new or empty folder, or remove it first")
    return target


def page_title_is(index: Path, title: str) -> bool:
    """Whether `index` is a plain file whose HTML title starts with `title` (how attnbench tells its own pages)."""
    if index.is_symlink() or not index.is_file():
        return False
    with open(index, "rb") as f:
        return f"<title>{title}".encode() in f.read(4096)


@contextlib.contextmanager
def replace_folder(target: Path, flag: str = "--out") -> Iterator[Path]:
    """A new folder beside `target` to fill; on success it takes `target`'s place (an earlier one is removed after), on any error it
    is removed and `target` is left as it was."""
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.", suffix=".new", dir=parent))
    except OSError as exc:
        raise UserError(f"cannot write {flag} {target}: {exc.strerror or exc}") from None
    try:
        yield building
        os.chmod(building, 0o755)
        aside = None
        if target.exists():  # an earlier one: moved aside (one rename), so the new one can take its name (another)
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.", suffix=".old", dir=parent))
            os.replace(target, aside / target.name)
        try:
            os.replace(building, target)
        except OSError:
            if aside is not None:
                os.replace(aside / target.name, target)
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise UserError(f"cannot write {flag} {target}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
