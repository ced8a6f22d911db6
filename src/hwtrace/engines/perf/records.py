"""perf record bodies: typed, immutable, decoded from bytes (no I/O).

One ``Record`` per perf_event record: where it was (``offset``), its header
(``type``, ``misc``, ``size``), its decoded ``body`` and, for kernel records
of an attr with ``sample_id_all``, the ``sample_id`` trailer.  Every read is
bounds-checked against the record's own size; a malformed record raises
:class:`PerfDataError` with the record's offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import abi
from .errors import PerfDataError

_HDR = struct.Struct("<IHH")


class Record(NamedTuple):
    offset: int          # of the record header in the input
    type: int
    misc: int
    size: int            # header.size (the AUXTRACE payload comes on top)
    body: Any
    sample_id: "SampleId | None" = None

    @property
    def name(self) -> str:
        return abi.RECORD_NAMES.get(self.type, f"UNKNOWN_{self.type}")


@dataclass(frozen=True, slots=True)
class SampleId:
    """The sample_id_all trailer (fields absent from sample_type are None)."""
    pid: int | None = None
    tid: int | None = None
    time: int | None = None
    id: int | None = None
    stream_id: int | None = None
    cpu: int | None = None
    identifier: int | None = None


@dataclass(frozen=True, slots=True)
class Mmap:
    pid: int
    tid: int
    addr: int
    len: int
    pgoff: int
    filename: str
    executable: bool          # not MISC_MMAP_DATA


@dataclass(frozen=True, slots=True)
class Mmap2:
    pid: int
    tid: int
    addr: int
    len: int
    pgoff: int
    maj: int | None
    min: int | None
    ino: int | None
    ino_generation: int | None
    build_id: bytes | None    # when the kernel put one in (MISC_MMAP_BUILD_ID)
    prot: int
    flags: int
    filename: str

    @property
    def executable(self) -> bool:
        return bool(self.prot & 4)    # PROT_EXEC


@dataclass(frozen=True, slots=True)
class Comm:
    pid: int
    tid: int
    comm: str
    exec: bool


@dataclass(frozen=True, slots=True)
class Task:
    """FORK or EXIT."""
    pid: int
    ppid: int
    tid: int
    ptid: int
    time: int


@dataclass(frozen=True, slots=True)
class Lost:
    id: int
    lost: int


@dataclass(frozen=True, slots=True)
class Throttle:
    time: int
    id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class Sample:
    """The fixed leading fields of a SAMPLE (None when not sampled)."""
    identifier: int | None
    ip: int | None
    pid: int | None
    tid: int | None
    time: int | None
    addr: int | None
    id: int | None
    stream_id: int | None
    cpu: int | None
    period: int | None


@dataclass(frozen=True, slots=True)
class Aux:
    aux_offset: int
    aux_size: int
    flags: int

    @property
    def truncated(self) -> bool:
        return bool(self.flags & abi.AUX_FLAG_TRUNCATED)

    @property
    def overwrite(self) -> bool:
        return bool(self.flags & abi.AUX_FLAG_OVERWRITE)

    @property
    def partial(self) -> bool:
        return bool(self.flags & abi.AUX_FLAG_PARTIAL)

    @property
    def collision(self) -> bool:
        return bool(self.flags & abi.AUX_FLAG_COLLISION)


@dataclass(frozen=True, slots=True)
class ItraceStart:
    pid: int
    tid: int


@dataclass(frozen=True, slots=True)
class LostSamples:
    lost: int


@dataclass(frozen=True, slots=True)
class Switch:
    """SWITCH (next_prev_* None) or SWITCH_CPU_WIDE."""
    out: bool
    preempt: bool
    next_prev_pid: int | None = None
    next_prev_tid: int | None = None


@dataclass(frozen=True, slots=True)
class HeaderAttr:
    attr: abi.PerfEventAttr
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HeaderEventType:
    event_id: int
    name: str


@dataclass(frozen=True, slots=True)
class TracingData:
    size: int                 # bytes following the record


@dataclass(frozen=True, slots=True)
class HeaderBuildId:
    pid: int
    build_id: bytes
    filename: str
    cpumode: int


@dataclass(frozen=True, slots=True)
class FinishedRound:
    pass


@dataclass(frozen=True, slots=True)
class IdIndexEntry:
    id: int
    idx: int
    cpu: int
    tid: int


@dataclass(frozen=True, slots=True)
class IdIndex:
    entries: tuple[IdIndexEntry, ...]


@dataclass(frozen=True, slots=True)
class AuxtraceInfo:
    type: int                 # 1 = Intel PT, 2 = Intel BTS, ...
    priv: tuple[int, ...]     # interpret with intel_pt.PtInfo.from_priv
    priv_bytes: bytes


@dataclass(frozen=True, slots=True)
class Auxtrace:
    size: int
    offset: int
    reference: int
    idx: int
    tid: int
    cpu: int
    data_offset: int          # where the payload starts in the input


@dataclass(frozen=True, slots=True)
class AuxtraceError:
    type: int
    code: int
    cpu: int
    pid: int
    tid: int
    fmt: int
    ip: int
    time: int | None
    msg: str


@dataclass(frozen=True, slots=True)
class ThreadMap:
    entries: tuple[tuple[int, str], ...]     # (pid, comm)


@dataclass(frozen=True, slots=True)
class CpuMap:
    cpus: tuple[int, ...] | None   # None for an encoding we keep raw
    raw: bytes


@dataclass(frozen=True, slots=True)
class StatConfig:
    entries: tuple[tuple[int, int], ...]     # (tag, value)


@dataclass(frozen=True, slots=True)
class Stat:
    id: int
    cpu: int
    thread: int
    val: int
    ena: int
    run: int


@dataclass(frozen=True, slots=True)
class StatRound:
    type: int
    time: int


@dataclass(frozen=True, slots=True)
class TimeConv:
    time_shift: int
    time_mult: int
    time_zero: int
    time_cycles: int | None = None
    time_mask: int | None = None
    cap_user_time_zero: bool | None = None
    cap_user_time_short: bool | None = None

    def tsc_to_perf_time(self, tsc: int) -> int:
        """perf_event clock (ns) of a TSC value, per perf_event_mmap_page."""
        if self.cap_user_time_short and self.time_mask is not None:
            tsc = self.time_cycles + ((tsc - self.time_cycles) & self.time_mask)
        quot, rem = divmod(tsc, 1 << self.time_shift) if self.time_shift < 64 else (0, tsc)
        return (self.time_zero + quot * self.time_mult
                + ((rem * self.time_mult) >> self.time_shift)) & ((1 << 64) - 1)

    def perf_time_to_tsc(self, ns: int) -> int:
        t = (ns - self.time_zero) & ((1 << 64) - 1)
        if self.time_mult == 0:
            return 0
        quot, rem = divmod(t, self.time_mult)
        # u64 like perf's own arithmetic: a hostile time_mult/time_shift
        # must not yield a "TSC" no 64-bit reader (nor the bundle) accepts.
        shift = min(self.time_shift, 64)
        return ((quot << shift) + (rem << shift) // self.time_mult) & ((1 << 64) - 1)


@dataclass(frozen=True, slots=True)
class HeaderFeature:
    feat_id: int
    data_offset: int
    data_size: int


@dataclass(frozen=True, slots=True)
class Opaque:
    """A record kept as bytes (unknown, or not needed decoded)."""
    data: bytes


# --------------------------------------------------------------------------
class _View:
    """Bounds-checked little-endian reads inside one record."""
    __slots__ = ("buf", "pos", "end", "rec")

    def __init__(self, buf, start: int, end: int, rec: int):
        self.buf, self.pos, self.end, self.rec = buf, start, end, rec

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PerfDataError(f"record too short for {what}", self.rec)

    def u(self, fmt: str, what: str):
        s = struct.calcsize(fmt)
        self.need(s, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += s
        return v if len(v) > 1 else v[0]

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def left(self) -> int:
        return self.end - self.pos

    def cstr(self, what: str, n: int | None = None) -> str:
        """A NUL-terminated string in the next ``n`` bytes (default: all)."""
        n = self.left() if n is None else n
        raw = self.bytes(n, what)
        return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_SAMPLE_ID_ORDER = (
    (abi.SAMPLE_TID, ("pid", "tid")), (abi.SAMPLE_TIME, ("time",)),
    (abi.SAMPLE_ID, ("id",)), (abi.SAMPLE_STREAM_ID, ("stream_id",)),
    (abi.SAMPLE_CPU, ("cpu", None)), (abi.SAMPLE_IDENTIFIER, ("identifier",)),
)


def sample_id_size(sample_type: int) -> int:
    """Bytes of the sample_id_all trailer for this sample_type."""
    return 8 * sum(1 for bit, _ in _SAMPLE_ID_ORDER if sample_type & bit)


def parse_sample_id(buf, start: int, sample_type: int) -> SampleId:
    """Decode a trailer at ``start`` (the caller checked its size)."""
    vals: dict[str, int] = {}
    pos = start
    for bit, names in _SAMPLE_ID_ORDER:
        if not sample_type & bit:
            continue
        if len(names) == 2:
            a, b = struct.unpack_from("<II", buf, pos)
            vals[names[0]] = a
            if names[1]:
                vals[names[1]] = b
        else:
            vals[names[0]] = struct.unpack_from("<Q", buf, pos)[0]
        pos += 8
    return SampleId(**vals)


def _sample(v: _View, st: int) -> Sample:
    f: dict[str, int | None] = dict.fromkeys(
        ("identifier", "ip", "pid", "tid", "time", "addr", "id", "stream_id",
         "cpu", "period"))
    if st & abi.SAMPLE_IDENTIFIER:
        f["identifier"] = v.u("Q", "sample identifier")
    if st & abi.SAMPLE_IP:
        f["ip"] = v.u("Q", "sample ip")
    if st & abi.SAMPLE_TID:
        f["pid"], f["tid"] = v.u("II", "sample pid/tid")
    if st & abi.SAMPLE_TIME:
        f["time"] = v.u("Q", "sample time")
    if st & abi.SAMPLE_ADDR:
        f["addr"] = v.u("Q", "sample addr")
    if st & abi.SAMPLE_ID:
        f["id"] = v.u("Q", "sample id")
    if st & abi.SAMPLE_STREAM_ID:
        f["stream_id"] = v.u("Q", "sample stream_id")
    if st & abi.SAMPLE_CPU:
        f["cpu"] = v.u("II", "sample cpu")[0]
    if st & abi.SAMPLE_PERIOD:
        f["period"] = v.u("Q", "sample period")
    return Sample(**f)


def _mmap2(v: _View, misc: int) -> Mmap2:
    pid, tid, addr, ln, pgoff = v.u("IIQQQ", "mmap2")
    if misc & abi.MISC_MMAP_BUILD_ID:
        bsize = v.u("B", "mmap2 build-id size")
        v.bytes(3, "mmap2 reserved")
        raw = v.bytes(20, "mmap2 build-id")
        maj = mn = ino = gen = None
        build_id = raw[:min(bsize, 20)]
    else:
        maj, mn, ino, gen = v.u("IIQQ", "mmap2 device")
        build_id = None
    prot, flags = v.u("II", "mmap2 prot/flags")
    return Mmap2(pid, tid, addr, ln, pgoff, maj, mn, ino, gen, build_id,
                 prot, flags, v.cstr("mmap2 filename"))


def _cpu_map(v: _View) -> CpuMap:
    raw = v.bytes(v.left(), "cpu map")
    if len(raw) >= 4:
        kind, nr = struct.unpack_from("<HH", raw, 0)
        if kind == 0 and 4 + 2 * nr <= len(raw):        # list of cpus
            return CpuMap(struct.unpack_from(f"<{nr}H", raw, 4), raw)
        if kind == 1 and len(raw) >= 6:                  # bitmask
            long_size = struct.unpack_from("<H", raw, 4)[0]
            start = 6 if long_size == 4 else 10          # u64 words: 4 pad bytes
            if long_size in (4, 8) and start + nr * long_size <= len(raw):
                code = "I" if long_size == 4 else "Q"
                words = struct.unpack_from(f"<{nr}{code}", raw, start)
                cpus = tuple(i * 8 * long_size + b for i, w in enumerate(words)
                             for b in range(8 * long_size) if w >> b & 1)
                return CpuMap(cpus, raw)
        if kind == 2 and len(raw) >= 8:                  # range
            _any, _pad, first, last = struct.unpack_from("<BBHH", raw, 2)
            if first <= last:
                return CpuMap(tuple(range(first, last + 1)), raw)
    return CpuMap(None, raw)


def decode_body(buf, offset: int, rtype: int, misc: int, size: int,
                body_end: int, sample_type: int) -> Any:
    """Decode the body of the record at ``offset`` up to ``body_end``."""
    v = _View(buf, offset + 8, body_end, offset)
    t = rtype
    hsize = size
    if t == abi.MMAP:
        pid, tid, addr, ln, pgoff = v.u("IIQQQ", "mmap")
        return Mmap(pid, tid, addr, ln, pgoff, v.cstr("mmap filename"),
                    not misc & abi.MISC_MMAP_DATA)
    if t == abi.MMAP2:
        return _mmap2(v, misc)
    if t == abi.COMM:
        pid, tid = v.u("II", "comm")
        return Comm(pid, tid, v.cstr("comm"), bool(misc & abi.MISC_COMM_EXEC))
    if t in (abi.FORK, abi.EXIT):
        return Task(*v.u("IIIIQ", "fork/exit"))
    if t == abi.LOST:
        return Lost(*v.u("QQ", "lost"))
    if t in (abi.THROTTLE, abi.UNTHROTTLE):
        return Throttle(*v.u("QQQ", "throttle"))
    if t == abi.SAMPLE:
        return _sample(v, sample_type)
    if t == abi.AUX:
        return Aux(*v.u("QQQ", "aux"))
    if t == abi.ITRACE_START:
        return ItraceStart(*v.u("II", "itrace_start"))
    if t == abi.LOST_SAMPLES:
        return LostSamples(v.u("Q", "lost_samples"))
    if t in (abi.SWITCH, abi.SWITCH_CPU_WIDE):
        out = bool(misc & abi.MISC_SWITCH_OUT)
        pre = bool(misc & abi.MISC_SWITCH_OUT_PREEMPT)
        if t == abi.SWITCH:
            return Switch(out, pre)
        return Switch(out, pre, *v.u("II", "switch_cpu_wide"))
    if t == abi.HEADER_ATTR:
        v.need(abi.ATTR_SIZE_VER0, "attr")
        asize = struct.unpack_from("<I", buf, v.pos + 4)[0] or abi.ATTR_SIZE_VER0
        v.need(asize, "attr")
        attr = abi.PerfEventAttr.unpack(buf, v.pos, asize)
        v.pos += asize
        n = v.left() // 8
        return HeaderAttr(attr, v.u(f"{n}Q", "attr ids") if n > 1 else
                          ((v.u("Q", "attr id"),) if n else ()))
    if t == abi.HEADER_EVENT_TYPE:
        return HeaderEventType(v.u("Q", "event type"), v.cstr("event type name"))
    if t == abi.HEADER_TRACING_DATA:
        return TracingData(v.u("I", "tracing data size"))
    if t == abi.HEADER_BUILD_ID:
        pid = v.u("i", "build-id pid")
        raw = v.bytes(24, "build-id")
        n = raw[20] if misc & abi.MISC_BUILD_ID_SIZE else 20
        return HeaderBuildId(pid, raw[:min(n, 20)], v.cstr("build-id filename"),
                             misc & abi.MISC_CPUMODE_MASK)
    if t == abi.FINISHED_ROUND or t == abi.FINISHED_INIT:
        return FinishedRound()
    if t == abi.ID_INDEX:
        nr = v.u("Q", "id_index nr")
        v.need(nr * 32, "id_index entries")      # checked before reading
        return IdIndex(tuple(IdIndexEntry(*v.u("QQQQ", "id_index"))
                             for _ in range(nr)))
    if t == abi.AUXTRACE_INFO:
        kind, _res = v.u("II", "auxtrace_info")
        raw = v.bytes(v.left(), "auxtrace_info priv")
        n = len(raw) // 8
        return AuxtraceInfo(kind, struct.unpack_from(f"<{n}Q", raw), raw)
    if t == abi.AUXTRACE:
        size, off, ref, idx, tid, cpu, _r = v.u("QQQIIII", "auxtrace")
        return Auxtrace(size, off, ref, idx, tid, cpu, offset + hsize)
    if t == abi.AUXTRACE_ERROR:
        kind, code, cpu, pid, tid, fmt, ip = v.u("IIIIIIQ", "auxtrace_error")
        tm = v.u("Q", "auxtrace_error time") if fmt >= 1 else None
        msg = v.cstr("auxtrace_error msg", min(64, v.left()))
        return AuxtraceError(kind, code, cpu, pid, tid, fmt, ip, tm, msg)
    if t == abi.THREAD_MAP:
        nr = v.u("Q", "thread_map nr")
        v.need(nr * 24, "thread_map entries")
        return ThreadMap(tuple((v.u("Q", "pid"), v.cstr("thread comm", 16))
                               for _ in range(nr)))
    if t == abi.CPU_MAP:
        return _cpu_map(v)
    if t == abi.STAT_CONFIG:
        nr = v.u("Q", "stat_config nr")
        v.need(nr * 16, "stat_config entries")
        return StatConfig(tuple(v.u("QQ", "stat_config") for _ in range(nr)))
    if t == abi.STAT:
        return Stat(*v.u("QIIQQQ", "stat"))
    if t == abi.STAT_ROUND:
        return StatRound(*v.u("QQ", "stat_round"))
    if t == abi.TIME_CONV:
        shift, mult, zero = v.u("QQQ", "time_conv")
        if shift >= 64:
            raise PerfDataError(f"TIME_CONV time_shift {shift} is not below 64", offset)
        if v.left() >= 24:
            cycles, mask, z, short = v.u("QQBB", "time_conv ext")
            return TimeConv(shift, mult, zero, cycles, mask, bool(z), bool(short))
        return TimeConv(shift, mult, zero)
    if t == abi.HEADER_FEATURE:
        fid = v.u("Q", "feature id")
        return HeaderFeature(fid, v.pos, v.left())
    return Opaque(v.bytes(v.left(), "record"))


HEADER = _HDR
