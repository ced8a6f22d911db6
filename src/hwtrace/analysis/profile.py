"""Per-function totals from the record stream (no I/O): calls, inclusive
and exclusive instructions and time, plus markers (lost data, errors).

Inclusive totals count only the outermost activation of a function on the
stack, so recursion is not counted twice (fib's inclusive time is the time
of the top-level fib call, not the sum over the whole recursion).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwtrace.analysis.records import Activation, Enter, Flag, Marker


@dataclass
class FuncStats:
    name: str
    calls: int = 0
    incl_insns: int = 0
    excl_insns: int = 0
    incl_time: float = 0.0
    excl_time: float = 0.0
    truncated: int = 0


@dataclass
class Profile:
    funcs: dict[str, FuncStats] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)
    marker_samples: list = field(default_factory=list)
    insns: int = 0
    time: float = 0.0
    streams: int = 0
    units: set = field(default_factory=set)
    _active: dict = field(default_factory=dict)

    def begin_stream(self, info, unit=None) -> None:
        self.streams += 1
        self._active = {}
        if unit:
            self.units.add(unit)

    def add(self, rec) -> None:
        t = type(rec)
        if t is Enter:
            self._active[rec.name] = self._active.get(rec.name, 0) + 1
        elif t is Activation:
            s = self.funcs.get(rec.name)
            if s is None:
                s = self.funcs[rec.name] = FuncStats(rec.name)
            if not rec.flags & Flag.BEGIN_UNKNOWN:
                s.calls += 1
            if rec.flags & Flag.TRUNCATED:
                s.truncated += 1
            si = rec.self_insns
            s.excl_insns += si
            s.excl_time += rec.self_time
            self.insns += si
            self.time += rec.self_time
            n = self._active.get(rec.name, 0)
            if n <= 1:
                s.incl_insns += rec.end_idx - rec.begin_idx
                s.incl_time += rec.end - rec.begin
                self._active.pop(rec.name, None)
            else:
                self._active[rec.name] = n - 1
        elif t is Marker:
            self.markers[rec.kind] = self.markers.get(rec.kind, 0) + 1
            if len(self.marker_samples) < 5:
                self.marker_samples.append(rec)

    def close(self) -> None:
        pass

    def top(self, key: str = "excl_insns", n: int = 15) -> list[FuncStats]:
        return sorted(self.funcs.values(), key=lambda s: getattr(s, key),
                      reverse=True)[:n]
