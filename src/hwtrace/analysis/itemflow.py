"""Flow items one at a time into batches (no I/O).

A test's synthetic flow, a ``.jsonl`` file of ``ptoracle insn`` lines, or
a sink's callbacks give the flow one item at a time (see
:mod:`hwtrace.analysis.flowitems`).  :class:`ItemGrouper` groups them into
the records of :mod:`hwtrace.flow.batches` -- a run of instructions
ending at a branch -- with the events, errors and statuses between them
as the batch's items, so that the call-stack builder has one input: the
batches every view consumes.

Records made from items carry no time of their own (``tsc`` 0): the
events' ``tsc`` anchor the clock where they stand, as the items say.  An
event that changes nothing and tells no time is left out.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hwtrace.analysis.flowitems import ERROR, EVENT, INSN, ObjectItem, \
    enum_name, event_name, kind_of
from hwtrace.flow.batches import BLOCK, Batch

#: libipt iclass name -> hwtrace.x86.insn.IClass value
ICLASS = {"unknown": 0, "other": 1, "call": 2, "return": 3, "jump": 4,
          "cond_jump": 5, "far_call": 6, "far_return": 7, "far_jump": 8,
          "ptwrite": 9, "indirect": 10, "error": 0}
_PLAIN = frozenset({0, 1, 9})
_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


class ItemGrouper:
    """Collects items; ``flush()`` hands what it holds to ``deliver`` as
    one :class:`~hwtrace.flow.batches.Batch` (``full`` says when that is
    due)."""

    LIMIT = 1 << 16

    def __init__(self, deliver: Callable[[Batch], None]):
        self.deliver = deliver
        self.recs: list = []
        self.items: list = []
        self.cur: list | None = None     # [ip, last ip, last size, iclass, n]
        self.tsc = 0                     # time of the records from here
        self.first = 0                   # instructions before this batch
        self.count = 0
        self._codes: dict = {}

    @property
    def full(self) -> bool:
        return len(self.recs) >= self.LIMIT

    def _close(self) -> None:
        c = self.cur
        if c is not None:
            self.recs.append((c[0], c[1], 0, c[5], c[4], c[3], c[2], 3, 0))
            self.cur = None

    def _code(self, iclass) -> int:
        if type(iclass) is str:
            v = ICLASS.get(iclass)
            if v is not None:
                return v
        v = self._codes.get(iclass)
        if v is None:
            v = self._codes[iclass] = ICLASS.get(enum_name(iclass), 1)
        return v

    def insn(self, ip: int, size: int, iclass) -> None:
        ic = self._code(iclass)
        c = self.cur
        if c is None:
            self.cur = c = [ip, ip, size, ic, 1, self.tsc]
        else:
            c[1], c[2], c[3] = ip, size, ic
            c[4] += 1
        self.count += 1
        if ic not in _PLAIN:
            self._close()
            if len(self.recs) >= self.LIMIT:
                self.flush()

    def feed(self, item) -> None:
        if type(item) is dict and "iclass" in item and "error" not in item \
                and "event" not in item:
            self.insn(item["ip"], item.get("size", 0), item["iclass"])
            return
        m = item if isinstance(item, dict) else ObjectItem(item)
        k = kind_of(m)
        if k == INSN:
            self.insn(m.get("ip"), m.get("size") or 0, m.get("iclass"))
            return
        self._close()
        if k == EVENT:
            name = event_name(m)
            if name == "tick" or name not in _STRUCTURAL or \
                    (m.get("status_update") and name in ("enabled", "disabled")):
                if m.get("tsc") is None:
                    return              # changes nothing, tells no time
        elif k == ERROR:
            pass
        else:
            if enum_name(m.get("status")) != "resync_stalled":
                return
        self.items.append((len(self.recs), m.get("offset"), item))

    def flush(self) -> None:
        self._close()
        if not self.recs and not self.items:
            return
        blocks = np.array(self.recs, BLOCK) if self.recs else np.zeros(0, BLOCK)
        b = Batch(blocks, None, self.items, self.first)
        self.first += int(blocks["ninsn"].sum()) if len(blocks) else 0
        self.recs, self.items = [], []
        self.deliver(b)
