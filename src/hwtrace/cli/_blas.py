"""numpy without OpenBLAS's worker threads, for the command line.

Importing numpy loads OpenBLAS, which starts one worker thread per core
beyond the first; each spins, waiting for work, for a while before it
sleeps.  hwtrace does no linear algebra, so that spinning is all they do:
CPU time on every command that imports numpy (0.03-0.1 s of a view's
~1 s on a 2-core machine, more with more cores).  OpenBLAS reads
``OPENBLAS_NUM_THREADS`` once, when numpy loads it.

:func:`install` puts a finder first on ``sys.meta_path`` that, when numpy
is first imported, sets ``OPENBLAS_NUM_THREADS=1`` for the time numpy's
own import runs and then puts the environment back as it was -- so that
the programs hwtrace starts (``record``'s, the emulators) inherit the
user's environment, not ours.  A user's own ``OPENBLAS_NUM_THREADS`` is
left alone; commands that never import numpy pay nothing.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

VAR = "OPENBLAS_NUM_THREADS"


class _Loader:
    """numpy's own loader, its module executed with one BLAS thread."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        os.environ[VAR] = "1"
        try:
            self.loader.exec_module(module)
        finally:
            os.environ.pop(VAR, None)

    def __getattr__(self, name):        # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


class _Finder:
    """Finds numpy once (through the path finder), with :class:`_Loader`."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "numpy":
            return None
        uninstall()
        if VAR in os.environ:
            return None                 # the user's choice: the usual import
        spec = PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None \
                and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Before numpy's first import (else nothing: it is loaded)."""
    if "numpy" not in sys.modules and _Finder not in sys.meta_path:
        sys.meta_path.insert(0, _Finder)


def uninstall() -> None:
    try:
        sys.meta_path.remove(_Finder)
    except ValueError:
        pass
