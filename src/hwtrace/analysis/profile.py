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
    func: int | None = None
    calls: int = 0
    incl_insns: int = 0
    excl_insns: int = 0
    incl_time: float = 0.0
    excl_time: float = 0.0
    truncated: int = 0


@dataclass
class Profile:
    #: keyed by (name, function start): two functions of the same name
    #: (``_start`` of ld.so and of the program) stay apart
    funcs: dict[tuple, FuncStats] = field(default_factory=dict)
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
            key = (rec.name, rec.func)
            self._active[key] = self._active.get(key, 0) + 1
        elif t is Activation:
            key = (rec.name, rec.func)
            s = self.funcs.get(key)
            if s is None:
                s = self.funcs[key] = FuncStats(rec.name, rec.func)
            if not rec.flags & (Flag.BEGIN_UNKNOWN | Flag.SWITCHED_IN):
                s.calls += 1        # a slice going on with an earlier call is none
            if rec.flags & Flag.TRUNCATED:
                s.truncated += 1
            si = rec.self_insns
            s.excl_insns += si
            s.excl_time += rec.self_time
            self.insns += si
            self.time += rec.self_time
            n = self._active.get(key, 0)
            if n <= 1:
                s.incl_insns += rec.end_idx - rec.begin_idx
                s.incl_time += rec.end - rec.begin
                self._active.pop(key, None)
            else:
                self._active[key] = n - 1
        elif t is Marker:
            self.markers[rec.kind] = self.markers.get(rec.kind, 0) + 1
            if len(self.marker_samples) < 5:
                self.marker_samples.append(rec)

    def close(self) -> None:
        pass

    def display_names(self) -> dict[tuple, str]:
        """Names for display: the name, with ``@0xADDR`` where two functions
        share it."""
        count: dict[str, int] = {}
        for name, _f in self.funcs:
            count[name] = count.get(name, 0) + 1
        return {(name, f): (name if count[name] == 1 or f is None else f"{name}@{f:#x}")
                for name, f in self.funcs}

    def top(self, key: str = "excl_insns", n: int = 15) -> list[FuncStats]:
        return sorted(self.funcs.values(), key=lambda s: getattr(s, key),
                      reverse=True)[:n]
