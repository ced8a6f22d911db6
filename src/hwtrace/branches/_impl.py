"""Which branch-record formatter runs: the compiled core or the Python twin.

:func:`hwtrace.branches.format.format_chunk` looks :data:`CORE` up for
each chunk of JSON lines.  ``CORE`` is the extension module
``hwtrace.branches._c_format`` (source ``_c_format.c`` next to this file),
or ``None`` for the Python twin (``format._jsonl_fast``'s %-formatting) --
see :mod:`hwtrace._ext` for the selection rules
(``HWTRACE_NO_EXTENSIONS=1``, ``HWTRACE_REQUIRE_EXTENSIONS=1``).
"""

from __future__ import annotations

from hwtrace import _ext

NAME = "hwtrace.branches._c_format"
ABI = 6

#: how the selection went (see hwtrace._ext.Status).
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use by default, or None (the Python twin).
CORE = STATUS.module


def core_for(impl: str | None):
    """The core for ``impl``: None -> the default (:data:`CORE`),
    ``"python"`` -> None, ``"compiled"`` -> the extension module."""
    return _ext.core_for(impl, CORE, NAME, ABI, "branch formatter")
