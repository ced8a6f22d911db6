"""Batches cut where tracing is enabled (no I/O).

A CPU's stream switches threads only where tracing is enabled again (a
context switch is a disable, then an enable where the next thread goes
on).  :func:`enables` finds those enables in a :class:`~.batches.Batch`
with the times they carry, and :func:`piece` takes the part of a batch
between two cuts -- numpy slices of the records and the items
re-indexed, so the pieces fed one after the other are the batch -- so
the pieces of several CPUs' streams can be taken in time order
(:mod:`hwtrace.export.interleave`).  :func:`cut_at_enables` cuts a batch
at every one.
"""

from __future__ import annotations

import numpy as np

from . import plain
from .batches import Batch


#: events that change what a call-stack builder knows (the others only
#: tell the time; :func:`hwtrace.analysis.batchfeed.structural`)
_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


def _telling(it) -> bool:
    """Whether an item only tells the time (or the address space the
    records after it run in): a piece may begin at it."""
    t = getattr(it, "type", None)
    if t == "space":
        return True
    if not hasattr(it, "status_update"):
        return False
    return t not in _STRUCTURAL or (it.status_update and t in ("enabled", "disabled"))


def enables(batch: Batch) -> list[tuple[int, int | None]]:
    """(where a piece may begin, TSC or None) for every enable that is
    not a PSB+'s restatement of the tracing state: the place (among
    ``batch.items`` and its plain rows in one order, :class:`Places`) of
    the first item at the enable's record that, like every one up to the
    enable, only tells the time -- a CPU idle until then has its clock
    jump there, before the enable, and that time is the next thread's,
    not the last one's.  None in a batch that carries every instruction
    (``insns``: not cut)."""
    return Places(batch).enables()


class Places:
    """A batch's items and plain rows (:mod:`.plain`) in one order, where
    it may be cut: place ``j`` is item or row ``j`` of that order (a
    batch without rows: ``batch.items[j]``).  Found on the rows' columns
    -- a system-call-heavy stream's batches are mostly rows (an enable
    and a disable per call), made items only one at a time."""

    __slots__ = ("batch", "rows", "at", "n", "_js")

    def __init__(self, batch: Batch):
        self.batch = batch
        rows = batch.plain
        self.rows = rows if rows is not None and len(rows) else None
        if self.rows is None:
            self.at = None
            self.n = len(batch.items)
        else:
            self.at = plain.item_positions(len(batch.items), self.rows)
            self.n = len(batch.items) + len(self.rows)
        self._js = None

    def record(self, j: int) -> int:
        """The record index at place ``j`` (the batch's end past the last)."""
        if j >= self.n:
            return len(self.batch.blocks)
        if self.rows is None:
            return self.batch.items[j][0]
        return int(self._index()[j])

    def records(self, js: np.ndarray) -> np.ndarray:
        """:meth:`record` of places ``js`` (int64), each before the end."""
        if self.rows is None:
            items = self.batch.items
            return np.array([items[j][0] for j in js.tolist()], np.int64)
        return self._index()[js]

    def _index(self) -> np.ndarray:
        if self._js is None:
            js = np.empty(self.n, np.int64)
            js[self.rows["pos"].astype(np.int64)] = self.rows["index"]
            js[self.at] = np.fromiter((it[0] for it in self.batch.items), np.int64,
                                      len(self.batch.items))
            self._js = js
        return self._js

    def enables(self) -> list[tuple[int, int | None]]:
        """:func:`enables`."""
        c, t = self.enable_columns()
        return [(ci, ti if ti >= 0 else None)
                for ci, ti in zip(c.tolist(), t.tolist())]

    def enable_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`enables` as columns: (places, TSCs; -1: none) -- a
        system-call-heavy stream's batch has an enable per call, ~12,000
        tuples the interleaver only turned back into columns."""
        batch = self.batch
        if batch.insns is not None:
            return _NO_ENABLES
        if self.rows is None:
            en = _enables_of(batch.items)
            return (np.array([c for c, _t in en], np.int64),
                    np.array([-1 if t is None else t for _c, t in en], np.int64))
        rows, items = self.rows, batch.items
        n = self.n
        js = self._index()
        pos = rows["pos"].astype(np.int64)
        typ = rows["type"]
        su = (rows["flags"] & plain.PF_STATUS_UPDATE) != 0
        tell = np.empty(n, bool)
        tell[pos] = ~plain.structural(rows)
        tell[self.at] = np.fromiter((_telling(it[2]) for it in items), bool, len(items))
        is_en = np.zeros(n, bool)
        is_en[pos] = (typ == plain.ENABLED) & ~su
        tsc = np.zeros(n, np.uint64)
        has = np.zeros(n, bool)
        rh = (rows["flags"] & plain.PF_HAS_TSC) != 0
        tsc[pos], has[pos] = rows["tsc"], rh
        for k, (_i, _o, it) in zip(self.at.tolist(), items):
            if getattr(it, "type", None) == "enabled" and \
                    not getattr(it, "status_update", False):
                is_en[k] = True
                if getattr(it, "has_tsc", False):
                    has[k], tsc[k] = True, int(it.tsc)
        e = np.flatnonzero(is_en)
        if not len(e):
            return _NO_ENABLES
        # a piece begins after the last place before the enable that does
        # not only tell the time, or is at another record (an enable
        # itself tells more: no piece reaches back past the one before)
        stop = np.flatnonzero(~tell[:-1] | (js[:-1] != js[1:]))
        k = np.searchsorted(stop, e) - 1
        c = np.where(k >= 0, stop[np.maximum(k, 0)] + 1, 0).astype(np.int64)
        return c, np.where(has[e], tsc[e].astype(np.int64), -1)

    def piece(self, first: int, r0: int, j0: int, r1: int, j1: int) -> Batch:
        """:func:`piece`."""
        batch = self.batch
        if self.rows is None:
            return _piece_of(batch, first, r0, j0, r1, j1)
        if r0 == 0 and j0 == 0 and j1 == self.n and r1 == len(batch.blocks):
            return batch
        k0, k1 = np.searchsorted(self.at, (j0, j1)).tolist()
        its = batch.items[k0:k1]
        if r0:
            its = [(i - r0, o, it) for i, o, it in its]
        lo, hi = np.searchsorted(self.rows["pos"], (j0, j1)).tolist()
        rows = self.rows[lo:hi].copy()
        rows["pos"] -= j0
        rows["index"] -= r0
        return Batch(batch.blocks[r0:r1], None, its, first, rows)


_NO_ENABLES = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def _enables_of(items: list) -> list[tuple[int, int | None]]:
    """:func:`enables` of a batch with no rows."""
    out = []
    for j, (i, _o, it) in enumerate(items):
        if getattr(it, "type", None) != "enabled" or \
                getattr(it, "status_update", False):
            continue
        c = j
        while c > 0 and items[c - 1][0] == i and _telling(items[c - 1][2]) \
                and (not out or c - 1 > out[-1][0]):
            c -= 1
        out.append((c, int(it.tsc) if getattr(it, "has_tsc", False) else None))
    return out


def start_time(batch: Batch, r: int) -> int | None:
    """The TSC of record ``r`` of ``batch``, or None (none there)."""
    if r < len(batch.blocks):
        t = int(batch.blocks["tsc"][r])
        if t:
            return t
    return None


def piece(batch: Batch, first: int, r0: int, j0: int, r1: int, j1: int) -> Batch:
    """The part of ``batch`` from record r0 and place j0 (:class:`Places`)
    to record r1 and place j1 (the items and rows between: their index
    re-based; ``first``: the stream's instructions before it).  The batch
    itself when that is all of it."""
    return Places(batch).piece(first, r0, j0, r1, j1)


def _piece_of(batch: Batch, first: int, r0: int, j0: int, r1: int, j1: int) -> Batch:
    """:func:`piece` of a batch with no rows."""
    items = batch.items
    if r0 == 0 and j0 == 0 and j1 == len(items) and r1 == len(batch.blocks):
        return batch
    its = items[j0:j1]
    if r0:
        its = [(i - r0, o, it) for i, o, it in its]
    return Batch(batch.blocks[r0:r1], None, its, first)


def cut_at_enables(batch: Batch) -> list[Batch]:
    """``batch`` cut before every enable (:func:`enables`)."""
    places = Places(batch)
    blocks = batch.blocks
    out, r0, j0, first = [], 0, 0, batch.first_insn
    for j1 in [j for j, _t in places.enables()] + [places.n]:
        r1 = places.record(j1)
        if (r1, j1) == (r0, j0):
            continue
        out.append(places.piece(first, r0, j0, r1, j1))
        first += int(blocks["ninsn"][r0:r1].sum(dtype="u8"))
        r0, j0 = r1, j1
    return out
