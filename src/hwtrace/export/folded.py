"""Flame-graph folded stacks (Brendan Gregg's ``stackcollapse`` format).

One line per distinct stack: frame names from the bottom up joined by
``;``, a space, and the weight of the time spent in exactly that stack
(exclusive weight of its top frame): instructions (``weight="insns"``) or
time in the clock's unit (``"time"``, rounded to integers).  Stacks are
accumulated in a dict keyed by the stack (bounded by the program's
distinct call paths, not the trace length) and written at ``close``.
Frame names have ``;`` replaced (it is the separator) and no spaces
problems (the last space separates the weight).
"""

from __future__ import annotations

from hwtrace.analysis.records import Activation, Enter, StreamInfo


class FoldedWriter:
    def __init__(self, fp, weight: str = "insns", per_thread: bool = False):
        if weight not in ("insns", "time"):
            raise ValueError(f"bad weight {weight!r}")
        self._fp = fp
        self._weight = weight
        self._per_thread = per_thread
        self._stack: list[str] = []
        self._keys: list[str] = []
        self.stacks: dict[str, float] = {}
        self._prefix = ""

    def begin_stream(self, info: StreamInfo, unit: str | None = None) -> None:
        self._stack = []
        self._keys = []
        self._prefix = (info.label().replace(";", ":") + ";") if self._per_thread else ""

    def add(self, rec) -> None:
        t = type(rec)
        if t is Enter:
            name = rec.name.replace(";", ":")
            # re-sync to the record's depth (defensive: depth is exact)
            del self._stack[rec.depth:]
            del self._keys[rec.depth:]
            self._stack.append(name)
            parent = self._keys[-1] if self._keys else self._prefix[:-1]
            self._keys.append(f"{parent};{name}" if parent else name)
        elif t is Activation:
            if len(self._keys) > rec.depth:
                key = self._keys[rec.depth]
            else:
                key = self._prefix + rec.name.replace(";", ":")
            w = rec.self_insns if self._weight == "insns" else rec.self_time
            if w:
                self.stacks[key] = self.stacks.get(key, 0) + w
            del self._stack[rec.depth:]
            del self._keys[rec.depth:]

    def close(self) -> None:
        for key, w in self.stacks.items():
            w = int(round(w))
            if w > 0:
                self._fp.write(f"{key} {w}\n")
