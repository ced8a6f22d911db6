"""Which column assembler runs: the compiled core or the Python twin.

:meth:`hwtrace.export.textcols.Lines.render`, ``.text`` and
``.lengths``, the Perfetto and Chrome writers' slice encoders and the
folded writer's stacks look :data:`CORE` up: the extension module ``hwtrace.export._c_textcols``
(source ``_c_textcols.c`` next to this file and ``core/``), or ``None`` for the Python
twin (the byte matrix and its mask) -- see :mod:`hwtrace._ext` for the
selection rules (``HWTRACE_NO_EXTENSIONS=1``,
``HWTRACE_REQUIRE_EXTENSIONS=1``).
"""

from __future__ import annotations

from hwtrace import _ext

NAME = "hwtrace.export._c_textcols"
ABI = 5

#: how the selection went (see hwtrace._ext.Status).
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use by default, or None (the Python twin).
CORE = STATUS.module


def core_for(impl: str | None):
    """The core for ``impl``: None -> the default (:data:`CORE`),
    ``"python"`` -> None, ``"compiled"`` -> the extension module."""
    return _ext.core_for(impl, CORE, NAME, ABI, "column assembler")
