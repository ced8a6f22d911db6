"""The Intel PT packet decoder, with libipt's verbs.

    dec = PacketDecoder(data)          # bytes, an mmap, any buffer
    dec.sync_forward()                 # -> sync offset, or a PtError
    while True:
        pkt = dec.next()               # -> a packet record, or a PtError
        if isinstance(pkt, PtError):
            break
        ...

Verbs (libipt's ``pt_pkt_*``): :meth:`PacketDecoder.sync_forward`,
:meth:`~PacketDecoder.sync_backward`, :meth:`~PacketDecoder.sync_set`,
:meth:`~PacketDecoder.next`, and the properties ``offset`` (where the next
packet starts, ``None`` before synchronizing) and ``sync_offset`` (the last
synchronization point); :meth:`~PacketDecoder.decode_at` and
:meth:`~PacketDecoder.advance` peek at any offset without state.
Nothing raises for bad trace data: a verb that fails returns a
:class:`~hwtrace.pt.errors.PtError` with libipt's error string and the
offset, and leaves the position unchanged.

:meth:`PacketDecoder.packets` is the convenient loop ptdump runs: it
synchronizes (or starts at offset 0 with ``no_sync=True``), yields packets
and ``PtError`` records, and after an error resynchronizes at the next PSB.
With a ``cpu``, the packet-level errata workarounds apply (see
:mod:`hwtrace.pt.cpu`); ``cpu_error`` holds the "unknown cpu" error for a
CPU without a table entry (decoding then proceeds without workarounds).
A packet cut off by the end of the buffer ends the loop silently, as in
ptdump and libipt (the decoder reports it as "reached end of trace
stream", which both treat as the normal end).

Synchronization follows libipt exactly (so that error recovery matches the
reference): PSBs are searched as 8-byte-aligned words of the PSB payload
pattern, starting up to 15 bytes before the current position so that a PSB
partially consumed by a bad packet is found, but never a PSB that begins
before that search start.

``disabled`` names packet types to decode as unknown opcodes, e.g.
``packets.NEWER_PACKETS`` to mimic libipt 2.0 (no CFE, EVD, TRIG).

:meth:`PacketDecoder.count` runs the same loop as :meth:`packets` and
returns only ``(packets, errors)`` (``hwtrace dump --stat``).

**Buffers, without copies.**  ``data`` is decoded in place: ``bytes`` and
``mmap.mmap`` objects (e.g. a read-only mapping of a trace file) are used
as they are, a memoryview (or another fixed-size buffer such as an array)
through a read-only byte memoryview of it -- the caller must not change it
while it is being decoded; a bytearray, which its owner may grow or
change, is copied once as before.  :attr:`PacketDecoder.buffer` is that object; the
query/insn/block decoders above read the same one.  A buffer object (or a
memoryview's ``.obj``) may offer ``release_before(offset) -> next
offset``: the decoder calls it when its position first reaches 0 and then
each time it reaches the offset the last call returned, so that the owner
of a file mapping can drop the pages the decode has moved past (see
:class:`hwtrace.cli._tracemap.TraceMap`); the decoder itself does no I/O
and its results never depend on the hook.

Two implementations: this module is the Python twin; the compiled core
``hwtrace.pt._c_packets`` (``_c_packets.c``) decodes the same packets and
errors at the same offsets and runs by default when it is built (see
:mod:`hwtrace.pt._impl`; ``HWTRACE_NO_EXTENSIONS=1`` or
``PacketDecoder(..., impl="python")`` select the twin).
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Iterator

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError
from hwtrace.pt.packets import (
    IPC_SIZE, Cbr, Cfe, Cyc, Evd, Exstop, Fup, Mnt, ModeExec, ModeTsx, Mtc,
    Mwait, Ovf, Pad, Pip, Psb, Psbend, Ptw, Pwre, Pwrx, Stop, Tip, TipPge,
    TipPgd, Tma, Tnt8, Tnt64, Trig, Tsc, Vmcs, Invalid)
from hwtrace.pt.cpu import as_cpu, errata as cpu_errata, Errata, NO_ERRATA
from hwtrace.pt import _impl

PSB_BYTES = b"\x02\x82" * 8
PSB_SIZE = 16
_PSB_WORDS = (b"\x02\x82" * 4, b"\x82\x02" * 4)

_BAD_OPC = E.BAD_OPC
_BAD_PACKET = E.BAD_PACKET
_EOS = E.EOS
_from = int.from_bytes
_tnew = tuple.__new__  # build records without the NamedTuple __new__ frame
_NEVER = sys.maxsize   # release offset of a buffer without release_before


def as_buffer(data):
    """``data`` as the decoders read it: bytes and mmap objects as they
    are, a bytearray copied (its owner may resize it), other buffers as a
    read-only byte memoryview (a copy only if not contiguous)."""
    if data.__class__ is bytes or isinstance(data, mmap.mmap):
        return data
    if isinstance(data, bytearray):
        return bytes(data)
    mv = memoryview(data)
    if not mv.c_contiguous:
        return mv.tobytes()
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv.toreadonly()


def release_hook(buf):
    """The ``release_before`` of ``buf`` (or of the object a memoryview
    shows), or None."""
    owner = buf.obj if buf.__class__ is memoryview else buf
    return getattr(owner, "release_before", None)

# TNT-8 byte -> (bit_size, payload), for every even opcode byte.
_TNT8 = [None] * 256
for _x in range(4, 256, 2):
    _v = _x >> 1
    _n = _v.bit_length() - 1
    _TNT8[_x] = (1, _n, _v ^ (1 << _n))
del _x, _v, _n


# --- one-byte opcodes -------------------------------------------------------
# Each reader takes (buf, pos, end) with buf[pos] the opcode byte known to be
# in bounds, and returns a packet record or an error string.

def _pad(b, p, e):
    return _tnew(Pad, (p, 1))


def _tnt8(b, p, e):
    return _tnew(Tnt8, (p, *_TNT8[b[p]]))


def _make_ip(cls, ipc):
    n = IPC_SIZE.get(ipc)
    if n is None:
        return lambda b, p, e: _BAD_PACKET
    size = n + 1
    if n == 0:
        return lambda b, p, e: _tnew(cls, (p, 1, ipc, 0))

    def read_ip(b, p, e):
        q = p + size
        if q > e:
            return _EOS
        return _tnew(cls, (p, size, ipc, _from(b[p + 1:q], "little")))
    return read_ip


def _mode(b, p, e):
    if p + 2 > e:
        return _EOS
    v = b[p + 1]
    leaf = v & 0xe0
    if leaf == 0:
        return ModeExec(p, 2, v & 1, (v >> 1) & 1, (v >> 2) & 1)
    if leaf == 0x20:
        return ModeTsx(p, 2, v & 1, (v >> 1) & 1)
    return _BAD_PACKET


def _tsc(b, p, e):
    if p + 8 > e:
        return _EOS
    return Tsc(p, 8, _from(b[p + 1:p + 8], "little"))


def _mtc(b, p, e):
    if p + 2 > e:
        return _EOS
    return Mtc(p, 2, b[p + 1])


def _cyc(b, p, e):
    v = b[p]
    value = v >> 3
    if not v & 4:
        return _tnew(Cyc, (p, 1, value))
    q = p + 1
    shl = 5
    while True:
        if q >= e:
            return _EOS
        x = b[q]
        q += 1
        value |= (x >> 1) << shl
        shl += 7
        if shl > 64:
            return _BAD_PACKET
        if not x & 1:
            return Cyc(p, q - p, value)


def _trig(b, p, e):
    if p + 3 > e:
        return _EOS
    f = b[p + 1]
    if f & 0x40:
        if p + 5 > e:
            return _EOS
        return Trig(p, 5, b[p + 2], b[p + 3] | b[p + 4] << 8,
                    f >> 7, 1, (f >> 5) & 1)
    return Trig(p, 3, b[p + 2], 0, f >> 7, 0, (f >> 5) & 1)


def _bad_opc(b, p, e):
    return _BAD_OPC


# --- extended opcodes (0x02 xx) ---------------------------------------------

def _psb(b, p, e):
    if p + 16 > e:
        return _EOS
    if b[p:p + 16] != PSB_BYTES:
        return _BAD_PACKET
    return Psb(p, 16)


def _psbend(b, p, e):
    return Psbend(p, 2)


def _ovf(b, p, e):
    return Ovf(p, 2)


def _stop(b, p, e):
    return Stop(p, 2)


def _tnt64(b, p, e):
    if p + 8 > e:
        return _EOS
    v = _from(b[p + 2:p + 8], "little")
    n = v.bit_length() - 1
    if n <= 0:
        return _BAD_PACKET
    return Tnt64(p, 8, n, v ^ (1 << n))


def _pip(b, p, e):
    if p + 8 > e:
        return _EOS
    v = _from(b[p + 2:p + 8], "little")
    return Pip(p, 8, (v >> 1) << 5, v & 1)


def _cbr(b, p, e):
    if p + 4 > e:
        return _EOS
    return Cbr(p, 4, b[p + 2])


def _tma(b, p, e):
    if p + 7 > e:
        return _EOS
    fc = b[p + 5] | b[p + 6] << 8
    if fc & ~0x1ff or b[p + 4]:
        return _BAD_PACKET
    return Tma(p, 7, b[p + 2] | b[p + 3] << 8, fc)


def _vmcs(b, p, e):
    if p + 7 > e:
        return _EOS
    return Vmcs(p, 7, _from(b[p + 2:p + 7], "little") << 12)


def _ext2(b, p, e):
    if p + 2 >= e:
        return _EOS
    if b[p + 2] != 0x88:
        return _BAD_OPC
    if p + 11 > e:
        return _EOS
    return Mnt(p, 11, _from(b[p + 3:p + 11], "little"))


def _exstop(b, p, e):
    return Exstop(p, 2, b[p + 1] >> 7)


def _mwait(b, p, e):
    if p + 10 > e:
        return _EOS
    return Mwait(p, 10, _from(b[p + 2:p + 6], "little"),
                 _from(b[p + 6:p + 10], "little"))


def _pwre(b, p, e):
    if p + 4 > e:
        return _EOS
    v = b[p + 3]
    return Pwre(p, 4, v >> 4, v & 0xf, (b[p + 2] >> 3) & 1)


def _pwrx(b, p, e):
    if p + 7 > e:
        return _EOS
    v = b[p + 2]
    w = b[p + 3]
    return Pwrx(p, 7, v >> 4, v & 0xf, w & 1, (w >> 2) & 1, (w >> 3) & 1)


def _ptw(b, p, e):
    x = b[p + 1]
    plc = (x >> 5) & 3
    if plc == 0:
        n = 4
    elif plc == 1:
        n = 8
    else:
        return _BAD_PACKET
    if p + 2 + n > e:
        return _EOS
    return Ptw(p, 2 + n, plc, _from(b[p + 2:p + 2 + n], "little"), x >> 7)


def _cfe(b, p, e):
    if p + 4 > e:
        return _EOS
    t = b[p + 2]
    return Cfe(p, 4, t & 0x1f, b[p + 3], t >> 7)


def _evd(b, p, e):
    if p + 11 > e:
        return _EOS
    return Evd(p, 11, b[p + 2] & 0x1f, _from(b[p + 3:p + 11], "little"))


# SKD007 marker: "an OVF at this offset, 2 bytes, next packet 3 bytes on".
SKD007_OVF = "skd007 ovf"


def _cyc_skd007(b, p, e):
    r = _cyc(b, p, e)
    if r.__class__ is str or r[1] != 2 or (r[2] & ~0x1f) != 0x20:
        return r
    if p + 2 >= e or b[p + 2] != 0xf3:
        return r
    return SKD007_OVF


def _tma_skz84(b, p, e):
    r = _tma(b, p, e)
    if r is _BAD_PACKET:
        return Invalid(p, 8, 0)
    return r


def build_tables(disabled=frozenset(), errata: Errata = NO_ERRATA):
    """The opcode dispatch tables: (first-byte table, 0x02-extension table).

    ``disabled``: packet type names decoded as unknown opcodes.
    ``errata``: the packet-level workarounds to apply (skd007, skz84).
    """
    ext = [_bad_opc] * 256
    for x in range(256):
        if x & 0x1f == 0x12:
            ext[x] = _ptw
    ext[0x82] = _psb
    ext[0x23] = _psbend
    ext[0xf3] = _ovf
    ext[0x83] = _stop
    ext[0xa3] = _tnt64
    ext[0x43] = _pip
    ext[0x03] = _cbr
    ext[0x73] = _tma
    ext[0xc8] = _vmcs
    ext[0xc3] = _ext2
    ext[0x62] = _exstop
    ext[0xe2] = _exstop
    ext[0xc2] = _mwait
    ext[0x22] = _pwre
    ext[0xa2] = _pwrx
    if errata.skz84:
        ext[0x73] = _tma_skz84
    if "cfe" not in disabled:
        ext[0x13] = _cfe
    if "evd" not in disabled:
        ext[0x53] = _evd

    def _ext(b, p, e):
        if p + 1 >= e:
            return _EOS
        return ext[b[p + 1]](b, p, e)

    main = [_bad_opc] * 256
    ip_classes = {0x0d: Tip, 0x11: TipPge, 0x01: TipPgd, 0x1d: Fup}
    for x in range(256):
        if x & 3 == 3:
            main[x] = _cyc
        elif not x & 1:
            main[x] = _tnt8
        elif x & 0x1f in ip_classes:
            main[x] = _make_ip(ip_classes[x & 0x1f], x >> 5)
    if errata.skd007:
        for x in range(3, 256, 4):
            main[x] = _cyc_skd007
    main[0x00] = _pad
    main[0x02] = _ext
    main[0x99] = _mode
    main[0x19] = _tsc
    main[0x59] = _mtc
    if "trig" not in disabled:
        main[0xd9] = _trig
    return main, ext


_DEFAULT_TABLES = build_tables()


class PacketDecoder:
    """Decode Intel PT packets from a buffer (libipt's packet decoder).

    ``cpu`` (a :class:`hwtrace.pt.cpu.Cpu` or ``"F/M[/S]"``) selects the
    packet-level errata workarounds (unless ``errata`` is given).
    ``impl``: ``None`` (the compiled core when available), ``"python"`` or
    ``"compiled"`` (RuntimeError if it is not built); :attr:`impl` says
    which one runs.
    """

    __slots__ = ("_buf", "_end", "_pos", "_sync", "_table", "cpu",
                 "errata", "cpu_error", "_core", "_flags", "_release",
                 "_release_at")

    def __init__(self, data, *, cpu=None, errata: Errata | None = None,
                 disabled=(), impl: str | None = None):
        self._buf = as_buffer(data)
        self._end = len(self._buf)
        self._release = release_hook(self._buf)
        self._release_at = _NEVER if self._release is None else 0
        self._pos = None
        self._sync = None
        self.cpu = as_cpu(cpu)
        self.cpu_error = None
        if errata is None:
            errata = cpu_errata(self.cpu)
            if errata.__class__ is PtError:
                self.cpu_error = errata
                errata = NO_ERRATA
        self.errata = errata
        self._core = core = _impl.core_for(impl)
        self._flags = 0 if core is None else _impl.flags(core, errata,
                                                          disabled)
        if not disabled and errata == NO_ERRATA:
            self._table = _DEFAULT_TABLES[0]
        else:
            self._table = build_tables(frozenset(disabled), errata)[0]

    # -- position ------------------------------------------------------------
    @property
    def offset(self) -> int | None:
        """Offset of the next packet, ``None`` before synchronizing."""
        return self._pos

    @property
    def sync_offset(self) -> int | None:
        """Offset of the last synchronization point."""
        return self._sync

    @property
    def impl(self) -> str:
        """``"compiled"`` or ``"python"``: which implementation decodes."""
        return "python" if self._core is None else "compiled"

    @property
    def size(self) -> int:
        return self._end

    @property
    def buffer(self):
        """The trace as decoded: ``data`` itself (bytes, mmap) or a
        read-only byte memoryview of it -- never a copy."""
        return self._buf

    # -- synchronization -----------------------------------------------------
    def sync_set(self, offset: int):
        """Trust ``offset`` as a packet boundary.  Returns it or a PtError."""
        if offset < 0 or offset > self._end:
            return PtError(E.EOS, offset)
        self._pos = self._sync = offset
        return offset

    def sync_forward(self):
        """Move to the next PSB.  Returns its offset or a PtError (EOS)."""
        pos = self._pos
        if pos is None:
            pos = 0
        if pos == self._sync:
            pos += PSB_SIZE
        start = pos - min(pos, PSB_SIZE - 1)
        found = find_psb_forward(self._buf, start)
        if found < 0:
            return PtError(E.EOS, self._pos if self._pos is not None else 0)
        self._pos = self._sync = found
        return found

    def sync_backward(self):
        """Move to the last PSB that starts before the current position
        (the end of the buffer before synchronizing)."""
        pos = self._pos
        if pos is None:
            pos = self._end
        found = find_psb_backward(self._buf, pos)
        if found < 0:
            return PtError(E.EOS, pos)
        self._pos = self._sync = found
        return found

    # -- decoding ------------------------------------------------------------
    def next(self):
        """Decode the packet at :attr:`offset` and move past it.

        Returns the packet record, or a PtError at the packet's offset
        (position unchanged): "reached end of trace stream" at the end or
        for a packet cut off by it, "unknown opcode", "unknown packet",
        "decoder out of sync" before synchronizing.
        """
        pos = self._pos
        if pos is None:
            return PtError(E.NOSYNC, 0)
        if pos >= self._end:
            return PtError(E.EOS, pos)
        if pos >= self._release_at:
            self._release_at = self._release(pos)
        core = self._core
        if core is not None:
            r = core.decode(self._buf, pos, self._flags)
            if r.__class__ is PtError:
                return r
            # An OVF whose first byte is not 0x02 is the SKD007 CYC+OVF
            # workaround, which consumes one byte more than the record.
            self._pos = pos + r[1] + (r.__class__ is Ovf and
                                      self._buf[pos] != 0x02)
            return r
        r = self._table[self._buf[pos]](self._buf, pos, self._end)
        if r.__class__ is str:
            if r is SKD007_OVF:
                self._pos = pos + 3
                return Ovf(pos, 2)
            return PtError(r, pos)
        self._pos = pos + r[1]
        return r

    def decode_at(self, offset: int):
        """The packet at ``offset`` (a record or a PtError), without moving
        or synchronizing: ``sync_set(offset); next()`` minus the state.
        ``advance(offset, record)`` gives the offset after it."""
        if offset < 0 or offset >= self._end:
            return PtError(E.EOS, offset)
        core = self._core
        if core is not None:
            return core.decode(self._buf, offset, self._flags)
        r = self._table[self._buf[offset]](self._buf, offset, self._end)
        if r.__class__ is str:
            if r is SKD007_OVF:
                return Ovf(offset, 2)
            return PtError(r, offset)
        return r

    def advance(self, offset: int, record) -> int:
        """Offset of the packet after ``record`` decoded at ``offset``
        (``offset + size``, except the SKD007 CYC+OVF, one byte longer)."""
        return offset + record[1] + (record.__class__ is Ovf and
                                     self._buf[offset] != 0x02)

    def packets(self, *, no_sync: bool = False) -> Iterator:
        """Yield every packet and error like ptdump does.

        Synchronizes onto the first PSB (or trusts offset 0 with
        ``no_sync``), yields packet records, and for a decode error yields
        its PtError and resynchronizes at the next PSB.  Ends at the end of
        the buffer (including a final packet cut off by it).  For speed,
        :attr:`offset` is brought up to date when an error is yielded and
        when the loop ends (packets carry their own offsets).  The initial
        synchronization happens when this is called.
        """
        if not self._start(no_sync):
            return iter(())
        core = self._core
        if core is None:
            return self._packets_py()
        return core.PacketIter(self, self._buf, self._pos, self._sync,
                               self._flags, self._release)

    def count(self, *, no_sync: bool = False) -> tuple[int, int]:
        """``(packets, errors)`` that :meth:`packets` would yield, without
        creating them (the compiled core scans in C).  Leaves
        :attr:`offset` where :meth:`packets` would."""
        if not self._start(no_sync):
            return 0, 0
        core = self._core
        if core is None:
            npk = nerr = 0
            for p in self._packets_py():
                if p.__class__ is PtError:
                    nerr += 1
                else:
                    npk += 1
            return npk, nerr
        release = self._release
        if release is None:
            npk, nerr, self._pos, self._sync = core.count(
                self._buf, self._pos, self._sync, self._flags)
            return npk, nerr
        # In windows: count up to the next release offset, release, go on.
        npk = nerr = 0
        end = self._end
        while True:
            pos = self._pos
            if pos >= self._release_at:
                self._release_at = release(pos)
            limit = max(self._release_at, pos + 1)
            n, m, self._pos, self._sync = core.count(
                self._buf, pos, self._sync, self._flags, limit)
            npk += n
            nerr += m
            if self._pos < limit or self._pos >= end:
                return npk, nerr

    def _start(self, no_sync: bool) -> bool:
        if no_sync:
            self.sync_set(0)
            return True
        return self.sync_forward().__class__ is not PtError

    def _packets_py(self) -> Iterator:
        """The Python twin of the packets() loop, from :attr:`offset`."""
        b = self._buf
        e = self._end
        table = self._table
        pos = self._pos
        release = self._release
        at = self._release_at
        try:
            while pos < e:
                if pos >= at:
                    at = self._release_at = release(pos)
                r = table[b[pos]](b, pos, e)
                if r.__class__ is str:
                    if r is _EOS:
                        break
                    if r is SKD007_OVF:
                        pos += 3
                        yield Ovf(pos - 3, 2)
                        continue
                    self._pos = pos
                    yield PtError(r, pos)
                    s = self.sync_forward()
                    if s.__class__ is PtError:
                        if s.code != E.EOS:
                            yield PtError(s.code, pos, "sync error")
                        return
                    pos = s
                    continue
                pos += r[1]
                yield r
        finally:
            self._pos = pos

    def __iter__(self):
        return self.packets()


def find_psb_forward(buf: bytes, start: int) -> int:
    """Offset of the first PSB found searching from ``start`` (libipt's
    aligned search; a PSB beginning before ``start`` is skipped), or -1."""
    pos = (start + 7) & ~7
    w1, w2 = _PSB_WORDS
    find = getattr(buf, "find", None)
    if find is None:
        def find(pat, at, _buf=buf):
            return _find_in_view(_buf, pat, at)
    while True:
        # Any aligned pattern word is also a match of find(): jump to the
        # next match and look at it only if it is aligned.
        i1 = find(w1, pos)
        i2 = find(w2, pos)
        if i1 < 0:
            if i2 < 0:
                return -1
            i = i2
        elif i2 < 0 or i1 < i2:
            i = i1
        else:
            i = i2
        if i & 7:
            pos = (i + 7) & ~7
            continue
        found = _psb_around_word(buf, i)
        if found >= start:
            return found
        pos = i + 8


_FIND_CHUNK = 1 << 20


def _find_in_view(buf, pat: bytes, pos: int) -> int:
    """``bytes.find`` for a memoryview: searched in copies of 1 MiB
    windows (overlapping by len(pat) - 1 bytes), never of the whole."""
    end = len(buf)
    over = len(pat) - 1
    while pos < end:
        i = bytes(buf[pos:pos + _FIND_CHUNK + over]).find(pat)
        if i >= 0:
            return pos + i
        pos += _FIND_CHUNK
    return -1


def _psb_around_word(buf: bytes, pos: int) -> int:
    """Given an aligned word of PSB pattern at ``pos``, find the start of
    the PSB it belongs to (libipt's pt_find_psb): walk to the end of the
    02 82 pairs, step back one PSB and check it; -1 if it is none."""
    end = len(buf)
    if buf[pos] != 0x02:
        pos += 1
    while pos + 1 < end and buf[pos] == 0x02 and buf[pos + 1] == 0x82:
        pos += 2
    pos -= PSB_SIZE
    if pos < 0:
        return -1
    if buf[pos:pos + PSB_SIZE] != PSB_BYTES:
        return -1
    return pos


def find_psb_backward(buf: bytes, pos: int) -> int:
    """Offset of the PSB found searching backwards from ``pos``, or -1."""
    pos &= ~7
    while True:
        pos -= 8
        if pos < 0:
            return -1
        if buf[pos:pos + 8] in _PSB_WORDS:
            found = _psb_around_word(buf, pos)
            if 0 <= found:
                return found
