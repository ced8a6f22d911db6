"""The cyclic garbage collector, out of a view's way.

A view (summary, calls, export, branches) makes millions of short-lived
container objects -- tuples of items, frames, rows -- while the objects it
keeps for the whole command (numpy's modules, the symbol tables, the
input) number hundreds of thousands.  With the default thresholds the
collector runs every 700 allocations and, now and then, goes over all of
them: ~6% of a view's CPU time on a syscall-heavy recording.

Inside :func:`command` (the command line's ``main``) what is alive when
the command starts -- the modules imported so far, the interpreter's and
the command line's -- is moved into the permanent generation
(``gc.freeze``: never scanned again; still freed by reference counting),
and :func:`settle`, called once the input is open, does the same with
every object alive then and collects the young generation less often.
Cycles made by the command are still collected.  Outside a command (the
library, tests calling a view's code directly) :func:`settle` does
nothing; when the command ends, the collector is as it was -- unless the
command is the process's own (``main()`` with the process's command line,
as the ``hwtrace`` script and ``python -m hwtrace`` call it), after which
the interpreter exits: then everything alive stays frozen, and the
interpreter's shutdown collections (a full one, then one after each step
of tearing the modules down) skip it.  They went over every object of the
start-up again: ~4 ms of a small trace's ``coverage --edges`` (~0.05 s
in all), a scan of the whole input after a view.  Objects are still freed
at exit as before, by reference counting as the modules are cleared;
only reference cycles alive at the end are left to the process's end
(their memory; hwtrace's files are closed by ``with``, not by the
collector).
"""

from __future__ import annotations

import gc

#: young-generation threshold while a command runs (the default is 700)
THRESHOLD = (50_000, 20, 20)

_active = 0


class command:
    """While a command runs (``with command(program):``): what is alive
    at its start is frozen and :func:`settle` takes effect; after it, the
    collector is as it was, unless ``program`` (the process exits after
    the command): then what is alive stays frozen, out of the shutdown's
    collections.  (A class, not contextlib.contextmanager: contextlib is
    an import of its own, ~3 M instructions of the ``hwtrace`` script's
    start-up, which imports nothing else of it.)"""

    def __init__(self, program: bool = False):
        self.program = program
        self.old = None

    def __enter__(self):
        global _active
        _active += 1
        self.old = gc.get_threshold()
        gc.freeze()
        return None

    def __exit__(self, *exc) -> bool:
        global _active
        _active -= 1
        if self.program:
            gc.freeze()
        elif not _active:
            gc.set_threshold(*self.old)
            gc.unfreeze()
        return False


def in_command() -> bool:
    """Whether a command runs (inside :class:`command`)."""
    return bool(_active)


def settle() -> None:
    """What is alive now lives until the command ends: out of the
    collector's scans; collect less often from here on."""
    if _active:
        gc.freeze()
        gc.set_threshold(*THRESHOLD)
