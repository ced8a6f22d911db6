"""ToPA (Table of Physical Addresses) output, as the SDM describes it; no I/O.

:class:`Topa` builds the tables for a buffer of ``num_chunks`` regions of
``4 KiB << order`` each: tables of 2048 eight-byte entries, data entries in
allocation order, a table with 2047 data entries gets END -> next table in
its last slot, and the last table's END points back to the first (so the ring
is circular in structure). A stop-on-full buffer has STOP on its last data
entry. Addresses are "physical" addresses of a model address space: tables at
``base``, regions from ``base + 1 MiB`` on, each aligned to its size.

:class:`OutputUnit` is the CPU's trace output logic over that ToPA: it appends
packet bytes at the output pointer into the regions' memory (any writable
buffers: bytearrays, mmaps), follows END entries, wraps, stops with
STATUS.Stopped at a full STOP region, emits OVF (``02 F3``) when it resumes
after it could not write, and keeps IA32_RTIT_OUTPUT_BASE,
IA32_RTIT_OUTPUT_MASK_PTRS and IA32_RTIT_STATUS (Stopped, Error,
PacketByteCnt) as the SDM defines them. If given a ``regs`` buffer it stores
the registers there after every change (see :data:`REGS_SIZE`), so that a
buffer in shared memory can be read by another process while tracing runs and
survives the writer.

``capture_end`` follows the sum rule: the sizes of all regions before the
current one (in allocation order) plus the offset in the current one. After
a STOP region fills, the output pointer stays on that entry with its offset
equal to the region size, so capture_end is the whole buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

PAGE_SIZE = 4096
TABLE_ENTRIES = 2048
ENTRY_BYTES = 8
TABLE_BYTES = TABLE_ENTRIES * ENTRY_BYTES

# ToPA entry bits
ENTRY_END = 1 << 0
ENTRY_INT = 1 << 2
ENTRY_STOP = 1 << 4
ENTRY_RESERVED = 1 << 1 | 1 << 3 | 1 << 5 | 1 << 10 | 1 << 11
SIZE_SHIFT = 6
SIZE_MASK = 0xF << SIZE_SHIFT
BASE_MASK = 0x000F_FFFF_FFFF_F000

# IA32_RTIT_STATUS bits
STATUS_FILTER_EN = 1 << 0
STATUS_CONTEXT_EN = 1 << 1
STATUS_TRIGGER_EN = 1 << 2
STATUS_ERROR = 1 << 4
STATUS_STOPPED = 1 << 5
PACKET_BYTE_CNT_SHIFT = 32
PACKET_BYTE_CNT_MASK = (1 << 17) - 1

# IA32_RTIT_OUTPUT_MASK_PTRS
LOWER_MASK = 0x7F           # bits 6:0, forced to 1
INDEX_SHIFT = 7             # bits 31:7: entry index in the current table
OFFSET_SHIFT = 32           # bits 63:32: offset in the current region

OVF = b"\x02\xf3"
PSB = b"\x02\x82" * 8

#: Data entries per table: the last slot of a full table holds END.
DATA_PER_TABLE = TABLE_ENTRIES - 1
#: Regions start this far above the tables (aligned for every region size).
REGION_AREA = 1 << 20


def make_entry(base: int, size_code: int = 0, *, end: bool = False,
               stop: bool = False, intr: bool = False) -> int:
    """One ToPA entry."""
    if base & ~BASE_MASK:
        raise ValueError(f"ToPA base {base:#x} is not a 4 KiB-aligned physical address")
    if not 0 <= size_code <= 15:
        raise ValueError("size code must be 0..15")
    return base | size_code << SIZE_SHIFT | (ENTRY_STOP if stop else 0) \
        | (ENTRY_INT if intr else 0) | (ENTRY_END if end else 0)


def entry_base(e: int) -> int:
    return e & BASE_MASK


def entry_size(e: int) -> int:
    return PAGE_SIZE << ((e & SIZE_MASK) >> SIZE_SHIFT)


def mask_ptrs(index: int, offset: int) -> int:
    """IA32_RTIT_OUTPUT_MASK_PTRS for entry ``index`` and ``offset`` in its region."""
    return offset << OFFSET_SHIFT | index << INDEX_SHIFT | LOWER_MASK


def ptrs_index(mp: int) -> int:
    return (mp >> INDEX_SHIFT) & ((1 << 25) - 1)


def ptrs_offset(mp: int) -> int:
    return mp >> OFFSET_SHIFT


def packet_byte_cnt(status: int) -> int:
    return (status >> PACKET_BYTE_CNT_SHIFT) & PACKET_BYTE_CNT_MASK


@dataclass(frozen=True, slots=True)
class Topa:
    """The ToPA tables of one buffer and where its regions are.

    ``tables[i]`` is the list of entries (END included) of the table at
    ``table_bases[i]``; unused slots are zero. ``region_bases[k]`` is chunk
    ``k``'s physical address.
    """

    tables: tuple[tuple[int, ...], ...]
    table_bases: tuple[int, ...]
    region_bases: tuple[int, ...]
    region_size: int
    stop_on_full: bool

    @classmethod
    def build(cls, num_chunks: int, chunk_order: int, *, stop_on_full: bool,
              base: int = 1 << 32) -> "Topa":
        if not 1 <= num_chunks or not 0 <= chunk_order <= 15:
            raise ValueError("bad ToPA geometry")
        if base % REGION_AREA:
            raise ValueError("ToPA base must be 1 MiB aligned")
        size = PAGE_SIZE << chunk_order
        ntables = -(-num_chunks // DATA_PER_TABLE)
        if ntables * TABLE_BYTES > REGION_AREA:
            raise ValueError("too many chunks")
        table_bases = tuple(base + i * TABLE_BYTES for i in range(ntables))
        region0 = base + max(REGION_AREA, size)
        region_bases = tuple(region0 + k * size for k in range(num_chunks))
        tables = []
        for t in range(ntables):
            first = t * DATA_PER_TABLE
            chunks = range(first, min(first + DATA_PER_TABLE, num_chunks))
            entries = [make_entry(region_bases[k], chunk_order,
                                  stop=stop_on_full and k == num_chunks - 1)
                       for k in chunks]
            entries.append(make_entry(table_bases[(t + 1) % ntables], end=True))
            tables.append(tuple(entries))
        return cls(tuple(tables), table_bases, region_bases, size, stop_on_full)

    @property
    def num_chunks(self) -> int:
        return len(self.region_bases)

    @property
    def total_size(self) -> int:
        return self.num_chunks * self.region_size

    def entry(self, table_base: int, index: int) -> int:
        """The entry at ``index`` of the table at ``table_base`` (0 if unused)."""
        try:
            t = self.table_bases.index(table_base)
        except ValueError:
            raise KeyError(f"no ToPA table at {table_base:#x}") from None
        entries = self.tables[t]
        return entries[index] if 0 <= index < len(entries) else 0

    def table_bytes(self, t: int) -> bytes:
        """Table ``t`` as the 16 KiB the CPU reads."""
        entries = list(self.tables[t]) + [0] * (TABLE_ENTRIES - len(self.tables[t]))
        return struct.pack(f"<{TABLE_ENTRIES}Q", *entries)

    def chunk_of(self, table_base: int, index: int) -> int:
        """Allocation-order chunk number of a data entry."""
        t = self.table_bases.index(table_base)
        return t * DATA_PER_TABLE + index

    def initial_registers(self) -> tuple[int, int]:
        """(OUTPUT_BASE, OUTPUT_MASK_PTRS) at the start of the buffer."""
        return self.table_bases[0], mask_ptrs(0, 0)

    def capture_end(self, output_base: int, mp: int) -> int:
        """The spec's sum rule: all regions before the current one (in
        allocation order) plus the offset in the current one."""
        try:
            t = self.table_bases.index(output_base)
        except ValueError:
            return 0
        idx, off = ptrs_index(mp), ptrs_offset(mp)
        entries = self.tables[t]
        if idx >= len(entries) or entries[idx] & ENTRY_END:
            # at an END entry: where the next table starts (0 after the last)
            idx, off = min(idx, len(entries) - 1), 0
            if t == len(self.tables) - 1:
                return 0
        return (t * DATA_PER_TABLE + idx) * self.region_size + min(off, self.region_size)


# ------------------------------------------------------------------ registers

#: Layout of the persisted registers (little endian): magic, seq (odd while
#: being updated), OUTPUT_BASE, OUTPUT_MASK_PTRS, STATUS, flags (bit 0
#: wrapped, bit 1 OVF pending), bytes stored, bytes lost, instructions.
REGS_MAGIC = b"HWTPTRG1"
_REGS = struct.Struct("<8sQQQQQQQQ")
_SEQ = struct.Struct("<Q")
REGS_SIZE = 128
FLAG_WRAPPED = 1
FLAG_OVF_PENDING = 2


@dataclass(frozen=True, slots=True)
class Registers:
    output_base: int
    output_mask_ptrs: int
    status: int
    wrapped: bool = False
    ovf_pending: bool = False
    stored: int = 0
    lost: int = 0
    instructions: int = 0

    @property
    def stopped(self) -> bool:
        return bool(self.status & STATUS_STOPPED)


def read_registers(buf, *, allow_torn: bool = False) -> Registers:
    """Registers stored by an :class:`OutputUnit` in ``buf`` (a consistent
    snapshot; ValueError if ``buf`` holds none). ``allow_torn``: accept an
    update its writer never finished (it died between the two stores)."""
    if len(buf) < _REGS.size:
        raise ValueError("no ToPA registers here")
    for attempt in range(1000):
        magic, seq, ob, mp, st, fl, stored, lost, insns = _REGS.unpack_from(buf, 0)
        if magic != REGS_MAGIC:
            raise ValueError("no ToPA registers here")
        if seq & 1 and not (allow_torn and attempt > 100):
            continue
        if _REGS.unpack_from(buf, 0)[1] == seq:
            return Registers(ob, mp, st, bool(fl & FLAG_WRAPPED), bool(fl & FLAG_OVF_PENDING),
                             stored, lost, insns)
    raise ValueError("ToPA registers keep changing")


# ---------------------------------------------------------------- output unit


class OutputUnit:
    """The CPU's ToPA output for one buffer.

    ``memory[k]`` is chunk ``k``'s region (a writable buffer of
    ``topa.region_size`` bytes). ``regs`` (optional, writable, >= REGS_SIZE
    bytes) receives the registers after every change; ``initial`` resumes
    from saved :class:`Registers` (as restoring the MSRs does).
    """

    def __init__(self, topa: Topa, memory: Sequence, *, regs=None,
                 initial: Registers | None = None):
        if len(memory) != topa.num_chunks:
            raise ValueError("one memory region per chunk")
        self.topa = topa
        self._mem = [memoryview(m).cast("B") for m in memory]
        for m in self._mem:
            if len(m) < topa.region_size or m.readonly:
                raise ValueError("regions must be writable and region_size long")
        self._by_base = {b: k for k, b in enumerate(topa.region_bases)}
        self._size = topa.region_size
        self._regs = regs
        if initial is None:
            ob, mp = topa.initial_registers()
            initial = Registers(ob, mp, 0)
        self.output_base = initial.output_base
        self.output_mask_ptrs = initial.output_mask_ptrs
        self.status = initial.status
        self.wrapped = initial.wrapped
        self.ovf_pending = initial.ovf_pending
        self.stored = initial.stored
        self.lost = initial.lost
        self.instructions = initial.instructions
        self._seq = 0
        if regs is not None:
            try:
                self._seq = (_REGS.unpack_from(regs, 0)[1] + 1) & ~1
            except struct.error:
                raise ValueError("regs buffer too small") from None
        self._load_entry()
        self._store()

    # -- the current region (cached from the entry the pointers name)
    def _load_entry(self, advancing: bool = False) -> None:
        """Resolve the entry the output pointers name, following END entries.

        A malformed ToPA (SDM "ToPA Errors": reserved bits, END in entry 0,
        STOP/INT on an END entry, a region not aligned to its size or not
        backed by memory, an output offset past the region) is an operational
        error: STATUS.Error is set, TriggerEn cleared, and nothing more is
        written."""
        idx = ptrs_index(self.output_mask_ptrs)
        off = ptrs_offset(self.output_mask_ptrs)
        base = self.output_base
        size = self.topa.region_size
        for _ in range(len(self.topa.tables) + 1):
            try:
                e = self.topa.entry(base, idx)
            except KeyError:
                break
            if e & ENTRY_RESERVED:
                break
            if e & ENTRY_END:
                if idx == 0 or e & (ENTRY_STOP | ENTRY_INT):
                    break
                if base == self.topa.table_bases[-1] and entry_base(e) == self.topa.table_bases[0]:
                    self.wrapped = self.wrapped or advancing
                base, idx, off = entry_base(e), 0, 0
                continue
            k = self._by_base.get(entry_base(e))
            if k is None or entry_size(e) != size or entry_base(e) % size \
                    or off > size or (off == size and not self.status & STATUS_STOPPED):
                break
            self.output_base = base
            self.output_mask_ptrs = mask_ptrs(idx, off)
            self._chunk, self._idx, self._off = k, idx, off
            self._stop = bool(e & ENTRY_STOP)
            return
        self.status = (self.status | STATUS_ERROR) & ~STATUS_TRIGGER_EN
        self._chunk, self._idx, self._off, self._stop = -1, 0, 0, True

    def _store(self) -> None:
        self.output_mask_ptrs = mask_ptrs(self._idx, self._off) if self._chunk >= 0 \
            else self.output_mask_ptrs
        regs = self._regs
        if regs is None:
            return
        seq = self._seq + 1
        fl = (FLAG_WRAPPED if self.wrapped else 0) | (FLAG_OVF_PENDING if self.ovf_pending else 0)
        _REGS.pack_into(regs, 0, REGS_MAGIC, seq, self.output_base,
                        self.output_mask_ptrs, self.status, fl, self.stored, self.lost,
                        self.instructions)
        self._seq = seq = seq + 1
        _SEQ.pack_into(regs, 8, seq)

    # -- what engines call
    @property
    def stopped(self) -> bool:
        """STATUS.Stopped (a STOP region filled)."""
        return bool(self.status & STATUS_STOPPED)

    @property
    def halted(self) -> bool:
        """Nothing more will be written: Stopped, or an operational error."""
        return bool(self.status & (STATUS_STOPPED | STATUS_ERROR))

    @property
    def packet_byte_cnt(self) -> int:
        return packet_byte_cnt(self.status)

    def reset_packet_byte_cnt(self) -> None:
        self.status &= ~(PACKET_BYTE_CNT_MASK << PACKET_BYTE_CNT_SHIFT)
        self._store()

    def enable(self) -> None:
        """TraceEn set: TriggerEn follows unless the output stopped."""
        if not self.halted:
            self.status |= STATUS_TRIGGER_EN
        self._store()

    def disable(self) -> None:
        """TraceEn cleared."""
        self.status &= ~STATUS_TRIGGER_EN
        self._store()

    def add_instructions(self, n: int) -> None:
        self.instructions += n
        self._store()

    def overflow(self) -> None:
        """Internal overflow: packets were lost; OVF precedes the next bytes."""
        self.ovf_pending = True
        self._store()

    def write(self, data) -> int:
        """Append packet bytes; returns how many of ``data`` were stored."""
        # fast path: bytes that fit in the current region, nothing pending
        if type(data) is bytes or type(data) is bytearray:
            n = len(data)
            off = self._off
            if 0 < n and off + n < self._size and not self.ovf_pending \
                    and not self.status & STATUS_STOPPED and self._chunk >= 0:
                self._mem[self._chunk][off:off + n] = data
                self._off = off + n
                self.stored += n
                st = self.status
                cnt = (st >> PACKET_BYTE_CNT_SHIFT) + n
                if cnt > PACKET_BYTE_CNT_MASK:
                    cnt &= PACKET_BYTE_CNT_MASK
                self.status = (st & 0xFFFF_FFFF) | cnt << PACKET_BYTE_CNT_SHIFT
                self._store()
                return n
        mv = memoryview(data).cast("B")
        if not len(mv):
            return 0
        if self.halted:
            self.lost += len(mv)
            self.ovf_pending = True
            self._store()
            return 0
        ovf = self.ovf_pending
        if ovf:
            self.ovf_pending = False
            n = self._put(memoryview(OVF))
            if n < len(OVF):       # not even OVF fit
                self.lost += len(mv)
                self.ovf_pending = True
                self._count(n)
                self._store()
                return 0
        n = self._put(mv)
        self.lost += len(mv) - n
        if n < len(mv):
            self.ovf_pending = True
        self._count(n + (len(OVF) if ovf else 0))
        self._store()
        return n

    def _count(self, n: int) -> None:
        cnt = (packet_byte_cnt(self.status) + n) & PACKET_BYTE_CNT_MASK
        self.status = (self.status & ~(PACKET_BYTE_CNT_MASK << PACKET_BYTE_CNT_SHIFT)) \
            | cnt << PACKET_BYTE_CNT_SHIFT

    def _put(self, mv: memoryview) -> int:
        size = self.topa.region_size
        done = 0
        total = len(mv)
        while done < total:
            if self._chunk < 0 or self.status & STATUS_STOPPED:
                break
            n = min(total - done, size - self._off)
            if n:
                self._mem[self._chunk][self._off:self._off + n] = mv[done:done + n]
                self._off += n
                done += n
                self.stored += n
            if self._off == size:
                if self._stop:
                    self.status = (self.status | STATUS_STOPPED) & ~STATUS_TRIGGER_EN
                    break
                self._advance()
        return done

    def _advance(self) -> None:
        """Move to the next entry after a full region (following END)."""
        self.output_mask_ptrs = mask_ptrs(self._idx + 1, 0)
        self._load_entry(advancing=True)

    # -- what readers use
    @property
    def capture_end(self) -> int:
        return self.topa.capture_end(self.output_base, self.output_mask_ptrs)

    def registers(self) -> Registers:
        return Registers(self.output_base, self.output_mask_ptrs, self.status, self.wrapped,
                         self.ovf_pending, self.stored, self.lost, self.instructions)


# ---------------------------------------------------------------- read back


def find_psb(data, start: int = 0) -> int:
    """Offset of the first PSB at or after ``start`` (as a decoder syncs),
    -1 if none. In a run of ``02 82`` pairs the PSB is the last 16 bytes."""
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    i = data.find(PSB, start)
    if i < 0:
        return -1
    while data[i + 16:i + 18] == b"\x02\x82":
        i += 2
    return i


def linearize(chunks: Sequence, capture_end: int, wrapped: bool, *,
              start_at_psb: bool = True) -> bytes:
    """The buffer's valid bytes, oldest first.

    Not wrapped: bytes [0, capture_end). Wrapped: [capture_end, end) then
    [0, capture_end), and (``start_at_psb``) from the first PSB on, so a
    decoder can sync at byte 0; empty if there is no PSB.
    """
    views = [memoryview(c).cast("B") for c in chunks]
    if not wrapped:
        out, left = [], capture_end
        for v in views:
            if left <= 0:
                break
            out.append(v[:left])
            left -= len(v)
        return b"".join(out)
    total = sum(len(v) for v in views)
    capture_end = min(max(capture_end, 0), total)
    buf = bytearray(total)
    pos, at = 0, total - capture_end          # chunk bytes before capture_end go last
    for v in views:
        n = len(v)
        lo, hi = pos, pos + n                 # this chunk's place in the buffer
        if hi <= capture_end:                 # newest part: after the older tail
            buf[at + lo:at + hi] = v
        elif lo >= capture_end:               # oldest part: first
            buf[lo - capture_end:hi - capture_end] = v
        else:
            k = capture_end - lo
            buf[at + lo:at + capture_end] = v[:k]
            buf[0:n - k] = v[k:]
        pos = hi
    if start_at_psb:
        i = find_psb(buf)
        return bytes(memoryview(buf)[i:]) if i >= 0 else b""
    return bytes(buf)
