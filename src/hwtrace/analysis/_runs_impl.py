"""Which call-stack matcher runs: the compiled core or the Python twin.

:func:`hwtrace.analysis.runs.solve` looks :data:`CORE` up: the extension
module ``hwtrace.analysis._c_runs`` (source ``_c_runs.c`` next to this
file: one walk over a run's transfers), or ``None`` for the Python twin
(:func:`~hwtrace.analysis.runs.match`, numpy over all transfers at once)
-- see :mod:`hwtrace._ext` for the selection rules
(``HWTRACE_NO_EXTENSIONS=1``, ``HWTRACE_REQUIRE_EXTENSIONS=1``).  The
rows' per-row work after the matching (``core/rows.c``: runs.commit,
clock.TimeBase.times, rows.Pending, profile.Profile._outermost,
blockcols.columns, branches.calls' head table) looks the same
:data:`CORE` up, each with its numpy twin, and so do the call-path table
and the folded writer's weights (``core/keys.c``: slices.KeyIndex; their
twins sort).
"""

from __future__ import annotations

from hwtrace import _ext

NAME = "hwtrace.analysis._c_runs"
ABI = 9

#: how the selection went (see hwtrace._ext.Status).
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use by default, or None (the Python twin).
CORE = STATUS.module


def core_for(impl: str | None):
    """The core for ``impl``: None -> the default (:data:`CORE`),
    ``"python"`` -> None, ``"compiled"`` -> the extension module."""
    return _ext.core_for(impl, CORE, NAME, ABI, "call-stack matcher")
