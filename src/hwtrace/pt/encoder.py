"""The Intel PT packet encoder: packet records (or field values) to bytes.

``encode(packet)`` writes any record of :mod:`hwtrace.pt.packets` back to
the exact bytes it was decoded from (IP compression as given by ``ipc``;
a CYC keeps its decoded ``size``).  Small constructors build packet bytes
directly for a trace generator::

    psb() + mode_exec(csl=1) + fup(0x1000, ipc=6) + psbend()
    tnt8("tnnt") + tip(0x401000, ipc=3) + tsc(12345)

:class:`Encoder` adds last-IP tracking so that IP packets get the smallest
compression automatically (``Encoder().tip(ip)``), and appends to a
``bytearray`` buffer.

Records that cannot be written (``Invalid``) or out-of-range field values
raise ``ValueError``: the encoder's input is the program's own data, not
trace bytes.
"""

from __future__ import annotations

from hwtrace.pt import packets as P
from hwtrace.pt.lastip import compress as _compress, apply as _apply

PSB_BYTES = b"\x02\x82" * 8


def _le(value: int, n: int) -> bytes:
    if value < 0 or value >> (8 * n):
        raise ValueError(f"value {value:#x} does not fit in {n} bytes")
    return value.to_bytes(n, "little")


def _tnt_value(bits) -> tuple[int, int]:
    """(bit_size, payload) from "tnnt" / iterable of truthy values."""
    if isinstance(bits, str):
        seq = [c in "tT!1" for c in bits if not c.isspace()]
    else:
        seq = [bool(b) for b in bits]
    payload = 0
    for b in seq:
        payload = (payload << 1) | b
    return len(seq), payload


# --- constructors -------------------------------------------------------------

def pad() -> bytes:
    return b"\x00"


def psb() -> bytes:
    return PSB_BYTES


def psbend() -> bytes:
    return b"\x02\x23"


def ovf() -> bytes:
    return b"\x02\xf3"


def stop() -> bytes:
    return b"\x02\x83"


def tnt8(bits=None, *, bit_size=None, payload=None) -> bytes:
    """TNT-8 with 1..6 branch bits, oldest first ("tnnt" or [1,0,0,1])."""
    if bits is not None:
        bit_size, payload = _tnt_value(bits)
    if not 1 <= bit_size <= 6 or payload >> bit_size:
        raise ValueError("tnt8 takes 1..6 branch bits")
    return bytes((((1 << bit_size) | payload) << 1,))


def tnt64(bits=None, *, bit_size=None, payload=None) -> bytes:
    """TNT-64 with 1..47 branch bits, oldest first."""
    if bits is not None:
        bit_size, payload = _tnt_value(bits)
    if not 1 <= bit_size <= 47 or payload >> bit_size:
        raise ValueError("tnt64 takes 1..47 branch bits")
    return b"\x02\xa3" + _le((1 << bit_size) | payload, 6)


def _ip_packet(base: int, ip: int, ipc: int) -> bytes:
    n = P.IPC_SIZE.get(ipc)
    if n is None:
        raise ValueError(f"reserved ip compression {ipc}")
    if ipc == 3 and ip >> 48:
        ip &= 0xffffffffffff  # sext-48 stores the low 48 bits
    elif n < 8:
        ip &= (1 << (8 * n)) - 1
    return bytes(((ipc << 5) | base,)) + (_le(ip, n) if n else b"")


def tip(ip: int = 0, ipc: int = 6) -> bytes:
    return _ip_packet(0x0d, ip, ipc)


def tip_pge(ip: int = 0, ipc: int = 6) -> bytes:
    return _ip_packet(0x11, ip, ipc)


def tip_pgd(ip: int = 0, ipc: int = 0) -> bytes:
    return _ip_packet(0x01, ip, ipc)


def fup(ip: int = 0, ipc: int = 6) -> bytes:
    return _ip_packet(0x1d, ip, ipc)


_EXEC_MODES = {"16bit": (0, 0), "32bit": (0, 1), "64bit": (1, 0)}


def mode_exec(csl: int = 0, csd: int = 0, iflag: int = 0, *,
              mode: str | None = None) -> bytes:
    """MODE.Exec; ``mode`` may be "16bit", "32bit" or "64bit"."""
    if mode is not None:
        csl, csd = _EXEC_MODES[mode]
    return bytes((0x99, (bool(iflag) << 2) | (bool(csd) << 1) | bool(csl)))


def mode_tsx(intx: int = 0, abrt: int = 0) -> bytes:
    return bytes((0x99, 0x20 | (bool(abrt) << 1) | bool(intx)))


def pip(cr3: int, nr: int = 0) -> bytes:
    if cr3 & 0x1f:
        raise ValueError("pip cr3 must be 32-byte aligned")
    return b"\x02\x43" + _le(((cr3 >> 5) << 1) | bool(nr), 6)


def tsc(value: int) -> bytes:
    return b"\x19" + _le(value, 7)


def cbr(ratio: int) -> bytes:
    return b"\x02\x03" + _le(ratio, 1) + b"\x00"


def tma(ctc: int, fc: int) -> bytes:
    if fc >> 9:
        raise ValueError("tma fc has 9 bits")
    return b"\x02\x73" + _le(ctc, 2) + b"\x00" + _le(fc, 2)


def mtc(ctc: int) -> bytes:
    return b"\x59" + _le(ctc, 1)


def cyc(value: int, size: int = 0) -> bytes:
    """CYC; ``size`` > the minimal size pads with zero extension bytes."""
    if value < 0 or value >> 61:
        raise ValueError("cyc value too large")
    out = [(value & 0x1f) << 3 | 3]
    value >>= 5
    while value or len(out) < size:
        out[-1] |= 4 if len(out) == 1 else 1
        out.append((value & 0x7f) << 1)
        value >>= 7
    return bytes(out)


def vmcs(base: int) -> bytes:
    if base & 0xfff:
        raise ValueError("vmcs base must be 4K aligned")
    return b"\x02\xc8" + _le(base >> 12, 5)


def mnt(payload: int) -> bytes:
    return b"\x02\xc3\x88" + _le(payload, 8)


def exstop(ip: int = 0) -> bytes:
    return b"\x02\xe2" if ip else b"\x02\x62"


def mwait(hints: int, ext: int) -> bytes:
    return b"\x02\xc2" + _le(hints, 4) + _le(ext, 4)


def pwre(state: int, sub_state: int, hw: int = 0) -> bytes:
    return bytes((0x02, 0x22, bool(hw) << 3,
                  (_le(state, 1)[0] & 0xf) << 4 | (sub_state & 0xf)))


def pwrx(last: int, deepest: int, interrupt: int = 0, store: int = 0,
         autonomous: int = 0) -> bytes:
    return bytes((0x02, 0xa2, (last & 0xf) << 4 | (deepest & 0xf),
                  bool(interrupt) | bool(store) << 2 | bool(autonomous) << 3,
                  0, 0, 0))


def ptw(payload: int, plc: int = 1, ip: int = 0) -> bytes:
    n = {0: 4, 1: 8}.get(plc)
    if n is None:
        raise ValueError("ptw plc must be 0 (32 bit) or 1 (64 bit)")
    return bytes((0x02, (bool(ip) << 7) | (plc << 5) | 0x12)) + _le(payload, n)


def cfe(cfe_type: int, vector: int = 0, ip: int = 0) -> bytes:
    return bytes((0x02, 0x13, (bool(ip) << 7) | (cfe_type & 0x1f),
                  _le(vector, 1)[0]))


def evd(evd_type: int, payload: int) -> bytes:
    return bytes((0x02, 0x53, evd_type & 0x1f)) + _le(payload, 8)


def trig(trbv: int, icnt: int | None = None, ip: int = 0,
         mult: int = 0) -> bytes:
    head = (bool(ip) << 7) | ((icnt is not None) << 6) | (bool(mult) << 5)
    out = bytes((0xd9, head, _le(trbv, 1)[0]))
    return out + (_le(icnt, 2) if icnt is not None else b"")


# --- records -------------------------------------------------------------------

def encode(pkt) -> bytes:
    """The bytes of a decoded packet record (inverse of the decoder)."""
    t = pkt.type
    f = _ENCODERS.get(t)
    if f is None:
        raise ValueError(f"cannot encode a {t!r} packet")
    return f(pkt)


_ENCODERS = {
    "pad": lambda p: pad(),
    "psb": lambda p: psb(),
    "psbend": lambda p: psbend(),
    "ovf": lambda p: ovf(),
    "stop": lambda p: stop(),
    "tnt8": lambda p: tnt8(bit_size=p.bit_size, payload=p.payload),
    "tnt64": lambda p: tnt64(bit_size=p.bit_size, payload=p.payload),
    "tip": lambda p: tip(p.ip, p.ipc),
    "tip.pge": lambda p: tip_pge(p.ip, p.ipc),
    "tip.pgd": lambda p: tip_pgd(p.ip, p.ipc),
    "fup": lambda p: fup(p.ip, p.ipc),
    "mode.exec": lambda p: mode_exec(p.csl, p.csd, p.iflag),
    "mode.tsx": lambda p: mode_tsx(p.intx, p.abrt),
    "pip": lambda p: pip(p.cr3, p.nr),
    "tsc": lambda p: tsc(p.tsc),
    "cbr": lambda p: cbr(p.ratio),
    "tma": lambda p: tma(p.ctc, p.fc),
    "mtc": lambda p: mtc(p.ctc),
    "cyc": lambda p: cyc(p.value, p.size),
    "vmcs": lambda p: vmcs(p.base),
    "mnt": lambda p: mnt(p.payload),
    "exstop": lambda p: exstop(p.ip),
    "mwait": lambda p: mwait(p.hints, p.ext),
    "pwre": lambda p: pwre(p.state, p.sub_state, p.hw),
    "pwrx": lambda p: pwrx(p.last, p.deepest, p.interrupt, p.store,
                           p.autonomous),
    "ptw": lambda p: ptw(p.payload, p.plc, p.ip),
    "cfe": lambda p: cfe(p.cfe_type, p.vector, p.ip),
    "evd": lambda p: evd(p.evd_type, p.payload),
    "trig": lambda p: trig(p.trbv, p.icnt if p.icntv else None, p.ip,
                           p.mult),
}


class Encoder:
    """Append packets to a buffer, compressing IPs against the last IP.

    Mirrors the decoder's last-IP state: ``psb()`` resets it (as the
    hardware does), and each IP packet written updates it.
    """

    def __init__(self, buf: bytearray | None = None):
        self.buf = buf if buf is not None else bytearray()
        self.last_ip: int | None = None

    def raw(self, data: bytes) -> "Encoder":
        self.buf += data
        return self

    def packet(self, pkt) -> "Encoder":
        if pkt.type in ("tip", "tip.pge", "tip.pgd", "fup"):
            self._track(pkt.ipc, pkt.ip)
        elif pkt.type == "psb":
            self.last_ip = None
        self.buf += encode(pkt)
        return self

    def _track(self, ipc: int, ip: int) -> None:
        if ipc:
            self.last_ip = _apply(self.last_ip or 0, ipc, ip)

    def _ip(self, make, ip: int | None, ipc: int | None) -> "Encoder":
        if ip is None:
            self.buf += make(0, 0)
            return self
        if ipc is None:
            ipc, payload = _compress(ip, self.last_ip)
        else:
            payload = ip
        self._track(ipc, payload)
        self.buf += make(payload, ipc)
        return self

    def tip(self, ip=None, ipc=None):
        return self._ip(tip, ip, ipc)

    def tip_pge(self, ip=None, ipc=None):
        return self._ip(tip_pge, ip, ipc)

    def tip_pgd(self, ip=None, ipc=None):
        return self._ip(tip_pgd, ip, ipc)

    def fup(self, ip=None, ipc=None):
        return self._ip(fup, ip, ipc)

    def psb(self):
        self.last_ip = None
        self.buf += psb()
        return self

    def __getattr__(self, name):
        # Every other constructor: enc.tnt8("tt"), enc.tsc(5), ...
        f = _CONSTRUCTORS.get(name)
        if f is None:
            raise AttributeError(name)

        def append(*args, **kwargs):
            self.buf += f(*args, **kwargs)
            return self
        return append

    def getvalue(self) -> bytes:
        return bytes(self.buf)


_CONSTRUCTORS = {f.__name__: f for f in (
    pad, psbend, ovf, stop, tnt8, tnt64, mode_exec, mode_tsx, pip, tsc,
    cbr, tma, mtc, cyc, vmcs, mnt, exstop, mwait, pwre, pwrx, ptw, cfe,
    evd, trig)}
