"""The cyclic garbage collector, out of a view's way.

A view (summary, calls, export, branches) makes millions of short-lived
container objects -- tuples of items, frames, rows -- while the objects it
keeps for the whole command (numpy's modules, the symbol tables, the
input) number hundreds of thousands.  With the default thresholds the
collector runs every 700 allocations and, now and then, goes over all of
them: ~6% of a view's CPU time on a syscall-heavy recording.

Inside :func:`command` (the command line's ``main``) :func:`settle`, called
once the input is open, moves every object alive then into the permanent
generation (``gc.freeze``: never scanned again; still freed by reference
counting) and collects the young generation less often.  Cycles are still
collected.  Outside a command (the library, tests calling a view's code
directly) :func:`settle` does nothing; when the command ends, the
collector is as it was.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

#: young-generation threshold while a command runs (the default is 700)
THRESHOLD = (50_000, 20, 20)

_active = 0


@contextmanager
def command():
    """While a command runs: :func:`settle` takes effect."""
    global _active
    _active += 1
    old = gc.get_threshold()
    try:
        yield
    finally:
        _active -= 1
        if not _active:
            gc.set_threshold(*old)
            gc.unfreeze()


def settle() -> None:
    """What is alive now lives until the command ends: out of the
    collector's scans; collect less often from here on."""
    if _active:
        gc.freeze()
        gc.set_threshold(*THRESHOLD)
