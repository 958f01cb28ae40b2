"""How a process forked from one that imported torch ends: as a fresh interpreter's exit looks from outside, without
tearing down the modules it inherited.

A fresh interpreter's exit runs atexit's functions, flushes its open files and exits with the job's status. It also
tears down every module, torch's included: in a fork that walk writes to ~100 MB of pages it shares with its
template, each copied before it is written (34,500 page faults against 7,500, 0.16 CPU-s more per worker on the
2-core machine). A fork ends here instead: the same functions, files and status, then os._exit. A worker forked from
the command must end here in any case, since it runs inside the command's call stack (harness.process.command_image).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import traceback
from typing import Callable, NoReturn


def end_fork(run: Callable[[], int]) -> NoReturn:
    """Run `run` in a forked process, then end the process with its status: `sys.exit(n)` ends it with n, and anything
    else it raises prints its traceback and ends it with 1, as in a fresh interpreter."""
    status = 1
    try:
        status = run()
    except SystemExit as exc:
        status = exit_code(exc)
    except BaseException:  # noqa: BLE001 - whatever ends the fork, it must not unwind into the frames it was forked in
        traceback.print_exc()
    exit_forked(status)


def exit_code(exc: SystemExit) -> int:
    """The status a fresh interpreter exits with on `exc`: its code, 0 for None, else 1 with the code printed."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def exit_forked(status: int) -> NoReturn:
    """atexit's functions, as a normal exit runs them; then every file still open for writing flushed, the standard streams
    last, as a normal exit's teardown flushes them; then os._exit(status)."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in [*_open_writers(), sys.stdout, sys.stderr]:
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(status)


def _open_writers() -> list[io.IOBase]:
    """The files this process opened and has not closed, standard streams aside. gc tracks them; the template froze what it
    had before it forked, so the walk covers what the fork made, not torch."""
    standard = {id(sys.stdout), id(sys.stderr)}
    return [obj for obj in gc.get_objects() if isinstance(obj, io.IOBase) and id(obj) not in standard and not obj.closed]
