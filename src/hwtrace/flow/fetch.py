"""Fetch and decode instructions from a memory image, once per address.

:class:`InsnCache` maps an IP to its decoded form (the x86 length/class
record, the libipt-style instruction record, and whether it crossed a
section boundary).  The flow decoders decode each address once; the
tables live with the image (``Image.decoded``), so switching a decoder
between address spaces keeps every space's decodes, and they are dropped
when that image changes (its ``generation``).

An instruction whose bytes end at a section boundary is completed from
the next section, if any, and marked ``truncated`` (libipt's term).
"""

from __future__ import annotations

from typing import NamedTuple

from hwtrace.pt import errors as E
from hwtrace.x86.insn import IClass, Kind, Mode, X86Error

MAX_INSN = 15

MODE_BY_NAME = {"16bit": Mode.BIT16, "32bit": Mode.BIT32, "64bit": Mode.BIT64}
ICLASS_NAMES = {c: c.name.lower() for c in IClass}

_CHANGES_CPL = frozenset((Kind.INT, Kind.INT3, Kind.INT1, Kind.INTO,
                          Kind.IRET, Kind.SYSCALL, Kind.SYSENTER,
                          Kind.SYSEXIT, Kind.SYSRET, Kind.ERETU, Kind.ERETS))
_VMPTRLD = frozenset((Kind.VMPTRLD, Kind.VMCLEAR, Kind.VMXON))


class FlowInsn(NamedTuple):
    """One executed instruction (libipt's struct pt_insn, minus raw bytes)."""

    ip: int
    size: int
    iclass: int          # hwtrace.x86.insn.IClass value
    mode: str            # "16bit" / "32bit" / "64bit"
    speculative: bool = False
    truncated: bool = False

    @property
    def iclass_name(self) -> str:
        return ICLASS_NAMES[IClass(self.iclass)]


class Decoded(NamedTuple):
    """A cached decode: the x86 record plus the two flow records (normal
    and speculative) handed out for this address."""

    x86: object          # hwtrace.x86.insn.Insn
    insn: FlowInsn
    spec: FlowInsn
    isid: int


class FetchError(Exception):
    def __init__(self, code: str):
        self.code = code


def is_far_branch(x) -> bool:
    return x.is_far


def changes_cpl(x) -> bool:
    return x.kind in _CHANGES_CPL


def changes_cr3(x) -> bool:
    return x.kind == Kind.MOV_CR3


def binds_to_pip(x) -> bool:
    return x.is_far or x.kind == Kind.MOV_CR3


def binds_to_vmcs(x) -> bool:
    return x.is_far or x.kind in _VMPTRLD


def is_ptwrite(x) -> bool:
    return x.iclass == IClass.PTWRITE


def is_direct(x) -> bool:
    """A near branch whose target the instruction itself gives."""
    return not x.is_indirect


def next_ip(ip: int, x) -> int | None:
    """The IP after ``x`` at ``ip`` if it does not depend on trace (libipt's
    pt_insn_next_ip), else None."""
    c = x.iclass
    if c == IClass.OTHER or c == IClass.PTWRITE:
        return (ip + x.size) & 0xFFFFFFFFFFFFFFFF
    if (c == IClass.CALL or c == IClass.JUMP) and not x.is_indirect:
        return (ip + x.size + x.rel) & 0xFFFFFFFFFFFFFFFF
    return None


class InsnCache:
    """Decode instructions from ``image``; each (ip, mode) once."""

    def __init__(self, image):
        self.image = image
        # One table per execution mode: ip -> Decoded (hot-path lookups),
        # kept by the image when it can hold them.
        tables = getattr(image, "decoded", None)
        if tables is None:
            tables = {}
        for m in MODE_BY_NAME:
            tables.setdefault(m, {})
        self.tables = tables
        from hwtrace.x86.decoder import decoder_for    # its tables: on use
        self._decoders = {m: decoder_for(MODE_BY_NAME[m]) for m in MODE_BY_NAME}
        self._check_generation()

    def _check_generation(self) -> None:
        image = self.image
        gen = getattr(image, "generation", 0)
        if gen != getattr(image, "decoded_generation", gen):
            self.clear()
            image.decoded_generation = gen

    def clear(self) -> None:
        for t in self.tables.values():
            t.clear()

    def decode(self, ip: int, mode: str) -> Decoded:
        """The decoded instruction at ``ip`` or raise FetchError with
        libipt's error string (no memory mapped / unknown instruction)."""
        if mode is None:
            # libipt decodes with an unknown mode as if it were invalid.
            raise FetchError(E.BAD_INSN)
        table = self.tables[mode]
        d = table.get(ip)
        if d is not None:
            return d
        image = self.image
        self._check_generation()
        m = image.find(ip)
        if m is None:
            raise FetchError(E.NOMAP)
        start = m.offset + (ip - m.begin)
        n = min(MAX_INSN, m.end - ip)
        code = m.section.bytes()[start:start + n]
        truncated = False
        fn = self._decoders[mode]
        try:
            x = fn(code, 0)
        except X86Error as e:
            if not e.truncated or len(code) >= MAX_INSN:
                raise FetchError(E.BAD_INSN) from None
            more = image.read(ip + len(code), MAX_INSN - len(code))
            if not more:
                raise FetchError(E.BAD_INSN) from None
            try:
                x = fn(code + more, 0)
            except X86Error:
                raise FetchError(E.BAD_INSN) from None
            truncated = True
        if x.kind == Kind.JMPABS:
            # Intel PT reports JMPABS like an indirect jump (with a TIP);
            # libipt decodes it as such.
            x = x._replace(is_indirect=True)
        d = Decoded(x, FlowInsn(ip, x.size, int(x.iclass), mode, False,
                                truncated),
                    FlowInsn(ip, x.size, int(x.iclass), mode, True, truncated),
                    m.section.isid)
        table[ip] = d
        return d

    def raw(self, ip: int, size: int) -> bytes:
        """The instruction bytes (across a section boundary if needed)."""
        out = b""
        while len(out) < size:
            chunk = self.image.read(ip + len(out), size - len(out))
            if not chunk:
                break
            out += chunk
        return out

    def range_is_contiguous(self, begin: int, end: int, mode: str,
                            steps: int) -> bool:
        """Can ``end`` be reached from ``begin`` without trace, in at most
        ``steps`` instructions? (libipt's pt_insn_range_is_contiguous)"""
        ip = begin
        while ip != end:
            if not steps:
                return False
            steps -= 1
            try:
                d = self.decode(ip, mode)
            except FetchError:
                return False
            nip = next_ip(ip, d.x86)
            if nip is None:
                return False
            ip = nip
        return True
