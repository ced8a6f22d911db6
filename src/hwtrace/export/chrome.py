"""Chrome trace-event JSON, written as the records come.

One ``"X"`` (complete) event per activation on the track of its thread
(``pid``/``tid``; in cpu mode one process "CPUs" with a track per CPU),
``"i"`` instant events for markers (gaps, overflows, decode errors), and
``"M"`` metadata naming processes and threads.  ``ts``/``dur`` are
microseconds from the start of the first stream written, on a 2**-10 us
grid (exact in binary floating point, so nesting survives ``ts + dur``); instruction-count clocks show
one instruction as one nanosecond (``otherData.clock`` says which).
Format: the Trace Event Format document (Google, "JSON Object Format").
"""

from __future__ import annotations

import json

from hwtrace.analysis.records import Activation, Enter, Marker, StreamInfo
from hwtrace.export import UNITS_PER_US, flag_names


#: the made-up process that holds one track per CPU in cpu mode (same as
#: the Perfetto writer's)
CPU_PID = 0x7FFF0000


class ChromeTraceWriter:
    """``args=True`` adds per-slice args (instructions, address, flags);
    off by default because speedscope makes every distinct args object a
    distinct frame (``fib {"insns":8}``), which splits its aggregate views.
    Activations with flags (truncated, unwound, ...) always carry them."""

    def __init__(self, fp, origin: float | None = None, args: bool = False):
        self._fp = fp
        self._args = args
        self._origin = origin
        self._first = True
        self._names: dict[str, str] = {}
        self._pid = 0
        self._tid = 0
        self._div = 1000.0
        self._units: set[str] = set()
        self.slices = 0
        self.instants = 0
        self._seen_pids: set = set()
        fp.write('{"traceEvents":[\n')

    def _event(self, s: str) -> None:
        if self._first:
            self._first = False
            self._fp.write(s)
        else:
            self._fp.write(",\n" + s)

    def begin_stream(self, info: StreamInfo, unit: str | None = "insns") -> None:
        if info.tid is None and info.cpu is not None:
            pid, tid, pname = CPU_PID, info.cpu, "CPUs"
        else:
            pid = info.pid if info.pid is not None else 0
            tid = info.tid if info.tid is not None else 0
            pname = f"process {pid}"
        self._pid, self._tid = pid, tid
        self._div = UNITS_PER_US.get(unit, 1000.0)
        self._units.add(unit or "insns")
        if pid not in self._seen_pids:
            self._seen_pids.add(pid)
            self._event(json.dumps({"ph": "M", "name": "process_name", "pid": pid,
                                    "tid": tid, "args": {"name": pname}}))
        self._event(json.dumps({"ph": "M", "name": "thread_name", "pid": pid,
                                "tid": tid, "args": {"name": info.label()}}))

    def _us(self, t: float) -> float:
        """Microseconds from the origin, on a grid of 2**-10 us: such values
        are exact doubles and so are their sums, so a viewer's ``ts + dur``
        lands exactly on the next slice's ``ts`` (with decimal fractions
        touching siblings would overlap by a rounding error and nest)."""
        if self._origin is None:
            self._origin = t
        return round((t - self._origin) / self._div * 1024) / 1024

    def add(self, rec) -> None:
        if self._origin is None and type(rec) is Enter:
            self._origin = rec.begin        # the stream's earliest time
        if type(rec) is Activation:
            name = self._names.get(rec.name)
            if name is None:
                name = self._names[rec.name] = json.dumps(rec.name)
                if len(self._names) > 1 << 20:
                    self._names.clear()
            b = self._us(rec.begin)
            ts = repr(b)
            dur = repr(self._us(rec.end) - b)
            if self._args:
                args = (f',"args":{{"insns":{rec.end_idx - rec.begin_idx},'
                        f'"self_insns":{rec.self_insns}')
                if rec.func is not None:
                    args += f',"addr":"0x{rec.func:x}"'
                if rec.flags:
                    args += f',"flags":"{flag_names(rec.flags)}"'
                args += "}"
            elif rec.flags:
                args = f',"args":{{"flags":"{flag_names(rec.flags)}"}}'
            else:
                args = ""
            self._event(f'{{"ph":"X","name":{name},"cat":"call","ts":{ts},'
                        f'"dur":{dur},"pid":{self._pid},"tid":{self._tid}'
                        f'{args}}}')
            self.slices += 1
        elif type(rec) is Marker:
            args = {"detail": rec.detail, "insn": rec.idx}
            if rec.offset is not None:
                args["offset"] = rec.offset
            self._event(json.dumps({"ph": "i", "s": "t", "name": rec.kind,
                                    "cat": "trace", "ts": self._us(rec.time),
                                    "pid": self._pid, "tid": self._tid,
                                    "args": args}))
            self.instants += 1

    def close(self, other: dict | None = None) -> None:
        units = sorted(self._units)
        data = {"producer": "hwtrace", "clock": units[0] if len(units) == 1 else units}
        if other:
            data.update(other)
        self._fp.write('\n],"displayTimeUnit":"ns","otherData":'
                       + json.dumps(data) + "}\n")
