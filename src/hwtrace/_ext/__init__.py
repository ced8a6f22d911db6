"""Compiled cores and their Python twins: how hwtrace picks one.

hwtrace's hot loops exist twice: a pure-Python *twin* (the reference,
readable, used for debugging and where no C compiler exists) and a
*compiled core* (a C extension built by ``pip install``).  Both produce the
same values; tests run both.  This module decides which one runs.

The pattern (used by :mod:`hwtrace.pt._impl` for packet scanning; follow it
for the flow decoder, the PT generator, ...):

1. **Source.**  Write ``src/hwtrace/<pkg>/_c_<name>.c`` (Python C API, no
   other dependencies; plain-C parts in ``*.h`` headers beside it, e.g.
   ``hwtrace/pt/_pt_packets.h``, the packet scanner any core can include).
   ``setup.py`` builds every file matching ``src/hwtrace/**/_c_*.c`` as
   the extension ``hwtrace.<pkg>._c_<name>`` -- nothing to register.  The
   module defines the int constant ``ABI`` (bump it when the
   Python-facing interface changes) and the string ``SOURCE_SHA256`` from
   the macro ``HWTRACE_SOURCE_SHA256``, which setup.py sets to a SHA-256
   over every file the build reads (:mod:`hwtrace._ext.sources`: the
   ``.c``, a ``core/`` directory of further ``.c`` files beside it, their
   headers and what they include): a build older than its sources is
   refused as stale instead of silently running old code.
   Keep the boundary narrow: plain functions over ``bytes`` and ints that
   return the twin's own record types (import them from the Python package
   at module init), so that callers cannot tell the two apart.

2. **Selector.**  Next to the twin, a small ``_impl.py`` does::

       from hwtrace import _ext
       STATUS = _ext.select("hwtrace.pt._c_packets", abi=1)
       CORE = STATUS.module          # None: use the Python twin

   and the public class looks ``_impl.CORE`` up when an object is created
   (an ``impl="python"|"compiled"`` argument overrides it; tests monkeypatch
   ``_impl.CORE`` to run code paths that construct objects internally,
   such as the CLI, under either implementation).

3. **Tests** (``tests/test_<pkg>_compiled*.py``): compare both
   implementations on the same inputs, and call :func:`Status.check` (or
   assert ``not status.expected or status.loaded``) so that a test FAILS
   where the compiled core should have loaded and did not.

Environment (read when the selector module is imported):

- ``HWTRACE_NO_EXTENSIONS=1``: use the Python twins (the compiled module is
  not even imported by :func:`select`; :func:`probe` still finds it, for
  tests that compare both).
- ``HWTRACE_REQUIRE_EXTENSIONS=1``: a compiled core is *expected*; at build
  time a compile failure fails the build (otherwise it only warns and the
  install goes on with the twins); at test time a core that did not load
  fails the tests.  CI sets it.

A core is also expected when its extension file is present (the install
built it): if it then fails to import, has the wrong ABI or is stale, the
twin runs (the package stays usable), ``Status.reason`` says why and
:func:`select` says so on stderr (one line: never a silent fallback).
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.machinery import PathFinder
from collections import namedtuple
from types import ModuleType

NO_EXTENSIONS = "HWTRACE_NO_EXTENSIONS"
REQUIRE_EXTENSIONS = "HWTRACE_REQUIRE_EXTENSIONS"


def _env_flag(name: str, environ=None) -> bool:
    v = (os.environ if environ is None else environ).get(name, "")
    return v.strip().lower() not in ("", "0", "no", "false", "off")


def extensions_disabled(environ=None) -> bool:
    return _env_flag(NO_EXTENSIONS, environ)


def extensions_required(environ=None) -> bool:
    return _env_flag(REQUIRE_EXTENSIONS, environ)


class Status(namedtuple("Status", "name module built required disabled "
                       "reason", defaults=("",))):
    """What became of one compiled core.

    ``module``: the extension module if it is usable (``None``: the twin
    runs).  ``built``: an extension file for it exists.  ``required``:
    ``HWTRACE_REQUIRE_EXTENSIONS`` was set.  ``disabled``:
    ``HWTRACE_NO_EXTENSIONS`` was set.  ``reason``: why ``module`` is None
    (empty when it loaded).  (A NamedTuple: every command creates one at
    start-up, where a frozen dataclass costs ~1-2 ms.)
    """

    __slots__ = ()

    @property
    def loaded(self) -> bool:
        return self.module is not None

    @property
    def expected(self) -> bool:
        """Whether the compiled core should be usable here."""
        return self.required or self.built

    def describe(self) -> str:
        if self.loaded:
            return f"{self.name}: compiled ({self.module.__file__})"
        return f"{self.name}: python twin ({self.reason})"

    def check(self) -> None:
        """Raise RuntimeError if the core was expected and is unusable
        (the disabling switch aside).  For tests."""
        if self.expected and not self.loaded and not self.disabled:
            why = (f"{REQUIRE_EXTENSIONS}=1" if self.required
                   else "its extension file is installed")
            raise RuntimeError(f"compiled core {self.name} expected ({why}) "
                               f"but unusable: {self.reason}")


def _built(name: str) -> bool:
    """Whether an extension file for module ``name`` exists (its package
    is imported to find out, the module itself is not): looked for where
    the import system looks for a package's modules, on the package's
    ``__path__`` (importlib.machinery's PathFinder, as
    importlib.util.find_spec does through sys.meta_path; importlib.util
    is an import of its own at every command's start-up, which the
    ``hwtrace`` script otherwise has no use for)."""
    module = sys.modules.get(name)
    if module is not None:
        spec = getattr(module, "__spec__", None)
    else:
        package, _, _ = name.rpartition(".")
        try:
            path = importlib.import_module(package).__path__ if package \
                else None
            spec = PathFinder.find_spec(name, path)
        except (ImportError, AttributeError, ValueError):
            return False
    return spec is not None and spec.origin is not None and \
        not spec.origin.endswith(".py")


def _source_sha256(module: ModuleType, built: str = "") -> str | None:
    """The fingerprint of the C sources installed next to the extension
    (as setup.py computes it: :func:`hwtrace._ext.sources.fingerprint`),
    if the main source is there.  ``built``: the one the extension was
    built with; the build's stamp beside it stands for the sources while
    they are unchanged since (:func:`hwtrace._ext.sources.stamped_fingerprint`:
    no need to read and hash them), else they are hashed."""
    from . import sources
    src = os.path.join(os.path.dirname(module.__file__),
                       module.__name__.rpartition(".")[2] + ".c")
    if built:
        try:
            with open(sources.stamp_file(src)) as f:
                text = f.read()
        except (OSError, ValueError):
            text = ""
        if text and sources.stamped_fingerprint(src, text) == built:
            return built
    try:
        return sources.fingerprint(src)
    except OSError:
        return None


def probe(name: str, abi: int, environ=None) -> Status:
    """Import the compiled core ``name`` regardless of
    ``HWTRACE_NO_EXTENSIONS`` and check its ABI and freshness."""
    required = extensions_required(environ)
    disabled = extensions_disabled(environ)
    built = _built(name)

    def status(module, why):
        return Status(name, module, built, required, disabled, why)

    if not built:
        return status(None, "not built (no C compiler at install time?)")
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        return status(None, f"import failed: {e}")
    got = getattr(module, "ABI", None)
    if got != abi:
        return status(None, f"ABI {got}, expected {abi}: rebuild "
                            "(pip install -e . or pip install .)")
    want = getattr(module, "SOURCE_SHA256", "")
    have = _source_sha256(module, want)
    if have is not None and want != have:
        return status(None, "stale build (its C source changed since): "
                            "rebuild (pip install -e . or pip install .)")
    return status(module, "")


def select(name: str, abi: int, environ=None, warn=None) -> Status:
    """The compiled core ``name`` if it is to be used, honouring
    ``HWTRACE_NO_EXTENSIONS`` (then the module is not imported).

    A core that was built but is unusable here (stale, wrong ABI, failed
    import) is not a quiet fallback: the twin runs, many times slower, so
    one line on stderr says which core and why (``warn``: where the line
    goes, default stderr)."""
    if extensions_disabled(environ):
        return Status(name, None, _built(name), extensions_required(environ),
                      True, f"disabled by {NO_EXTENSIONS}=1")
    st = probe(name, abi, environ)
    if st.expected and not st.loaded:
        line = (f"hwtrace: warning: compiled core {name} unusable "
                f"({st.reason}); running its Python twin, which is "
                f"much slower\n")
        (warn or sys.stderr.write)(line)
    return st


def core_for(impl: str | None, default, name: str, abi: int, what: str):
    """The core a caller asked for: ``impl`` None -> ``default`` (the
    selector's choice), ``"python"`` -> None (the twin), ``"compiled"`` ->
    the extension module even with ``HWTRACE_NO_EXTENSIONS=1``
    (RuntimeError naming ``what`` if it is unusable)."""
    if impl is None:
        return default
    if impl == "python":
        return None
    if impl == "compiled":
        if default is not None:
            return default
        st = probe(name, abi)
        if st.module is None:
            raise RuntimeError(f"compiled {what} unavailable: {st.reason}")
        return st.module
    raise ValueError(f"impl must be None, 'python' or 'compiled': {impl!r}")
