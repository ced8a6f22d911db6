"""Edge coverage from batches (no I/O): the pairs (branch instruction,
next instruction executed) of :mod:`hwtrace.flow.fast`'s definition,
counted with numpy.

Records decoded with every branch ending one (``view=True``, the
instruction decoder's flow): record ``r`` ending with a branch (any class
but OTHER/PTWRITE) and the first instruction of the next record form an
edge -- across a gap in tracing too (a syscall's edge goes to where
tracing resumes), but not across a decode error.  ``coverage --edges``
counts in the flow core (:func:`hwtrace.flow.fast.packed_edges`, through
a stream's switcher where it changes address spaces); this counter gives
the same edges from a view's batches, for code that already holds them,
and the tests check the one against the other.
"""

from __future__ import annotations

import numpy as np

_BRANCH = np.ones(256, bool)
_BRANCH[[0, 1, 9]] = False       # unknown, other, ptwrite


class EdgeCounter:
    def __init__(self):
        self.insns = 0
        self.errors = 0
        self._from: int | None = None    # the last record's branch, pending
        self._f: list[np.ndarray] = []
        self._t: list[np.ndarray] = []
        self._n = 0
        self._table: dict = {}

    def add_batch(self, batch) -> None:
        b = batch.blocks
        m = len(b)
        cut = np.zeros(m + 1, bool)
        for index, _off, item in batch.items:
            if getattr(item, "type", None) == "error":
                cut[index] = True
                self.errors += 1
        if not m:
            if cut[0]:
                self._from = None
            return
        self.insns += int(b["ninsn"].sum())
        ip, end = b["ip"], b["end_ip"]
        br = _BRANCH[b["iclass"]]
        src = np.flatnonzero(br[:-1] & ~cut[1:m])
        f, t = end[src], ip[src + 1]
        if self._from is not None and not cut[0]:
            f = np.concatenate(([np.uint64(self._from)], f))
            t = np.concatenate(([ip[0]], t))
        self._from = int(end[-1]) if br[-1] and not cut[m] else None
        if len(f):
            self._f.append(f)
            self._t.append(t)
            self._n += len(f)
            if self._n > 1 << 21:
                self._merge()

    def _merge(self) -> None:
        if not self._f:
            return
        f = np.concatenate(self._f)
        t = np.concatenate(self._t)
        self._f, self._t, self._n = [], [], 0
        pairs = np.stack((f, t), 1)
        u, c = np.unique(pairs, axis=0, return_counts=True)
        tab = self._table
        for (a, b), n in zip(u.tolist(), c.tolist()):
            tab[(a, b)] = tab.get((a, b), 0) + n

    def counts(self) -> dict:
        self._merge()
        return dict(self._table)
