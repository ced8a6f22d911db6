"""perf.data feature sections (header features / pipe HEADER_FEATURE).

Each parser takes the section's bytes and returns plain values; a
malformed section raises :class:`PerfDataError` with an offset into the
input.  Unknown or unneeded features are returned as bytes.  No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from . import abi
from .errors import PerfDataError


@dataclass(frozen=True, slots=True)
class BuildId:
    pid: int
    build_id: bytes
    filename: str
    cpumode: int

    @property
    def hex(self) -> str:
        return self.build_id.hex()


@dataclass(frozen=True, slots=True)
class EventDesc:
    attr: abi.PerfEventAttr
    name: str
    ids: tuple[int, ...]


class _Cursor:
    __slots__ = ("buf", "pos", "end", "base")

    def __init__(self, buf, start: int, end: int):
        self.buf, self.pos, self.end, self.base = buf, start, end, start

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PerfDataError(f"feature section too short for {what}", self.pos)

    def u(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v if len(v) > 1 else v[0]

    def string(self, what: str) -> str:
        """perf's string: u32 length (padded, NUL included), then bytes."""
        n = self.u("I", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def count(self, fmt: str, min_item: int, what: str) -> int:
        """A count, checked so that many items of >= min_item bytes fit."""
        n = self.u(fmt, what)
        self.need(n * min_item, what)
        return n


def parse_build_ids(buf, start: int, end: int) -> tuple[BuildId, ...]:
    out = []
    pos = start
    while pos + 8 <= end:
        _t, misc, size = struct.unpack_from("<IHH", buf, pos)
        if size < 8 + 4 + 24 or pos + size > end:
            raise PerfDataError("bad build-id record size", pos)
        pid = struct.unpack_from("<i", buf, pos + 8)[0]
        raw = bytes(buf[pos + 12:pos + 36])
        n = raw[20] if misc & abi.MISC_BUILD_ID_SIZE else 20
        name = bytes(buf[pos + 36:pos + size]).split(b"\0", 1)[0]
        out.append(BuildId(pid, raw[:min(n, 20)],
                           name.decode("utf-8", "surrogateescape"),
                           misc & abi.MISC_CPUMODE_MASK))
        pos += size
    return tuple(out)


def _event_desc(c: _Cursor) -> tuple[EventDesc, ...]:
    nr = c.count("I", 4, "event_desc nr")
    asize = c.u("I", "event_desc attr size")
    if asize < abi.ATTR_SIZE_VER0 and nr:
        raise PerfDataError("event_desc attr size too small", c.pos)
    out = []
    for _ in range(nr):
        c.need(asize, "event_desc attr")
        attr = abi.PerfEventAttr.unpack(c.buf, c.pos, asize)
        c.pos += asize
        nids = c.count("I", 8, "event_desc ids")
        name = c.string("event_desc name")
        ids = tuple(c.u("Q", "event_desc id") for _ in range(nids))
        out.append(EventDesc(attr, name, ids))
    return tuple(out)


def parse_feature(feat_id: int, buf, start: int, end: int) -> Any:
    """Decode one feature section ``buf[start:end]``."""
    name = abi.FEAT_NAMES[feat_id] if feat_id < len(abi.FEAT_NAMES) else None
    c = _Cursor(buf, start, end)
    if name == "BUILD_ID":
        return parse_build_ids(buf, start, end)
    if name in ("HOSTNAME", "OSRELEASE", "VERSION", "ARCH", "CPUDESC", "CPUID"):
        return c.string(name.lower())
    if name == "NRCPUS":
        avail, online = c.u("II", "nrcpus")
        return {"nr_cpus_avail": avail, "nr_cpus_online": online}
    if name == "TOTAL_MEM":
        return c.u("Q", "total_mem")
    if name == "CMDLINE":
        nr = c.count("I", 4, "cmdline nr")
        return tuple(c.string("cmdline") for _ in range(nr))
    if name == "EVENT_DESC":
        return _event_desc(c)
    if name == "PMU_MAPPINGS":
        nr = c.count("I", 8, "pmu_mappings nr")
        out = {}
        for _ in range(nr):
            typ = c.u("I", "pmu type")
            out[c.string("pmu name")] = typ
        return out
    if name == "AUXTRACE":
        nr = c.count("Q", 16, "auxtrace index nr")
        return tuple(c.u("QQ", "auxtrace index") for _ in range(nr))
    if name == "CLOCKID":
        return c.u("Q", "clockid")
    if name == "SAMPLE_TIME":
        return c.u("QQ", "sample_time")
    if name == "GROUP_DESC":
        nr = c.count("I", 12, "group_desc nr")
        return tuple((c.string("group name"), *c.u("II", "group"))
                     for _ in range(nr))
    return bytes(buf[start:end])


def parse_cpuid(cpuid: str) -> tuple[str, int, int, int] | None:
    """``GenuineIntel,6,78,3`` -> (vendor, family, model, stepping)."""
    parts = cpuid.split(",")
    if len(parts) < 4:
        return None
    try:
        return parts[0], int(parts[1], 0), int(parts[2], 0), int(parts[3], 0)
    except ValueError:
        return None
