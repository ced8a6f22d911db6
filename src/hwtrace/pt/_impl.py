"""Which packet scanner runs: the compiled core or the Python twin.

:class:`hwtrace.pt.decoder.PacketDecoder` looks :data:`CORE` up when it is
created (``PacketDecoder(..., impl="python"|"compiled")`` overrides it).
``CORE`` is the extension module ``hwtrace.pt._c_packets`` (source
``_c_packets.c`` next to this file), or ``None`` for the Python twin in
``decoder.py`` -- see :mod:`hwtrace._ext` for the selection rules
(``HWTRACE_NO_EXTENSIONS=1``, ``HWTRACE_REQUIRE_EXTENSIONS=1``) and the
pattern other compiled cores follow.
"""

from __future__ import annotations

from hwtrace import _ext

NAME = "hwtrace.pt._c_packets"
ABI = 2

#: how the selection went (see hwtrace._ext.Status).
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use by default, or None (the Python twin).
CORE = STATUS.module


def core_for(impl: str | None):
    """The core for ``impl``: None -> the default (:data:`CORE`),
    ``"python"`` -> None, ``"compiled"`` -> the extension module (even with
    ``HWTRACE_NO_EXTENSIONS=1``; RuntimeError if it is unusable)."""
    return _ext.core_for(impl, CORE, NAME, ABI, "packet scanner")


def flags(core, errata, disabled) -> int:
    """The compiled core's flag word for these errata and disabled
    packet types (only cfe, evd and trig can be disabled)."""
    f = 0
    if errata.skd007:
        f |= core.FLAG_SKD007
    if errata.skz84:
        f |= core.FLAG_SKZ84
    if "cfe" in disabled:
        f |= core.FLAG_NO_CFE
    if "evd" in disabled:
        f |= core.FLAG_NO_EVD
    if "trig" in disabled:
        f |= core.FLAG_NO_TRIG
    return f
