"""perf records -> trace-bundle sideband and per-CPU / per-thread streams.

Pure data transformation (no I/O): :func:`convert` takes a
:class:`~.perfdata.PerfData` (or any record iterable plus AUX payload
getter) and returns a :class:`Converted` with the bundle's sideband records
(:mod:`hwtrace.bundle` types), the PT streams as lists of payload slices in
trace order, and the metadata the manifest needs.  Times are converted from
perf's clock to TSC with TIME_CONV when the file has it (the PT trace's own
timebase), so sideband and trace packets can be correlated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hwtrace import bundle as B

from . import abi
from .intel_pt import AUXTRACE_INTEL_PT, PtInfo
from .records import Record, TimeConv

_U32_NEG = 0xffffffff


def _s32(v: int | None) -> int:
    return -1 if v is None or v == _U32_NEG else v


def _build_id_of(filename: str, build_ids: dict[str, bytes]) -> bytes | None:
    bid = build_ids.get(filename)
    if bid is None and filename.startswith("[kernel.kallsyms]"):
        bid = build_ids.get("[kernel.kallsyms]")     # "[kernel.kallsyms]_text" etc.
    return bid


def _prot(prot: int) -> str:
    return ("r" if prot & 1 else "-") + ("w" if prot & 2 else "-") + ("x" if prot & 4 else "-")


@dataclass(slots=True)
class StreamParts:
    """The AUXTRACE payloads of one CPU (or thread), in trace order."""
    cpu: int | None
    tid: int | None
    pid: int | None = None
    parts: list[tuple[int, Any]] = field(default_factory=list)   # (aux offset, bytes)
    lost_bytes: int = 0
    truncated: bool = False

    @property
    def size(self) -> int:
        return sum(len(p) for _o, p in self.parts)


@dataclass(slots=True)
class Converted:
    sideband: list[Any]
    streams: list[StreamParts]
    pt_info: PtInfo | None
    pt_config: int | None
    time_conv: TimeConv | None
    aux_events: list[dict[str, Any]]
    itrace_starts: list[dict[str, Any]]
    lost: list[dict[str, Any]]
    mode: str


class _Clock:
    def __init__(self):
        self.tc: TimeConv | None = None

    def __call__(self, t: int | None) -> int:
        if not t:                 # synthesized records carry time 0
            return 0
        return self.tc.perf_time_to_tsc(t) if self.tc is not None else t


def _with_exes(sb: list[Any], execs: set[int]) -> list[Any]:
    """Fill the exe of processes that exec'd (``execs``: their ids) with the
    first file-backed executable mapping of that pid after them."""
    out = []
    for i, r in enumerate(sb):
        if id(r) in execs:
            exe = next((m.file for m in sb[i + 1:] if isinstance(m, B.Mmap) and m.pid == r.pid
                        and m.file.startswith("/") and not m.file.startswith("//")), "")
            if exe:
                r = r._replace(exe=exe)
        out.append(r)
    return out


def convert(records: Iterable[Record], aux_payload: Callable[[Record], Any], *,
            build_ids: dict[str, bytes] | None = None,
            pt_attr_config: int | None = None,
            time_conv: TimeConv | None = None) -> Converted:
    """Walk the records once and sort them into bundle material.

    ``time_conv`` converts times before a TIME_CONV record is seen (the
    live engine takes it from the perf mmap page).
    """
    build_ids = build_ids or {}
    clock = _Clock()
    clock.tc = time_conv
    sb: list[Any] = []
    streams: dict[tuple[int | None, int | None], StreamParts] = {}
    info: PtInfo | None = None
    aux_events: list[dict[str, Any]] = []
    starts: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    comms: dict[int, str] = {}
    execs: set[int] = set()
    last_switch: dict[int, tuple[int, int, int]] = {}

    def when(rec: Record, fallback: int | None = None) -> int:
        t = rec.sample_id.time if rec.sample_id is not None else None
        return clock(t if t is not None else fallback)

    for rec in records:
        t, b, sid = rec.type, rec.body, rec.sample_id
        if t == abi.TIME_CONV:
            clock.tc = b
        elif t == abi.AUXTRACE_INFO and b.type == AUXTRACE_INTEL_PT:
            info = PtInfo.from_priv(b.priv, rec.offset)
        elif t == abi.AUXTRACE:
            per_cpu = info is None or info.per_cpu_mmaps
            key = (b.cpu, None) if per_cpu and b.cpu != _U32_NEG else (None, b.tid)
            s = streams.get(key)
            if s is None:
                s = streams[key] = StreamParts(key[0], key[1])
            if s.parts:
                end = s.parts[-1][0] + len(s.parts[-1][1])
                if b.offset > end:
                    s.lost_bytes += b.offset - end
            s.parts.append((b.offset, aux_payload(rec)))
        elif t in (abi.MMAP, abi.MMAP2):
            exe = b.executable if t == abi.MMAP else b.executable
            if not exe:
                continue
            bid = b.build_id if t == abi.MMAP2 and b.build_id else _build_id_of(b.filename,
                                                                                build_ids)
            prot = _prot(b.prot) if t == abi.MMAP2 else "r-x"
            sb.append(B.Mmap(pid=_s32(b.pid), start=b.addr, size=b.len, offset=b.pgoff,
                             file=b.filename, build_id=bid.hex() if bid else "",
                             prot=prot, time=when(rec)))
        elif t == abi.COMM:
            comms[b.tid] = b.comm
            if b.pid == b.tid:
                sb.append(B.Process(pid=b.pid, cr3=0, comm=b.comm, time=when(rec)))
                if b.exec:
                    execs.add(id(sb[-1]))
            else:
                sb.append(B.Thread(tid=b.tid, pid=b.pid, time=when(rec)))
        elif t == abi.FORK:
            tm = when(rec, b.time)
            if b.pid != b.ppid:
                sb.append(B.Process(pid=b.pid, cr3=0, comm=comms.get(b.ptid, ""),
                                    ppid=b.ppid, time=tm))
            sb.append(B.Thread(tid=b.tid, pid=b.pid, time=tm, parent_tid=b.ptid))
        elif t == abi.EXIT:
            sb.append(B.Exit(pid=b.pid, tid=b.tid, time=when(rec, b.time)))
        elif t in (abi.SWITCH, abi.SWITCH_CPU_WIDE) and sid is not None:
            cpu = sid.cpu if sid.cpu is not None else -1
            me = (_s32(sid.pid), _s32(sid.tid))
            other = ((_s32(b.next_prev_pid), _s32(b.next_prev_tid))
                     if t == abi.SWITCH_CPU_WIDE else (-1, -1))
            prev, nxt = (me, other) if b.out else (other, me)
            tm = when(rec)
            if not b.out and last_switch.get(cpu) == (prev[1], nxt[1], 1):
                last_switch[cpu] = (prev[1], nxt[1], 0)      # IN half of a logged OUT
                continue
            last_switch[cpu] = (prev[1], nxt[1], int(b.out))
            sb.append(B.Switch(cpu=cpu, time=tm, prev_pid=prev[0], prev_tid=prev[1],
                               next_pid=nxt[0], next_tid=nxt[1]))
        elif t == abi.AUX:
            ev = {"cpu": _s32(sid.cpu) if sid else -1, "tid": _s32(sid.tid) if sid else -1,
                  "time": when(rec), "aux_offset": b.aux_offset, "aux_size": b.aux_size,
                  "truncated": b.truncated, "overwrite": b.overwrite,
                  "partial": b.partial, "collision": b.collision}
            aux_events.append(ev)
            if b.truncated or b.collision:
                lost.append({"kind": "truncated" if b.truncated else "collision", **ev})
        elif t == abi.ITRACE_START:
            starts.append({"pid": b.pid, "tid": b.tid, "time": when(rec),
                           "cpu": _s32(sid.cpu) if sid else -1})
        elif t in (abi.LOST, abi.LOST_SAMPLES):
            lost.append({"kind": "lost_records", "count": b.lost,
                         "cpu": _s32(sid.cpu) if sid else -1, "time": when(rec)})

    sb.sort(key=lambda r: r.time)         # stable: file order within a time
    sb = _with_exes(sb, execs)
    out_streams = sorted(streams.values(),
                         key=lambda s: (s.cpu is None, s.cpu or 0, s.tid or 0))
    for s in out_streams:
        s.parts.sort(key=lambda p: p[0])
        if s.tid is not None:
            s.pid = next((x.pid for x in sb if isinstance(x, B.Thread) and x.tid == s.tid),
                         s.tid)
    for ev in aux_events:
        if ev["truncated"]:
            for s in out_streams:
                if s.cpu == ev["cpu"] or (s.cpu is None and s.tid == ev["tid"]):
                    s.truncated = True
    mode = "cpu" if info is None or info.per_cpu_mmaps else "thread"
    return Converted(sb, out_streams, info, pt_attr_config, clock.tc, aux_events,
                     starts, lost, mode)
