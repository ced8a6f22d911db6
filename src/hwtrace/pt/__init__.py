"""The Intel PT wire format (no I/O).

- :mod:`hwtrace.pt.packets`   packet records (named tuples named like libipt)
- :mod:`hwtrace.pt.errors`    ``PtError(code, offset)``, libipt's error strings
- :mod:`hwtrace.pt.decoder`   ``PacketDecoder`` with libipt's verbs
- :mod:`hwtrace.pt.encoder`   ``encode(packet)`` and packet constructors
- :mod:`hwtrace.pt.lastip`    last-IP reconstruction
- :mod:`hwtrace.pt.timing`    TSC/MTC/TMA/CYC/CBR time tracking and calibration
- :mod:`hwtrace.pt.cpu`       ``F/M[/S]`` CPU ids and the errata they imply
- :mod:`hwtrace.pt.ptdump_format`  ptdump's text output

Packet scanning has a compiled core (``_c_packets.c``, built by
``pip install``) and a Python twin (``decoder.py``) that decode
identically; :mod:`hwtrace.pt._impl` picks one (``HWTRACE_NO_EXTENSIONS=1``
forces the twin) and :mod:`hwtrace._ext` documents the pattern.
"""

from hwtrace import _lazy_exports

# The re-exports are imported when first asked for: importing a submodule
# (hwtrace.pt.errors, .cpu) runs this file, and what needs only those
# (a command's option checks, the flow core's counts) starts faster
# without the packet decoder and the encoder.
_LAZY = {"PtError": "hwtrace.pt.errors", "PacketDecoder": "hwtrace.pt.decoder",
         "encode": "hwtrace.pt.encoder"}


__getattr__, __dir__ = _lazy_exports(_LAZY, globals())

__all__ = ["PtError", "PacketDecoder", "encode"]
