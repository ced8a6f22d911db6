"""The perf mmap ring buffer and AUX area, as bytes (no I/O).

The first page of a perf event mapping is ``struct perf_event_mmap_page``;
the data ring follows (``data_offset``/``data_size``), and the AUX area is
a second mapping (``aux_offset``/``aux_size``).  ``*_head`` only grow; a
reader consumes ``[tail, head)`` modulo the size and publishes ``tail``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import PerfDataError
from .records import TimeConv

# offsets in struct perf_event_mmap_page (include/uapi/linux/perf_event.h)
OFF_VERSION = 0
OFF_CAPABILITIES = 40
OFF_TIME_SHIFT = 50
OFF_TIME_MULT = 52
OFF_TIME_ZERO = 64
OFF_TIME_CYCLES = 80
OFF_TIME_MASK = 88
OFF_DATA_HEAD = 1024
OFF_DATA_TAIL = 1032
OFF_DATA_OFFSET = 1040
OFF_DATA_SIZE = 1048
OFF_AUX_HEAD = 1056
OFF_AUX_TAIL = 1064
OFF_AUX_OFFSET = 1072
OFF_AUX_SIZE = 1080
PAGE_STRUCT_SIZE = 1088

CAP_USER_TIME = 1 << 3
CAP_USER_TIME_ZERO = 1 << 4
CAP_USER_TIME_SHORT = 1 << 5


@dataclass(frozen=True, slots=True)
class MmapPage:
    version: int
    capabilities: int
    time_shift: int
    time_mult: int
    time_zero: int
    time_cycles: int
    time_mask: int
    data_head: int
    data_tail: int
    data_offset: int
    data_size: int
    aux_head: int
    aux_tail: int
    aux_offset: int
    aux_size: int

    @classmethod
    def unpack(cls, page) -> "MmapPage":
        if len(page) < PAGE_STRUCT_SIZE:
            raise PerfDataError("perf mmap page too short", 0)
        u = lambda fmt, off: struct.unpack_from("<" + fmt, page, off)[0]  # noqa: E731
        return cls(u("I", OFF_VERSION), u("Q", OFF_CAPABILITIES), u("H", OFF_TIME_SHIFT),
                   u("I", OFF_TIME_MULT), u("Q", OFF_TIME_ZERO), u("Q", OFF_TIME_CYCLES),
                   u("Q", OFF_TIME_MASK), u("Q", OFF_DATA_HEAD), u("Q", OFF_DATA_TAIL),
                   u("Q", OFF_DATA_OFFSET), u("Q", OFF_DATA_SIZE), u("Q", OFF_AUX_HEAD),
                   u("Q", OFF_AUX_TAIL), u("Q", OFF_AUX_OFFSET), u("Q", OFF_AUX_SIZE))

    def time_conv(self) -> TimeConv | None:
        """The TSC <-> perf time conversion (TIME_CONV's fields), if offered."""
        if not self.capabilities & CAP_USER_TIME_ZERO or self.time_shift >= 64:
            return None
        short = bool(self.capabilities & CAP_USER_TIME_SHORT)
        return TimeConv(self.time_shift, self.time_mult, self.time_zero,
                        self.time_cycles, self.time_mask, True, short)


def ring_copy(area, size: int, start: int, end: int) -> bytes:
    """Bytes [start, end) of the ever-growing stream held in a ring of ``size``."""
    if end < start or end - start > size:
        raise PerfDataError(f"ring range [{start:#x}, {end:#x}) exceeds the {size:#x}-byte ring",
                            start)
    if start == end:
        return b""
    a, b = start % size, end % size
    if a < b:
        return bytes(area[a:b])
    return bytes(area[a:size]) + bytes(area[:b])


def read_records(area, size: int, tail: int, head: int) -> tuple[bytes, int]:
    """Whole records in [tail, head) of a data ring, and the new tail.

    The kernel only publishes whole records, so [tail, head) normally
    holds exactly a sequence of them; a partial one (never expected) is
    left for the next read.  A record header claiming more than what is
    there, or under 8 bytes, is a PerfDataError.
    """
    data = ring_copy(area, size, tail, head)
    pos = 0
    while pos + 8 <= len(data):
        rsize = struct.unpack_from("<H", data, pos + 6)[0]
        if rsize < 8:
            raise PerfDataError(f"ring record size {rsize}", tail + pos)
        if pos + rsize > len(data):
            break
        pos += rsize
    return data[:pos], tail + pos


@dataclass(frozen=True, slots=True)
class AuxChunk:
    data: bytes
    lost: int          # bytes overwritten before they could be read


def aux_read(area, size: int, old_head: int, new_head: int) -> AuxChunk:
    """Full-trace mode: what the kernel wrote since ``old_head``.

    If more than the area's size was written the oldest bytes are gone;
    only the last ``size`` are returned and the rest counted as lost.
    """
    if new_head < old_head:
        raise PerfDataError("aux head went backwards", old_head)
    lost = max(0, new_head - old_head - size)
    return AuxChunk(ring_copy(area, size, old_head + lost, new_head), lost)


def aux_snapshot(area, size: int, head: int) -> AuxChunk:
    """Snapshot (overwrite) mode: the area's contents, oldest byte first."""
    if head <= size:
        return AuxChunk(bytes(area[:head]), 0)
    return AuxChunk(ring_copy(area, size, head - size, head), head - size)
