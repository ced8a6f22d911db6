"""LLDB's per-CPU context-switch traces: raw perf_event records.

LLDB saves what perf_event wrote for a CPU-wide context-switch event
(``contextSwitchTrace``): records of ``struct perf_event_header`` (u32
type, u16 misc, u16 size) + body.  PERF_RECORD_SWITCH_CPU_WIDE (type 15)
bodies are ``u32 next_prev_pid, next_prev_tid`` followed by the sample id
LLDB asks for (``u32 pid, tid; u64 time``): the task the record is about
(the one switched in, or with PERF_RECORD_MISC_SWITCH_OUT the one switched
out) and the time on perf's clock.  Other record types are skipped.

:func:`switches` turns them into :class:`hwtrace.bundle.Switch` records
(times converted to TSC with the trace's ``tscPerfZeroConversion``), the
way the perf importer does for PERF_RECORD_SWITCH_CPU_WIDE: a switch-out
record and the switch-in record that completes it are one switch.  No I/O.
"""

from __future__ import annotations

import struct

from hwtrace import bundle as B
from hwtrace.engines.perf.records import TimeConv

SWITCH_CPU_WIDE = 15
MISC_SWITCH_OUT = 1 << 13
MAX_RECORD = 8000           # LLDB's sanity limit on a record's size
_HEADER = struct.Struct("<IHH")
_BODY = struct.Struct("<IIIIQ")


class SwitchTraceError(ValueError):
    """A context-switch trace that is not a sequence of perf records."""


def _s32(v: int) -> int:
    return v - (1 << 32) if v & (1 << 31) else v


def records(data) -> list[tuple[int, bool, int, int, int, int]]:
    """(perf time, out?, pid, tid, next_prev_pid, next_prev_tid) per
    switch record, in file order (pids/tids as signed: -1 is none)."""
    out = []
    off, end = 0, len(data)
    while off < end:
        if end - off < _HEADER.size:
            raise SwitchTraceError(f"truncated record header at offset {off}")
        typ, misc, size = _HEADER.unpack_from(data, off)
        if size < _HEADER.size or size > MAX_RECORD:
            raise SwitchTraceError(f"record of {size} bytes at offset {off}")
        if size > end - off:
            raise SwitchTraceError(f"record at offset {off} runs past the "
                                   f"end ({size} bytes, {end - off} left)")
        if typ == SWITCH_CPU_WIDE:
            if size < _HEADER.size + _BODY.size:
                raise SwitchTraceError(f"switch record of {size} bytes at "
                                       f"offset {off}")
            npid, ntid, pid, tid, time = _BODY.unpack_from(
                data, off + _HEADER.size)
            out.append((time, bool(misc & MISC_SWITCH_OUT), _s32(pid),
                        _s32(tid), _s32(npid), _s32(ntid)))
        off += size
    return out


def switches(data, cpu: int, conv: TimeConv) -> list[B.Switch]:
    """The bundle's Switch records for CPU ``cpu``'s trace ``data``."""
    out = []
    last = None         # (prev_tid, next_tid, out?) of the last one kept
    for time, is_out, pid, tid, npid, ntid in records(data):
        me, other = (pid, tid), (npid, ntid)
        prev, nxt = (me, other) if is_out else (other, me)
        if not is_out and last == (prev[1], nxt[1], True):
            last = (prev[1], nxt[1], False)     # the IN half of a logged OUT
            continue
        last = (prev[1], nxt[1], is_out)
        out.append(B.Switch(cpu=cpu, time=conv.perf_time_to_tsc(time),
                            prev_pid=prev[0], prev_tid=prev[1],
                            next_pid=nxt[0], next_tid=nxt[1]))
    return out
