"""Events a run of records goes on through (part of the call-stack
builder's batch input, :mod:`.batchfeed`): system calls that come back
where they were made, and events that only tell the time.

Under user-only filtering every system call ends tracing at the syscall
(``disabled``, TIP.PGD) and begins it again at its return address
(``enabled``, TIP.PGE).  One at a time the builder opens an untraced
``[syscall]`` frame at the disable (the pending far call) and closes it
at the enable (back at its return address).  A program making thousands
of system calls cut its batches into thousands of short runs, each
solved on its own at a fixed cost far above the records' (views 4-5x
slower than the reference decoder on ``find``); following a CPU's
threads, so did every PSB+'s status updates, which only tell the time.

The items at one instruction index ``j`` (between records ``j - 1`` and
``j`` of the batch) are taken into the run as a *group* when they are

* a round trip: ``disabled`` then ``enabled`` (neither a status update),
  record ``j - 1`` ending in a far call whose fall-through is the
  enable's IP and where record ``j`` begins; or
* only events that tell the time (``anchors``: a status update enabling
  or disabling, or an event the builder takes for its time alone --
  what it does with them once no switch of the threads it follows is
  left to apply: the timeline's times matter only to that choice);

and none has a TSC of 0 (a time for an event, none for a record).
:func:`find` takes the groups out of the items; the run goes on through
them, and :meth:`Groups.virtual` gives :func:`.runs.solve` transfer
``j - 1`` as

* anchors: one transfer that does nothing per event, landing at ``j``
  timed by the event's TSC, then transfer ``j - 1`` itself;
* a round trip: ``A``, the far call into a frame of unknown code named
  ``[syscall]`` (its name given, not looked up), landing at ``j`` timed
  by the disable's TSC; ``B``, a far return out of it to its return
  address, timed by the enable's; ``C``, nothing, landing on record
  ``j`` (its own TSC).

Per transfer the solve numbers the landing's anchor, then a close, then
an open: the order in which the events, one at a time, make the same
anchors and rows (numbered with gaps: only the order matters).  A solve
stops only at a transfer of the batch (B closes what A opened, C and
the anchors do nothing): the group's anchors before it are then left
for the builder, which, wherever a run is taken one transfer at a time,
hands a group's events to its event handling as they came
(:meth:`Groups.events`).

Names: code no symbol names gets its name id when first met -- one at a
time where the builder takes a transfer one at a time, in bulk (in
address order) where a solve meets it -- so the ids, and the call-path
hashes made of them, depend on where the events cut the runs.  So that
every id stays what it was, a solve goes on through groups only where it
names nothing new (the compiled walk says what it would name; the twin,
and any lookup callback, are asked beforehand); from the first such
solve on, the batch's calls' and jumps' targets not named yet
(:meth:`Groups.quiet`) stop the runs at the group before them, and the
builder takes that stretch as the events cut it: a run per group, the
same steps one at a time after an irregular transfer, the same windows.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis import runs
from hwtrace.analysis.slices import _UNKNOWN
from hwtrace.flow.events import Event

_U8 = np.uint64

_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


class Groups:
    """The groups of one batch, by the transfer (record) before them:
    ``tr`` sorted."""

    __slots__ = ("tr", "_tsc", "_trip", "_events", "_tracing", "_virtual",
                 "_hazard", "hazards")

    def __init__(self, found: list):
        self.tr = np.array([f[0] for f in found], np.int64)
        self._trip = np.array([f[1] for f in found], bool)
        self._tsc = [f[2] for f in found]
        self._events = {f[0]: f[3] for f in found}
        self._tracing = {f[0]: f[4] for f in found if f[4] is not None}
        self._virtual = None
        self._hazard = None
        self.hazards = False        # where something new may be named matters

    def next(self, t: int, last: int) -> int:
        """The first group's transfer at or after ``t``, or ``last`` if
        none is before it."""
        i = int(np.searchsorted(self.tr, t))
        return min(int(self.tr[i]), last) if i < len(self.tr) else last

    def before(self, t: int) -> int:
        """The last group's transfer before ``t`` (-1: none)."""
        i = int(np.searchsorted(self.tr, t))
        return int(self.tr[i - 1]) if i else -1

    def at(self, t: int) -> bool:
        return t in self._events

    def trips(self) -> np.ndarray:
        """The transfers (far calls) before the round trips."""
        return self.tr[self._trip]

    def quiet(self, a, fresh, t: int, last: int, cond: bool) -> int:
        """How far from transfer ``t`` the run may go on through the
        groups: to the last group's transfer before the first transfer
        whose solving may name code not named when the batch came (a
        call's target, a jump's -- a conditional one's too with ``cond``:
        ``fresh``), or ``last``."""
        if self._hazard is None:
            n = len(a.code) - 1
            c = a.code[:n]
            tgt = a.ip[1:]
            j = (c == runs.JUMP) | (c == runs.COND) if cond else c == runs.JUMP
            look = ((c == runs.CALL) | j) & (tgt != a.fall[:n]) | (c == runs.FCALL)
            look[self.tr[self._trip]] = False   # a round trip's: no code
            at = np.flatnonzero(look)
            self._hazard = at[fresh(tgt[at])]
        h = self._hazard
        i = int(np.searchsorted(h, t))
        if i == len(h) or h[i] >= last:
            return last
        if not fresh(a.ip[h[i] + 1:h[i] + 2])[0]:
            # named since (naming only adds): asked again, those before
            # ``last`` whose code is named now are no hazard any more
            j = int(np.searchsorted(h, last))
            w = h[i:j]
            w = w[fresh(a.ip[w + 1])]
            self._hazard = h = np.concatenate((h[:i], w, h[j:]))
            if i == len(h) or h[i] >= last:
                return last
        return self.before(int(h[i]) + 1)

    def events(self, t: int):
        """The (offset, item) of the group after transfer ``t``, or None:
        no group there."""
        return self._events.get(t)

    def after(self, t0: int, t1: int):
        """What the events of the groups after transfers [t0, t1) leave of
        the builder's state: (tracing on or off -- the last enable or
        disable among them --, or None: none says; whether a round trip
        is among them: not paused)."""
        lo, hi = np.searchsorted(self.tr, (t0, t1))
        on = None
        for t in self.tr[lo:hi][::-1].tolist():
            on = self._tracing.get(t)
            if on is not None:
                break
        return on, bool(self._trip[lo:hi].any())

    def virtual(self, a):
        """The batch's transfers (all ``len(a.code) - 1`` of them) with the
        groups' in: (code, fall, tgt, land_idx, src, landing TSC, named,
        vmap, first) -- ``vmap`` the batch's transfer of each, ``first``
        the first of each of the batch's (and one past the last)."""
        if self._virtual is not None:
            return self._virtual
        n = len(a.code) - 1
        tr = self.tr
        trip = self._trip
        cnt = np.ones(n, np.int64)
        cnt[tr] = [len(t) + 1 for t in self._tsc]
        vmap = np.repeat(np.arange(n, dtype=np.int64), cnt)
        first = np.zeros(n + 1, np.int64)
        np.cumsum(cnt, out=first[1:])
        code = a.code[:n].take(vmap)
        tgt = a.ip[1:].take(vmap)
        land = a.start[1:n + 1].take(vmap)
        tsc = a.tsc[1:].take(vmap)
        named = np.zeros(len(vmap), bool)
        # every event's landing: the group's first ones
        at = np.repeat(first[tr], cnt[tr] - 1) + _ramp(cnt[tr] - 1)
        tsc[at] = np.array([t for ts in self._tsc for t in ts], _U8)
        va = first[tr[trip]]
        an = at[~np.repeat(trip, cnt[tr] - 1)]
        code[an] = runs.NONE            # anchors, then the transfer itself
        code[va + 1] = runs.FRET        # a round trip: A, B, C
        code[va + 2] = runs.NONE
        tgt[va] = _U8(_UNKNOWN)
        # C lands on the record (its TSC), where the FCALL's (A's) was
        tsc[va + 2] = a.tsc[tr[trip] + 1]
        named[va] = True
        self._virtual = (code, a.fall[:n].take(vmap), tgt, land,
                         a.end[:n].take(vmap), tsc, named, vmap, first)
        return self._virtual


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0, 1, .., c - 1 for each count c, concatenated."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def find(items: list, code: np.ndarray, fall: np.ndarray, ip: np.ndarray,
         m: int, anchors: bool, left: bool = False):
    """(the items without the groups, :class:`Groups` or None) for a batch
    of ``m`` records whose items (index, offset, item) are ``items``;
    ``anchors``: take events that only tell the time too.  ``left``:
    following threads with switches left to apply -- only groups of
    events that only tell the time and leave tracing on (no round trip:
    its enable may bring another thread in; no status update disabling:
    the next one enabling asks who runs), which the builder takes in the
    run only while the timeline hears no time
    (:attr:`.switches.SwitchTimeline.deaf`) and tracing is on, else one
    at a time as they came."""
    found = []
    keep = []
    n = len(items)
    p = 0
    fcall = runs.FCALL
    while p < n:
        j, o1, e1 = items[p]
        q = p + 1
        while q < n and items[q][0] == j:
            q += 1
        if not 0 < j < m:
            keep.extend(items[p:q])
            p = q
            continue
        if q - p == 2 and not left and type(e1) is Event \
                and e1.type == "disabled" and not e1.status_update:
            # a round trip?
            _j, o2, e2 = items[p + 1]
            if type(e2) is Event and e2.type == "enabled" and not e2.status_update:
                t1 = (e1.tsc or None) if e1.has_tsc else 0
                t2 = (e2.tsc or None) if e2.has_tsc else 0
                ret = int(fall[j - 1])
                if t1 is not None and t2 is not None and code[j - 1] == fcall \
                        and e2.ip == ret and int(ip[j]) == ret:
                    found.append((j - 1, True, (t1, t2), ((o1, e1), (o2, e2)), True))
                else:
                    keep.extend(items[p:q])
                p = q
                continue
        g = _anchors(items, p, q, left) if anchors else None
        if g is None:
            keep.extend(items[p:q])
        else:
            found.append(g)
        p = q
    if not found:
        return items, None
    return keep, Groups(found)


def _anchors(items, p, q, left: bool = False):
    """The group of items [p, q) (all at one index) if they only tell the
    time (and, ``left``, disable nothing), else None."""
    on = None
    tscs = []
    for _j, _o, ev in items[p:q]:
        if type(ev) is not Event:
            return None
        t = ev.type
        if t in _STRUCTURAL:
            if not (ev.status_update and t in ("enabled", "disabled")) \
                    or (left and t == "disabled"):
                return None
            on = t == "enabled"
        ts = (ev.tsc or None) if ev.has_tsc else 0
        if ts is None:
            return None
        tscs.append(ts)
    j = items[p][0]
    return (j - 1, False, tscs, tuple((o, ev) for _j, o, ev in items[p:q]), on)
