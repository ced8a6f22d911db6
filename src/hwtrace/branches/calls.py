"""The indented function-call history (``hwtrace calls``), like a
debugger's function-call history: one line per activation in the order
they began, indented by call depth, with the activation's instruction
count and duration.  A writer for the export pipeline (``begin_stream`` /
``add`` / ``close``) fed with the call-stack builder's records
(``hwtrace.analysis.records``); no I/O: :meth:`CallHistory.lines` renders.
"""

from __future__ import annotations

from hwtrace.analysis.records import Activation, Enter, Flag, Marker


def fmt_duration(t: float, unit: str | None) -> str:
    if unit == "ns":
        for scale, u in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if t >= scale:
                return f"{t / scale:.2f}{u}"
        return f"{t:.0f}ns"
    if unit == "insns":
        return f"{t:,.0f} insns"
    return f"{t:,.0f} {unit or 'ticks'}"


#: what a line notes about its activation, in this order
_NOTES = ((Flag.BEGIN_UNKNOWN, "began before the trace"), (Flag.TRUNCATED, "truncated"),
          (Flag.TAIL_CALL, "tail call"), (Flag.UNWOUND, "unwound"),
          (Flag.SWITCHED_IN, "goes on after a switch"), (Flag.SWITCHED_OUT, "switched out"))


class _Entry:
    __slots__ = ("depth", "name", "func", "insns", "duration", "flags", "tid")

    def __init__(self, depth, name, func, flags, tid=None):
        self.tid = tid
        self.depth = depth
        self.name = name
        self.func = func
        self.insns = None
        self.duration = None
        self.flags = flags


class CallHistory:
    """Collects Enter/Activation/Marker records per stream."""

    def __init__(self, max_depth: int | None = None):
        self.max_depth = max_depth
        self.streams: list[tuple[object, str | None, list]] = []
        self._open: dict[tuple, _Entry] = {}
        self._cur: list | None = None

    def begin_stream(self, info, unit=None) -> None:
        self._cur = []
        self._open = {}
        self.streams.append((info, unit, self._cur))

    def add(self, rec) -> None:
        t = type(rec)
        if t is Enter:
            if self.max_depth is not None and rec.depth > self.max_depth:
                return
            e = _Entry(rec.depth, rec.name, rec.func, rec.flags, rec.tid)
            self._cur.append(e)
            self._open[(rec.begin_idx, rec.depth)] = e
        elif t is Activation:
            e = self._open.pop((rec.begin_idx, rec.depth), None)
            if e is None:
                return
            e.insns = rec.end_idx - rec.begin_idx
            e.duration = rec.end - rec.begin
            e.flags = rec.flags
        elif t is Marker and rec.kind != "end":
            self._cur.append(rec)

    def close(self) -> None:
        pass

    def lines(self):
        """The rendered history, line by line."""
        for info, unit, entries in self.streams:
            yield f"{info.label()}:"
            # a CPU's stream following context switches: say whose
            threads = bool(getattr(info, "switches", ()))
            for e in entries:
                if type(e) is Marker:
                    yield f"  -- {e.kind} at insn {e.idx:,}: {e.detail}"
                    continue
                name = e.name
                notes = [text for flag, text in _NOTES if e.flags & flag]
                if threads and e.tid is not None:
                    notes.append(f"tid {e.tid}")
                head = "  " * (e.depth + 1) + name
                if e.insns is None:
                    tail = "(open)"
                else:
                    tail = f"{e.insns:>10,} insns"
                    if unit != "insns":
                        tail += f"  {fmt_duration(e.duration, unit):>10}"
                note = f"  [{', '.join(notes)}]" if notes else ""
                yield f"{head:<48} {tail}{note}"
