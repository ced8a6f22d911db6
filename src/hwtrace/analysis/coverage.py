"""Basic-block coverage from the instruction flow (no I/O).

A block is a run of consecutive instructions that starts where control
arrived (a branch target, the first instruction after a gap) and ends with
a control-flow instruction (any ``iclass`` but ``other``/``ptwrite``) or
where the next instruction is not the fall-through.  Blocks are counted in
a dict keyed by (start, size): memory grows with the code executed, not
with the trace length.
"""

from __future__ import annotations

from hwtrace.analysis.flowitems import INSN, ObjectItem, enum_name, kind_of

_PLAIN = frozenset({"other", "ptwrite", "unknown", None})


class CoverageCollector:
    def __init__(self):
        self.blocks: dict[tuple[int, int], int] = {}
        self.insns = 0
        self._start: int | None = None
        self._next = 0

    def _close(self) -> None:
        s = self._start
        if s is not None:
            key = (s, self._next - s)
            self.blocks[key] = self.blocks.get(key, 0) + 1
            self._start = None

    def insn(self, ip: int, size: int, iclass) -> None:
        if self._start is not None and ip != self._next:
            self._close()
        if self._start is None:
            self._start = ip
        self._next = ip + size
        self.insns += 1
        if type(iclass) is not str:
            iclass = enum_name(iclass)
        if iclass not in _PLAIN:
            self._close()

    def feed(self, item) -> None:
        m = item if isinstance(item, dict) else ObjectItem(item)
        k = kind_of(m)
        if k == INSN:
            self.insn(m.get("ip"), m.get("size") or 0, m.get("iclass"))
        elif m.get("status_update") and m.get("error") is None:
            return          # a PSB+ restating the state: the block goes on
        else:
            name = m.get("event") or m.get("error") or m.get("status")
            if m.get("error") is not None or name in (
                    "overflow", "disabled", "async_disabled", "enabled",
                    "async_branch", "tsx", "resynced", "resync_stalled"):
                self.gap()

    def gap(self) -> None:
        self._close()

    def finish(self) -> dict[tuple[int, int], int]:
        self._close()
        return self.blocks
