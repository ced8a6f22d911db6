"""One thread's part of a CPU stream that interleaves threads.

In a cpu-mode recording a CPU's stream holds every thread that ran on
that CPU, one after another: at each context switch tracing stops for the
thread going out and starts again where the one coming in goes on (a
disable, then an enable).  Which thread comes in is the sideband's word
(its switches), placed in the stream by the rule the views use
(:meth:`hwtrace.analysis.switches.SwitchTimeline.resumes`): the switches
that certainly came before an enable by the trace's clock, or the next
ones whose thread left off right where tracing resumes -- here a thread
left off at the instruction an asynchronous disable names, or after the
last instruction before a disable (a system call goes on after itself);
a thread that first runs here begins where its creator left off (both
return from ``clone`` or ``fork``), which the sideband's thread records
say (``born``).

:func:`own_batches` walks a CPU stream's batches with that rule and
yields the slices that are one thread's: its segments (enable ..
disable) on this CPU, in order, the decoder's records and items
untouched.  :mod:`.cpumerge` then joins them with the thread's segments
from other CPUs.  Each thread walks the stream anew (a decode per thread
on that CPU, up to where its last switch in is behind it): nothing of a
stream is held beyond the batch at hand.

No I/O: takes batch iterators and a timeline.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

from hwtrace.flow.batches import Batch, SpaceItem

from .cpumerge import _slice


class Owners:
    """Who runs on one CPU, batch by batch (the rule of the module doc).
    ``timeline``: that CPU's :class:`~hwtrace.analysis.switches.SwitchTimeline`."""

    def __init__(self, timeline, born: dict | None = None):
        self.tl = timeline
        self.owner: tuple | None = None     # (pid, tid) running, or None
        self.enabled: bool | None = None    # tracing on (None: unknown)
        self._last = None                   # the last record (ip, end, size)
        self._stopped: dict = {}            # tid -> where it left off
        #: tid -> its creator's, for threads that first run on this CPU
        self._born = born or {}
        self._seen: set = set()             # tids that ran here

    def _resume(self, n: int, ip) -> None:
        tl = self.tl
        tl.tracing(True)
        own = self.owner
        stopped = self._stopped
        born = self._born
        seen = self._seen

        def left_off(pid, tid) -> bool:
            if ip is None or tid is None:
                return False
            if tid in seen:
                return stopped.get(tid) == ip
            c = born.get(tid)               # not run yet: where it begins
            return c is not None and stopped.get(c) == ip

        pid, tid = tl.resumes(n, own is not None,
                              own[0] if own else None, own[1] if own else None,
                              left_off)
        self.owner = (pid, tid)
        seen.add(tid)

    def _stop(self, item) -> None:
        self.tl.tracing(False)
        tid = self.owner[1] if self.owner is not None else None
        if tid is None:
            return
        if item.type == "async_disabled":
            at = getattr(item, "at", None)
        elif self._last is not None:
            at = self._last[1] + self._last[2]
        else:
            at = None
        self._stopped[tid] = at

    def cuts(self, b: Batch) -> list[tuple]:
        """``b`` as runs of one owner each: ``(owner, r0, r1, i0, i1)``
        (records [r0, r1), items [i0, i1)); owner None: nobody known."""
        blocks = b.blocks
        m = len(blocks)
        tl = self.tl
        if m:
            start = np.empty(m + 1, np.int64)
            start[0] = 0
            np.cumsum(blocks["ninsn"], out=start[1:])
            start += b.first_insn
            tsc = blocks["tsc"]
        out = []
        r0 = i0 = 0
        r = 0                               # records told so far

        def records(r1: int) -> None:
            nonlocal r
            if r1 <= r:
                return
            if self.owner is None and self.enabled is None:
                # traced from the stream's start, no enable said so
                self._resume(int(start[r]), int(blocks["ip"][r]))
                self.enabled = True
            if not tl.deaf:
                # each time value where it is first reported: a record
                # carries the last timing packet's, however long ago --
                # told only at a run's end it put that time many
                # instructions late, and the switches after it too
                t = tsc[r:r1]
                for k in [0, *(np.flatnonzero(t[1:] != t[:-1]) + 1).tolist()]:
                    v = int(t[k])
                    if v:
                        tl.time(int(start[r + k]), v)
            last = blocks[r1 - 1]
            self._last = (int(last["ip"]), int(last["end_ip"]), int(last["size"]))
            r = r1

        for k, (idx, _off, it) in enumerate(b.items):
            records(idx)
            n = int(start[idx]) if m else b.first_insn
            t = getattr(it, "type", None)
            if t == "error":
                self.enabled = None
                continue
            if not hasattr(it, "status_update"):
                continue                    # not an event
            if getattr(it, "has_tsc", False):
                tl.time(n, it.tsc)
            su = bool(it.status_update)
            if t in ("disabled", "async_disabled") and not su:
                self.enabled = False
                self._stop(it)
            elif t == "overflow":
                self.enabled = None
            elif t == "enabled":
                if su and self.enabled:
                    continue                # a PSB+ restating where it is
                self.enabled = True
                before = self.owner
                self._last = None           # nothing of the resumed segment yet
                self._resume(n, getattr(it, "ip", None))
                if self.owner != before and (idx > r0 or k > i0):
                    out.append((before, r0, idx, i0, k))
                    r0, i0 = idx, k
        records(m)
        if m > r0 or len(b.items) > i0:
            out.append((self.owner, r0, m, i0, len(b.items)))
        return out


def own_batches(batches: Iterable[Batch], timeline, tid: int,
               done: Callable[[], None] | None = None,
               born: dict | None = None) -> Iterator[Batch]:
    """The slices of a CPU stream's ``batches`` that thread ``tid`` ran
    (by ``timeline``, that CPU's switches; a fresh one per walk).  The
    walk ends once the switches that bring ``tid`` in are all behind and
    another thread runs (the rule can't choose it again: nothing after
    is its own); then ``done()`` is called, the rest left undecoded.
    ``born``: {tid: its creator's tid} of the threads that first run on
    this CPU."""
    who = Owners(timeline, born)
    sw = timeline.switches
    last_in = max((k for k, s in enumerate(sw) if s.next_tid == tid), default=-1)
    space = None            # the latest address-space switch of the stream
    told = None             # ... the thread's pieces said
    for b in batches:
        for owner, r0, r1, i0, i1 in who.cuts(b):
            mine = owner is not None and owner[1] == tid
            if mine and space is not told and not (
                    i0 < i1 and b.items[i0][0] == r0 and
                    isinstance(b.items[i0][2], SpaceItem)):
                # the space it runs in was said in another thread's piece:
                # say it again where its own piece begins (an exec is told
                # by the space after it)
                piece = _slice(b, r0, r1, i0, i1)
                yield piece._replace(items=[(0, space.offset, space),
                                            *piece.items])
                told = space
            elif mine:
                if r0 == 0 and r1 == len(b.blocks) and i0 == 0 and i1 == len(b.items):
                    yield b
                else:
                    yield _slice(b, r0, r1, i0, i1)
            for _i, _o, it in b.items[i0:i1]:
                if isinstance(it, SpaceItem):
                    space = it
                    if mine:
                        told = it
        if timeline.i > last_in and (who.owner is None or who.owner[1] != tid):
            if done is not None:
                done()
            return
