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

Only whole batches or slices of them are yielded: the records and items
are the decoder's, untouched, apart from that marker.  No I/O: takes
batch iterators.
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

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


class _Cursor:
    """One CPU stream, cut at segment boundaries."""

    def __init__(self, cpu: int, batches: Iterable[Batch]):
        self.cpu = cpu
        self._it = iter(batches)
        self._b: Batch | None = None        # the batch being walked
        self._rec = 0                       # its next record
        self._item = 0                      # its next item
        self._carry: list = []              # (offset, item) for the next piece
        self.start = None                   # (ip, tsc) of the head segment

    def _spent(self) -> bool:
        b = self._b
        return b is None or (self._rec >= len(b.blocks) and
                             self._item >= len(b.items))

    def _fetch(self) -> bool:
        try:
            self._b = next(self._it)
        except StopIteration:
            self._b = None
            return False
        self._rec = self._item = 0
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
            b = self._b
            k = self._item
            while k < len(b.items) and b.items[k][0] <= self._rec:
                it = b.items[k][2]
                if _starts(it):
                    self.start = (getattr(it, "ip", None),
                                  it.tsc if getattr(it, "has_tsc", False) else None)
                    return True
                k += 1
            if self._rec < len(b.blocks):
                r = b.blocks[self._rec]     # the stream began traced
                self.start = (int(r["ip"]), int(r["tsc"]) or None)
                return True
            # only items are left, none an enable: they go with the next piece
            self._carry.extend((off, it) for _i, off, it in b.items[self._item:])
            self._item = len(b.items)

    def segment(self, again=None) -> Iterator[tuple[Batch, object]]:
        """The head segment: (batch slice, the item that stopped it or None).
        With ``again(resume, start)`` (would :func:`merged_batches` take
        this CPU's next segment, starting at ``start`` (ip, tsc), after
        one that stopped where the flow goes on at ``resume``?), the
        segments after it that it would take next anyway go on in the
        same slices: while each stop is followed, at the same record, by
        this CPU's enable where the flow goes on (a system call's round
        trip: a slice per call cost more than the steps of it)."""
        self.start = None
        began = False                       # anything of it taken yet
        seg0 = self._rec                    # the segment's first record here
        while True:
            if self._spent():
                if not self._fetch():
                    return
                seg0 = 0
                continue
            b = self._b
            r0, i0 = self._rec, self._item
            k = i0
            while k < len(b.items):
                idx, _off, it = b.items[k]
                began = began or idx > r0
                if _starts(it):
                    if began:               # the next segment's enable
                        yield self._piece(b, r0, idx, i0, k), None
                        self._rec, self._item = idx, k
                        return
                    began = True
                elif _stops(it):
                    j = None if again is None else _goes_on(b, k, idx, seg0, it, again)
                    if j is not None:       # the next segment: this one's
                        k, seg0, began = j + 1, idx, True
                        continue
                    yield self._piece(b, r0, idx, i0, k + 1), it
                    self._rec, self._item = idx, k + 1
                    return
                k += 1
            yield self._piece(b, r0, len(b.blocks), i0, len(b.items)), None
            began = began or len(b.blocks) > r0
            self._rec, self._item = len(b.blocks), len(b.items)

    def _piece(self, b: Batch, r0: int, r1: int, i0: int, i1: int) -> Batch:
        piece = _slice(b, r0, r1, i0, i1)
        if self._carry:
            piece.items[:0] = [(0, off, it) for off, it in self._carry]
            self._carry = []
        return piece


def _slice(b: Batch, r0: int, r1: int, i0: int, i1: int) -> Batch:
    blocks = b.blocks[r0:r1]
    insns = None
    if b.insns is not None:
        n0 = int(b.blocks["ninsn"][:r0].sum())
        n1 = n0 + int(blocks["ninsn"].sum())
        insns = b.insns[n0:n1]
    items = [(idx - r0, off, it) for idx, off, it in b.items[i0:i1]]
    first = b.first_insn + int(b.blocks["ninsn"][:r0].sum())
    return Batch(blocks, insns, items, first)


def _goes_on(b: Batch, k: int, idx: int, seg0: int, stop, again) -> int | None:
    """The item (its place in ``b.items``) of the enable that begins the
    segment after the one ``stop`` (item k, at record idx) ends, where
    :func:`merged_batches` takes it next (``again``): at the same
    record, with only events that begin no segment and end none before
    it, where the flow goes on, and with the segment's last record in
    this batch (``seg0``: its first one here); else None."""
    if idx <= seg0:
        return None
    x = _resume_at(b.blocks[idx - 1], stop)
    if x is None:
        return None
    items = b.items
    for j in range(k + 1, len(items)):
        i, _off, it = items[j]
        if i != idx or _stops(it):
            return None
        if _starts(it):
            ip = getattr(it, "ip", None)
            if ip != x:
                return None
            tsc = it.tsc if getattr(it, "has_tsc", False) else None
            return j if again(x, (ip, tsc)) else None
    return None


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
    while True:
        live = [c for c in cursors if c.peek()]
        if not live:
            return
        big = float("inf")

        def rank(c, start=None, resume=resume):
            ip, tsc = start or c.start
            return (0 if resume is not None and ip == resume else 1,
                    tsc if tsc is not None else big,
                    left.get(c.cpu, big), 0 if c is cur else 1, c.cpu)
        cur = min(live, key=rank)
        last = None
        stop = None
        others = [c for c in live if c is not cur]

        def again(x, start, cur=cur, others=others):
            # cur again (its next head: start) after a stop resuming at x
            mine = rank(cur, start, x)
            return all(mine < rank(c, None, x) for c in others)
        if cur.cpu in wrapped and cur.cpu not in begun and begun:
            lost = LostItem(cur.cpu, -1)
        begun.add(cur.cpu)
        for piece, stop in cur.segment(again):
            if lost is not None:
                if lost.offset < 0 and len(piece.blocks):
                    lost = lost._replace(offset=int(piece.blocks[0]["offset"]))
                piece.items.insert(0, (0, lost.offset, lost))
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
