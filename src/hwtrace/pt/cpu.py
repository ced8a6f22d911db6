"""CPU identification and the Intel PT errata that depend on it.

``Cpu.parse("6/78")`` parses ptdump's/ptxed's ``--cpu F/M[/S]`` syntax
(numbers in C syntax: decimal, 0x hex, 0 octal).  :func:`errata` returns the
:class:`Errata` flags libipt would enable for that CPU, or a PtError
("unknown cpu") for a CPU it has no table entry for -- in that case no
workaround is enabled, like libipt.

The erratum names are Intel's specification-update identifiers (libipt's
``struct pt_errata`` members):

- bdm70  PSB+ may contain FUP/TIP.PGE after a TIP.PGD (flow decoder)
- bdm64  TSX aborts may leave a wrong IP (flow decoder)
- skd007 an OVF may be split by a CYC: a 2-byte CYC whose second byte looks
         like an ext opcode, followed by 0xf3, decodes as OVF (packet layer)
- skd022 VM entry may cause a spurious disable (flow decoder)
- skd010 PSB+ after a mode change may report wrong state (flow decoder)
- skl014 TIP.PGD/FUP missing on filtered far branches (flow decoder)
- apl12  extra TIP.PGE/FUP after PSB (flow decoder)
- apl11  a spurious TIP.PGD after an OVF (flow decoder)
- skl168 MTC/CYC timing may be wrong around PSB (timing)
- skz84  VMX TSC scaling corrupts TMA: a TMA with reserved bits set decodes
         as an 8-byte invalid packet (packet layer)
"""

from __future__ import annotations

from collections import namedtuple

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError

# Cpu and Errata are small immutable records, NamedTuples: on every
# command's start-up path, where a frozen dataclass costs ~1-2 ms each to
# create (and importing dataclasses ~10 ms).


class Cpu(namedtuple("Cpu", "family model stepping vendor",
                     defaults=(0, "intel"))):
    """A CPU by family, model, stepping (and vendor)."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> "Cpu | None":
        """Parse ``F/M[/S]``; ``None`` for ``"none"``.  Raises ValueError
        for malformed text (a user error, not trace data)."""
        if text == "none":
            return None
        parts = text.split("/")
        if len(parts) not in (2, 3):
            raise ValueError(f"cpu must be specified as f/m[/s]: {text!r}")
        try:
            nums = [int(p, 0) if not (len(p) > 1 and p[0] == "0" and
                                      p[1].isdigit()) else int(p, 8)
                    for p in parts]
        except ValueError:
            raise ValueError(f"cpu must be specified as f/m[/s]: {text!r}") \
                from None
        limits = (0xffff, 0xff, 0xff)
        if any(not 0 <= n <= lim for n, lim in zip(nums, limits)):
            raise ValueError(f"cpu must be specified as f/m[/s]: {text!r}")
        return cls(*nums)

    def __str__(self) -> str:
        return f"{self.family}/{self.model}/{self.stepping}"


class Errata(namedtuple("Errata", "bdm70 bdm64 skd007 skd022 skd010 skl014 "
                         "apl12 apl11 skl168 skz84", defaults=(False,) * 10)):
    """Which erratum workarounds are on (the one class of them: the packet
    decoder's and the flow decoders' config), each a bool (default
    False); ``_replace`` makes a changed copy.  The field order is the
    compiled flow core's errata bit order (hwtrace.flow.config.ERRATA)."""

    __slots__ = ()

    def names(self) -> list[str]:
        return [n for n, on in zip(self._fields, self) if on]


NO_ERRATA = Errata()

# family -> model -> errata enabled.  Groups of models share a core design.
_BDW = ("bdm70", "bdm64")
_SKL = ("bdm70", "skd007", "skd022", "skd010", "skl014", "skl168")
_SKX = ("bdm70", "skl014", "skd022", "skz84")
_ICL = ("bdm70", "skl014", "skd022")
_ADL = ("bdm70", "skd022", "apl11")
_APL = ("apl12", "apl11")
_GLM = ("apl11",)
_SRV = ("bdm70", "skd022", "skz84")
_TABLE: dict[int, dict[int, tuple[str, ...]]] = {
    6: {
        0x3d: _BDW, 0x47: _BDW, 0x4f: _BDW, 0x56: _BDW,
        0x4e: _SKL, 0x5e: _SKL, 0x8e: _SKL, 0x9e: _SKL, 0xa5: _SKL,
        0xa6: _SKL,
        0x55: _SKX, 0x6a: _SKX, 0x6c: _SKX,
        0x66: _ICL, 0x7d: _ICL, 0x7e: _ICL, 0x8c: _ICL, 0x8d: _ICL,
        0xa7: _ICL, 0xa8: _ICL,
        0x8f: _SRV, 0xad: _SRV, 0xae: _SRV, 0xcf: _SRV,
        0x97: _ADL, 0x9a: _ADL, 0xaa: _ADL, 0xac: _ADL, 0xb5: _ADL,
        0xb7: _ADL, 0xba: _ADL, 0xbd: _ADL, 0xbf: _ADL, 0xc5: _ADL,
        0xc6: _ADL, 0xcc: _ADL, 0xd5: _ADL,
        0x5c: _APL, 0x5f: _APL,
        0x7a: _GLM, 0x86: _GLM, 0x96: _GLM, 0x9c: _GLM, 0xaf: _GLM,
        0xb6: _GLM, 0xdd: _GLM,
    },
    0x12: {0x01: _ADL, 0x03: _ADL},
    0x13: {0x01: _SRV},
}


def errata(cpu: Cpu | None):
    """The errata workarounds for ``cpu``: an :class:`Errata`, or a PtError
    ("unknown cpu") for a CPU not in the table (``None``: no errata)."""
    if cpu is None:
        return NO_ERRATA
    if cpu.vendor != "intel":
        return PtError(E.BAD_CPU, 0)
    names = _TABLE.get(cpu.family, {}).get(cpu.model)
    if names is None:
        return PtError(E.BAD_CPU, 0)
    return Errata(**{n: True for n in names})


def as_cpu(cpu) -> Cpu | None:
    """Accept a Cpu, ``"F/M[/S]"`` text or None."""
    if cpu is None or isinstance(cpu, Cpu):
        return cpu
    return Cpu.parse(str(cpu))
