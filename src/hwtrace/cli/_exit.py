"""Leaving the process without the interpreter's shutdown, where that
shutdown has nothing left to do that anyone could see.

When ``hwtrace`` (the script, ``python -m hwtrace``) has run a command,
the interpreter exits: it flushes the standard streams, runs the atexit
callbacks, waits for other threads, and then tears down every module it
imported -- for ``coverage --edges`` on a small trace ~2-3 ms of a
~40 ms command (CPU), the objects of the start-up freed one by one only
for the process to end.  A command whose work leaves nothing to finalize
(every file it writes closed by ``with``; no object whose ``__del__``
does something outside the process) says so by its parser's default
``quick_exit=True``; after it returns, :func:`leave` flushes the
standard streams itself and ends the process with the command's status
-- unless a flush fails (the interpreter's own exit then reports it as
usual), an atexit callback is registered (logging, multiprocessing,
weakref.finalize, tempfile's cleanups and the like register one when
first used) or another thread is alive: then it returns and the
interpreter exits as it always did.  Only the process's own command line
does this (``main()`` with no arguments): a test or a caller of
``main(argv)`` goes on running.
"""

from __future__ import annotations

import os
import sys


def leave(status: int) -> None:
    """End the process now with ``status`` if nothing is left for the
    interpreter's shutdown to do (see the module docstring); else
    return."""
    import atexit       # built in: nothing to load

    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    try:
        for f in streams:
            if f is not None:
                f.flush()
    except Exception:
        return
    if atexit._ncallbacks():
        return
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return
    os._exit(status)
