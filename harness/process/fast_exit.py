"""How attnbench's own processes end: as a normal exit looks from outside, without the teardown of torch's modules.

A normal interpreter exit waits for the threads still running, runs atexit's functions, flushes the files still open
and exits with the program's status. Then it tears down every module and collects the whole heap: with torch and
attnbench imported that is about 0.45 CPU-s of a fresh process (1.50 against 1.03 CPU-s for a bare import here), and in
a worker forked from a template it writes to ~100 MB of shared pages, each copied first (34,500 page faults against
7,500, 0.16 CPU-s a worker). The commands and jobs attnbench starts (`python -m harness`, `python -m harness.child`,
every worker forked from a template) end here instead: the same threads, functions, files and status, then os._exit.
A process forked from the command must end here in any case, since it runs inside the command's call stack
(harness.process.command_image). The installed `attnbench` script's own exit is the console script's, unchanged, and a
process that initialised CUDA exits as the interpreter does (`cuda_in_use`).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import signal
import sys
import threading
from typing import Callable, NoReturn


def end_process(run: Callable[[], int | None]) -> NoReturn:
    """Run `run`, then end this process with its status: `sys.exit(n)` ends it with n, KeyboardInterrupt as the
    interpreter ends on it (SIGINT), anything else it raises printed by sys.excepthook and ended with 1. A process that
    initialised CUDA takes the interpreter's own exit instead (`cuda_in_use`)."""
    status, interrupted = 1, False
    try:
        status = run() or 0
    except BaseException as exc:  # noqa: BLE001 - whatever ends the process, it must not unwind into the frames it was forked in
        if cuda_in_use():
            raise
        if isinstance(exc, SystemExit):
            status = exit_code(exc)
        else:
            sys.excepthook(type(exc), exc, exc.__traceback__)
            interrupted = isinstance(exc, KeyboardInterrupt)
    if cuda_in_use():
        sys.exit(status)
    exit_now(status, interrupted)


def cuda_in_use() -> bool:
    """Whether this process initialised CUDA. Then it ends as the interpreter ends it: CUDA's runtime, and the Nsight tools'
    libraries injected into a process they profile (`profile --ncu`), hand over what they hold in C exit handlers that
    os._exit skips (not verified on a GPU: the safe side). Never in a fork: CUDA workers start fresh, and the command forks
    itself only on the threads it had before anything ran."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support, or half torn down: no CUDA to hand anything over
        return False


def exit_code(exc: SystemExit) -> int:
    """The status a fresh interpreter exits with on `exc`: its code, 0 for None, else 1 with the code printed."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def exit_now(status: int, interrupted: bool = False) -> NoReturn:
    """What a normal exit does before its teardown, in its order: wait for the threads still running, run atexit's
    functions, flush every file still open (the standard streams last); then os._exit(status), or SIGINT's default
    action where a KeyboardInterrupt ended the program, as the interpreter does."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # the wait Py_FinalizeEx does first; private, stable since 3.4
        atexit._run_exitfuncs()
    finally:
        for stream in [*_open_files(), sys.stdout, sys.stderr]:
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status)


#: The file objects that buffer what is written: flushing a text file flushes its binary buffer too.
_BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def _open_files() -> list[io.IOBase]:
    """The buffered files this process opened and has not closed, standard streams aside. gc tracks them; a template froze
    what it had before it forked, so in a fork the walk covers what the fork made, not torch, nor the template's own
    files. By type, not isinstance: isinstance asks an unknown object for its __class__, and some of torch's warn."""
    standard = {id(sys.stdout), id(sys.stderr)}
    return [obj for obj in gc.get_objects() if issubclass(type(obj), _BUFFERED) and id(obj) not in standard and not obj.closed]
