"""One thread's flow from the streams of every CPU it ran on.

In a cpu-mode recording a thread that migrates leaves its flow in pieces
in several CPU streams: tracing stops where it leaves a CPU (a disable,
or an asynchronous disable at the instruction it was interrupted before)
and starts again where it goes on (an enable at that instruction), on
the same CPU or another.  A *segment* is one such stretch: from an
enable (or the start of the stream) to the next disable.

:func:`merged_batches` walks the CPU streams side by side, a segment at a
time, and yields their batches in the thread's order: after a segment
that stopped at address X, the next is the head segment (of any CPU)
that starts at X; among several (or none), the earliest by its enable's
time stamp, then the CPU the thread left first (the sideband's switch
out), then the same CPU, then the lowest CPU number.  (Time stamps alone
can't order them: they advance only at timing packets, and an emulated
engine may give every enable the same one; where a thread stopped and
went on is exact.)

Where a CPU stream ends inside a segment (no disable: the rest of it was
lost), or ends where its stop-on-full buffer filled (the thread may have
run on there untraced, however the segment ended), and the thread's flow
goes on in another, what ran in between is unknown; so is what ran
before the first segment of a stream whose ring buffer wrapped (its
oldest data was overwritten), when the thread ran elsewhere before.
There the piece starts with a :class:`LostItem` (a gap, as a decoder's
overflow is), so the flow is not read as going on from the last traced
instruction.

Only whole batches or slices of them are yielded: the records, items
and plain rows (:mod:`hwtrace.flow.plain`) are the decoder's, untouched,
apart from that marker.  A batch's segment ends are found on columns
(:class:`_Marks`: its enables and disables among its items and rows in
one order), not an Event at a time: a thread making system calls has a
disable and an enable per call, and the calls after which the merge
would take the same CPU's next segment anyway go on in one slice,
counted in bulk (:func:`_round_trips`).  No I/O: takes batch iterators.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from hwtrace.flow import plain
from hwtrace.flow.batches import Batch


class LostItem(NamedTuple):
    """The thread's flow went on untraced: the stream of ``cpu`` ended
    inside a segment at trace offset ``offset`` and the flow resumes in
    another stream (the item goes first in its piece)."""

    cpu: int            # the stream that ended (or began, wrapped)
    offset: int

    type = "lost"


def _starts(item) -> bool:
    return getattr(item, "type", None) == "enabled" and \
        not getattr(item, "status_update", False)


def _stops(item) -> bool:
    return getattr(item, "type", None) in ("disabled", "async_disabled") \
        and not getattr(item, "status_update", False)


_ASYNC = plain.TYPE["async_disabled"]

#: the round trips :func:`_round_trips` weighs at first (then twice as many)
_WINDOW = 16


class _Marks:
    """A batch's marks: its enables and disables (not a PSB+'s restating
    of the tracing state), where segments begin and end, as columns in
    the order of the batch's *places* -- its items and plain rows in one
    order, as :class:`hwtrace.flow.batchcut.Places` counts them (a batch
    without rows: its items).  Per mark: ``place``, ``rec`` (the record
    before it), ``start`` (an enable; else a disable), an enable's ``ip``
    and time stamp (``has``, ``tsc``), a disable's ``async_`` and
    ``where`` (the instruction an asynchronous one was before), and
    ``src`` (item k, or row r as -1 - r)."""

    __slots__ = ("batch", "n", "item_places", "count", "place", "rec",
                 "start", "ip", "has", "tsc", "async_", "where", "src")

    def __init__(self, b: Batch):
        self.batch = b
        rows = b.plain if b.plain is not None and len(b.plain) else None
        items = b.items
        cols = _item_marks(items)
        if rows is None:
            self.n = len(items)
            self.item_places = None
            cols["place"] = cols["src"]
        else:
            self.n = len(items) + len(rows)
            self.item_places = plain.item_positions(len(items), rows)
            more = _row_marks(rows)
            if len(cols["src"]):
                cols["place"] = self.item_places[cols["src"]]
                order = np.argsort(np.concatenate((cols["place"], more["place"])),
                                   kind="stable")
                cols = {k: np.concatenate((v, more[k]))[order]
                        for k, v in cols.items()}
            else:                           # (the rows are in place order)
                cols = more
        for k, v in cols.items():
            setattr(self, k, v)
        self.count = len(self.place)

    def first_from(self, j: int) -> int:
        """The first mark at place ``j`` or after."""
        return int(np.searchsorted(self.place, j))

    def head_start(self, j: int, r: int) -> tuple | None:
        """(ip, tsc or None) of the first enable at place ``j`` or after
        and at record ``r`` or before, or None."""
        m = self.first_from(j)
        hi = m + int(np.searchsorted(self.rec[m:], r, "right"))
        s = np.flatnonzero(self.start[m:hi])
        if not len(s):
            return None
        k = m + int(s[0])
        return int(self.ip[k]), (int(self.tsc[k]) if self.has[k] else None)

    def item(self, m: int):
        """The item (or a row's Event) of mark ``m``."""
        k = int(self.src[m])
        if k >= 0:
            return self.batch.items[k][2]
        return plain.event(self.batch.plain[-1 - k].tolist())

    def items_from(self, j: int) -> list:
        """(offset, item) of places ``j`` on, rows made Events."""
        b = self.batch
        if self.item_places is None:
            return [(off, it) for _i, off, it in b.items[j:]]
        k = int(np.searchsorted(self.item_places, j))
        r = int(np.searchsorted(b.plain["pos"], j))
        both = plain.merged(b.items[k:], b.plain[r:], self.item_places[k:])
        return [(off, it) for _i, off, it in both]


def _item_marks(items: list) -> dict:
    """:class:`_Marks`' columns of the marks among ``items`` (``place``
    not yet: their item index is ``src``)."""
    src, rec, start, ip, has, tsc, asy, where = ([] for _ in range(8))
    for k, (idx, _off, it) in enumerate(items):
        if _starts(it):
            h = bool(getattr(it, "has_tsc", False))
            s, a, w, i, t = True, False, 0, getattr(it, "ip", 0), \
                int(it.tsc) if h else 0
        elif _stops(it):
            a = it.type == "async_disabled"
            s, h, i, t, w = False, False, 0, 0, getattr(it, "at", 0) if a else 0
        else:
            continue
        src.append(k), rec.append(idx), start.append(s)
        ip.append(i), has.append(h), tsc.append(t), asy.append(a), where.append(w)
    return {"src": np.array(src, np.int64), "rec": np.array(rec, np.int64),
            "start": np.array(start, bool), "ip": np.array(ip, np.uint64),
            "has": np.array(has, bool), "tsc": np.array(tsc, np.uint64),
            "async_": np.array(asy, bool), "where": np.array(where, np.uint64)}


def _row_marks(rows: np.ndarray) -> dict:
    """:class:`_Marks`' columns of the marks among plain ``rows`` (an
    asynchronous disable is a row only where its ``at`` is 0)."""
    typ = rows["type"]
    flags = rows["flags"]
    su = (flags & plain.PF_STATUS_UPDATE) != 0
    st = (typ == plain.ENABLED) & ~su
    r = np.flatnonzero(st | (((typ == plain.DISABLED) | (typ == _ASYNC)) & ~su))
    start = st[r]
    has = start & ((flags[r] & plain.PF_HAS_TSC) != 0)
    return {"src": -1 - r, "rec": rows["index"][r],
            "start": start, "ip": np.where(start, rows["ip"][r], 0).astype(np.uint64),
            "has": has, "tsc": np.where(has, rows["tsc"][r], 0).astype(np.uint64),
            "async_": typ[r] == _ASYNC, "where": np.zeros(len(r), np.uint64),
            "place": rows["pos"][r].astype(np.int64)}


class _Cursor:
    """One CPU stream, cut at segment boundaries."""

    def __init__(self, cpu: int, batches: Iterable[Batch]):
        self.cpu = cpu
        self._it = iter(batches)
        self._m: _Marks | None = None       # the batch being walked
        self._rec = 0                       # its next record
        self._j = 0                         # its next place
        self._carry: list = []              # (offset, item) for the next piece
        self.start = None                   # (ip, tsc) of the head segment

    def _spent(self) -> bool:
        m = self._m
        return m is None or (self._rec >= len(m.batch.blocks) and self._j >= m.n)

    def _fetch(self) -> bool:
        try:
            b = next(self._it)
        except StopIteration:
            self._m = None
            return False
        self._m = _Marks(b)
        self._rec = self._j = 0
        return True

    def peek(self) -> bool:
        """Find where the head segment starts; False at the end."""
        if self.start is not None:
            return True
        while True:
            if self._spent():
                if not self._fetch():
                    return False
                continue
            mk = self._m
            self.start = mk.head_start(self._j, self._rec)
            if self.start is not None:
                return True
            blocks = mk.batch.blocks
            if self._rec < len(blocks):
                r = blocks[self._rec]       # the stream began traced
                self.start = (int(r["ip"]), int(r["tsc"]) or None)
                return True
            # only items are left, none an enable: they go with the next piece
            self._carry.extend(mk.items_from(self._j))
            self._j = mk.n

    def segment(self, again: Callable | None = None) -> Iterator[tuple[Batch, object]]:
        """The head segment: (batch slice, the item that stopped it or None).
        With ``again(resume, has, tsc)`` (would :func:`merged_batches`
        take this CPU's next segment, enabled with those time stamps,
        after one that stopped where the flow goes on at ``resume``?
        arrays, one entry per question), the segments after it that it
        would take next anyway go on in the same slices: while each stop
        is followed, at the same record, by this CPU's enable where the
        flow goes on (a system call's round trip: a slice per call cost
        more than the steps of it; :func:`_round_trips`)."""
        self.start = None
        began = False                       # anything of it taken yet
        seg0 = self._rec                    # the segment's first record here
        while True:
            if self._spent():
                if not self._fetch():
                    return
                seg0 = 0
                continue
            mk = self._m
            r0, j0 = self._rec, self._j
            m = mk.first_from(j0)
            while m < mk.count:
                idx = int(mk.rec[m])
                if mk.start[m]:
                    if began or idx > r0:   # the next segment's enable
                        j = int(mk.place[m])
                        yield self._piece(r0, idx, j0, j), None
                        self._rec, self._j = idx, j
                        return
                    began = True
                    m += 1
                    continue
                t = 0 if again is None else _round_trips(mk, m, seg0, again)
                if t:                       # the next segments: this one's
                    m += 2 * t
                    seg0, began = int(mk.rec[m - 1]), True
                    continue
                j = int(mk.place[m]) + 1
                yield self._piece(r0, idx, j0, j), mk.item(m)
                self._rec, self._j = idx, j
                return
            nrec = len(mk.batch.blocks)
            yield self._piece(r0, nrec, j0, mk.n), None
            began = began or nrec > r0
            self._rec, self._j = nrec, mk.n

    def _piece(self, r0: int, r1: int, j0: int, j1: int) -> Batch:
        mk = self._m
        piece = _slice(mk.batch, r0, r1, j0, j1, mk.item_places)
        if self._carry:
            piece = _prepend(piece, [(0, off, it) for off, it in self._carry])
            self._carry = []
        return piece


def _slice(b: Batch, r0: int, r1: int, j0: int, j1: int,
           item_places: np.ndarray | None = None) -> Batch:
    """Records [r0, r1) and places [j0, j1) of ``b`` (its items and plain
    rows in one order; without rows, items [j0, j1)), re-based.
    ``item_places``: the items' places where ``b`` has rows (found if
    not given)."""
    blocks = b.blocks[r0:r1]
    before = int(b.blocks["ninsn"][:r0].sum())
    insns = None
    if b.insns is not None:
        insns = b.insns[before:before + int(blocks["ninsn"].sum())]
    rows = b.plain
    if rows is None or not len(rows):
        items = b.items[j0:j1]
        rows = None if rows is None else rows[:0]
    else:
        if item_places is None:
            item_places = plain.item_positions(len(b.items), rows)
        k0, k1 = np.searchsorted(item_places, (j0, j1)).tolist()
        items = b.items[k0:k1]
        lo, hi = np.searchsorted(rows["pos"], (j0, j1)).tolist()
        rows = rows[lo:hi]
        if j0 or r0:
            rows = rows.copy()
            rows["pos"] -= j0
            rows["index"] -= r0
    if r0:
        items = [(idx - r0, off, it) for idx, off, it in items]
    return Batch(blocks, insns, list(items), b.first_insn + before, rows)


def _prepend(b: Batch, front: list) -> Batch:
    """``b`` with the items ``front`` ((index, offset, item) each) first."""
    rows = b.plain
    if rows is not None and len(rows):
        rows = rows.copy()
        rows["pos"] += len(front)
    return b._replace(items=front + b.items, plain=rows)


def _round_trips(mk: _Marks, m: int, seg0: int, again: Callable) -> int:
    """How many of the disables at marks m, m+2, ... are, one after the
    other, followed by the enable that begins the segment after it where
    :func:`merged_batches` takes it next (``again``): the next mark, at
    the same record (only events that begin no segment and end none
    between), where the flow goes on, and with a record of the segment
    before it in this batch (after ``seg0``, the segment's first one
    here, for the first)."""
    blocks = mk.batch.blocks
    if not len(blocks):
        return 0
    t = 0
    w = _WINDOW
    while True:
        s = m + 2 * t
        ks = np.arange(s, min(s + 2 * w, mk.count - 1), 2)
        if not len(ks):
            return t
        e = ks + 1
        rec = mk.rec[ks]
        prev = np.empty(len(ks), np.int64)
        prev[0] = seg0 if t == 0 else mk.rec[s - 1]
        prev[1:] = mk.rec[ks[1:] - 1]
        ok = ~mk.start[ks] & mk.start[e] & (mk.rec[e] == rec) & (rec > prev)
        last = np.maximum(rec - 1, 0)
        x = np.where(mk.async_[ks], mk.where[ks],
                     blocks["end_ip"][last] + blocks["size"][last])
        ok &= mk.ip[e] == x
        bad = np.flatnonzero(~ok)
        n = int(bad[0]) if len(bad) else len(ks)
        if n:
            ok = again(x[:n], mk.has[e[:n]], mk.tsc[e[:n]])
            bad = np.flatnonzero(~ok)
            if len(bad):
                return t + int(bad[0])
        t += n
        if n < len(ks):
            return t
        w *= 2


def _resume_at(last_block, stop) -> int | None:
    """Where the flow goes on after a segment that ended with ``stop``."""
    if stop is not None and getattr(stop, "type", None) == "async_disabled":
        return getattr(stop, "at", None)
    if last_block is not None:
        return int(last_block["end_ip"]) + int(last_block["size"])
    return None


def merged_batches(streams: list[tuple[int, Iterable[Batch]]],
                   left: dict | None = None, stopped=(),
                   wrapped=()) -> Iterator[Batch]:
    """The thread's batches from ``streams`` (``(cpu, batches)`` each; a
    single stream passes through as it is).  ``left``: {cpu: time the
    thread was first switched out of it}; ``stopped`` / ``wrapped``: the
    CPUs whose stream lost its end (a stop-on-full buffer filled) / its
    beginning (a ring buffer wrapped)."""
    left = left or {}
    if len(streams) == 1:
        yield from streams[0][1]
        return
    cursors = [_Cursor(cpu, it) for cpu, it in streams]
    cur = None
    resume = None
    lost = None                     # a LostItem for the next piece
    begun: set = set()              # the CPUs a segment was taken from
    big = float("inf")
    while True:
        live = [c for c in cursors if c.peek()]
        if not live:
            return

        def rank(c, resume=resume):
            ip, tsc = c.start
            return (0 if resume is not None and ip == resume else 1,
                    tsc if tsc is not None else big,
                    left.get(c.cpu, big), 0 if c is cur else 1, c.cpu)
        cur = min(live, key=rank)
        last = None
        stop = None
        others = [c for c in live if c is not cur]

        def again(x, has, tsc, cur=cur, others=others):
            # cur again, its next head enabled at x (times: has, tsc), after
            # a stop resuming at x: ranked first (see rank) among the heads
            ok = np.ones(len(x), bool)
            mine = left.get(cur.cpu, big)
            for c in others:
                ip, t = c.start
                ahead = mine <= left.get(c.cpu, big)    # at equal times
                if t is None:
                    first = has | ahead
                else:
                    first = has & ((tsc < t) | ((tsc == t) & ahead))
                ok &= (x != ip) | first
            return ok
        if cur.cpu in wrapped and cur.cpu not in begun and begun:
            lost = LostItem(cur.cpu, -1)
        begun.add(cur.cpu)
        for piece, stop in cur.segment(again):
            if lost is not None:
                if lost.offset < 0 and len(piece.blocks):
                    lost = lost._replace(offset=int(piece.blocks[0]["offset"]))
                piece = _prepend(piece, [(0, lost.offset, lost)])
                lost = None
            if len(piece.blocks):
                last = piece.blocks[-1]
            yield piece
        resume = _resume_at(last, stop)
        if last is not None and (stop is None or cur.cpu in stopped) and \
                not cur.peek():
            # the stream ended inside the segment, or filled: if the flow
            # goes on elsewhere, what ran between is not in the trace
            lost = LostItem(cur.cpu, int(last["offset"]))
