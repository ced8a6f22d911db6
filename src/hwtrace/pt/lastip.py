"""Last-IP reconstruction for compressed IP payloads (TIP/TIP.PGE/TIP.PGD/FUP).

Per the SDM, an IP packet's payload replaces the low 16/32/48 bits of the
last IP (update-16/32/48), is sign-extended from 48 bits (sext-48), is the
full 64-bit IP (full), or says the IP is suppressed (the last IP is kept).
Semantics follow libipt's pt_last_ip::

    last = LastIp()
    last.update(pkt.ipc, pkt.ip)      # -> None, or PtError("unknown packet")
    last.query()                      # -> int, or PtError("no ip" /
                                      #    "ip has been suppressed")

PSB resets it (the flow decoder calls :meth:`LastIp.reset`).
"""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError

_MASK = {1: 0xffff, 2: 0xffffffff, 4: 0xffffffffffff}
_U64 = (1 << 64) - 1


def sext48(ip: int) -> int:
    """Sign-extend a 48-bit value to 64 bits."""
    ip &= 0xffffffffffff
    return ip | 0xffff000000000000 if ip & (1 << 47) else ip


def apply(last: int, ipc: int, ip: int) -> int | None:
    """The IP an ``ipc``/``ip`` payload gives against ``last``
    (None when suppressed or for a reserved compression)."""
    if ipc == 3:
        return sext48(ip)
    if ipc == 6:
        return ip & _U64
    mask = _MASK.get(ipc)
    if mask is None:
        return None
    return (last & ~mask & _U64) | (ip & mask)


class LastIp:
    __slots__ = ("ip", "have_ip", "suppressed")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.ip = 0
        self.have_ip = False
        self.suppressed = False

    def update(self, ipc: int, ip: int):
        if ipc == 0:
            self.suppressed = True
            return None
        if ipc == 3:
            self.ip = sext48(ip)
        elif ipc == 6:
            self.ip = ip & _U64
        else:
            mask = _MASK.get(ipc)
            if mask is None:
                return PtError(E.BAD_PACKET, 0)
            self.ip = (self.ip & ~mask & _U64) | (ip & mask)
        self.have_ip = True
        self.suppressed = False
        return None

    def query(self):
        if not self.have_ip:
            return PtError(E.NOIP, 0)
        if self.suppressed:
            return PtError(E.IP_SUPPRESSED, 0)
        return self.ip


def compress(ip: int, last: int | None) -> tuple[int, int]:
    """Choose the smallest IP compression for ``ip`` given the last IP
    (``None``: no last IP yet).  Returns ``(ipc, payload)``."""
    ip &= _U64
    if last is not None:
        for ipc, mask in ((1, 0xffff), (2, 0xffffffff)):
            if (ip & ~mask) == (last & ~mask & _U64):
                return ipc, ip & mask
    if sext48(ip) == ip:
        if last is not None and (ip >> 48) == (last >> 48):
            return 4, ip & 0xffffffffffff
        return 3, ip & 0xffffffffffff
    if last is not None and (ip >> 48) == (last >> 48):
        return 4, ip & 0xffffffffffff
    return 6, ip
