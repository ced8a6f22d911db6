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

from hwtrace.analysis import _runs_impl, runs
from hwtrace.analysis.slices import _UNKNOWN
from hwtrace.flow import plain
from hwtrace.flow.events import Event

_U8 = np.uint64

_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


class Groups:
    """The groups of one batch, by the transfer (record) before them:
    ``tr`` sorted.  Kept as columns over the batch's items -- group ``i``
    is items ``[p[i], q[i])`` -- not a tuple per group: on ``find`` a
    batch has ~1,100 of them, and per-group objects (and the collector's
    passes over them) cost more than finding them.  The items: a list,
    or (:func:`find_rows`) a list and plain events' rows in one order,
    an event made of its row only where the builder takes it one at a
    time."""

    __slots__ = ("tr", "_items", "_p", "_q", "_trip", "_on", "_index",
                 "_virtual", "_hazard", "hazards")

    def __init__(self, items, tr: np.ndarray, p: np.ndarray, q: np.ndarray,
                 trip: np.ndarray, on: np.ndarray):
        self.tr = tr
        self._items = items if isinstance(items, (_ListItems, _RowItems)) \
            else _ListItems(items)
        self._p, self._q = p, q
        self._trip = trip
        self._on = on               # tracing the events leave: 1 on, 0 off, -1 unsaid
        self._index = None
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

    def _at(self) -> dict:
        if self._index is None:
            self._index = dict(zip(self.tr.tolist(), range(len(self.tr))))
        return self._index

    def at(self, t: int) -> bool:
        return t in self._at()

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
        i = self._at().get(t)
        if i is None:
            return None
        return tuple((o, ev) for _j, o, ev in self._items.get(int(self._p[i]), int(self._q[i])))

    def after(self, t0: int, t1: int):
        """What the events of the groups after transfers [t0, t1) leave of
        the builder's state: (tracing on or off -- the last enable or
        disable among them --, or None: none says; whether a round trip
        is among them: not paused)."""
        lo, hi = np.searchsorted(self.tr, (t0, t1))
        said = np.flatnonzero(self._on[lo:hi] >= 0)
        on = bool(self._on[lo + said[-1]]) if len(said) else None
        return on, bool(self._trip[lo:hi].any())

    def trip_clock(self, a, t0: int, t1: int):
        """The round trips after transfers [t0, t1), as the timeline hears
        them: (their transfers, the instruction index of the enable, the
        disable's TSC, the time told while tracing is off -- the enable's
        TSC, or with a PSB+ in between, :func:`_told`; 0: none)."""
        lo, hi = np.searchsorted(self.tr, (t0, t1))
        w = np.flatnonzero(self._trip[lo:hi]) + lo
        tr = self.tr[w]
        p, q = self._p[w], self._q[w]
        told = self._items.tscs(p + 1)
        for i in np.flatnonzero(q - p > 2).tolist():
            told[i] = _told(self._items.peek(int(p[i]), int(q[i])))
        return (tr, a.start[tr + 1], self._items.tscs(p), told)

    def _enable_at(self, trip: np.ndarray) -> np.ndarray:
        """Where in each round trip (``trip``: the groups that are) its
        enable is: the second event, but where a PSB+ came at it."""
        p, q = self._p[trip], self._q[trip]
        at = np.ones(len(p), np.int64)
        for i in np.flatnonzero(q - p > 2).tolist():
            at[i] = _trip_enable(self._items.peek(int(p[i]), int(q[i])), 0,
                                 int(q[i] - p[i]))
        return at

    def virtual(self, a):
        """The batch's transfers (all ``len(a.code) - 1`` of them) with the
        groups' in: (code, fall, tgt, land_idx, src, landing TSC, named,
        first) -- ``first`` the first of each of the batch's transfers
        (and one past the last): transfer ``t`` is ``first[t]`` (its
        group's events) to ``first[t + 1] - 1`` (itself)."""
        if self._virtual is not None:
            return self._virtual
        n = len(a.code) - 1
        tr = self.tr
        trip = self._trip
        ne = self._q - self._p                  # events per group
        cnt = np.ones(n, np.int64)
        cnt[tr] = ne + 1
        first = np.zeros(n + 1, np.int64)
        np.cumsum(cnt, out=first[1:])
        spread = _spreader(tr, ne, cnt, int(first[n]))
        code = spread(a.code[:n])
        tgt = spread(a.ip[1:])
        land = spread(a.start[1:n + 1])
        tsc = spread(a.tsc[1:])
        named = np.zeros(int(first[n]), bool)
        # every event's landing: the group's first ones
        at = np.repeat(first[tr], ne) + _ramp(ne)
        tsc[at] = self._items.tscs(np.repeat(self._p, ne) + _ramp(ne))
        va = first[tr[trip]]
        nt = ne[trip]
        an = at[~np.repeat(trip, ne)]
        code[an] = runs.NONE            # anchors, then the transfer itself
        # a round trip: A, B, C -- a PSB+'s anchors before or after B
        code[at[np.repeat(trip, ne)]] = runs.NONE
        code[va] = runs.FCALL
        code[va + self._enable_at(trip)] = runs.FRET
        code[va + nt] = runs.NONE
        tgt[va] = _U8(_UNKNOWN)
        # C lands on the record (its TSC), where the FCALL's (A's) was
        tsc[va + nt] = a.tsc[tr[trip] + 1]
        named[va] = True
        self._virtual = (code, spread(a.fall[:n]), tgt, land, spread(a.end[:n]),
                         tsc, named, first)
        return self._virtual


def _spreader(tr: np.ndarray, ne: np.ndarray, cnt: np.ndarray, total: int):
    """A batch's per-transfer column -> the same with transfer ``tr[i]``'s
    item ``ne[i] + 1`` times (room for its group's events before it):
    ``take`` of each transfer ``cnt`` times, or the compiled core's
    ``spread`` (runs of memcpy instead of a gather per item: six columns
    of a batch's ~260,000 transfers)."""
    core = _runs_impl.core_for(None)
    if core is None:
        vmap = np.repeat(np.arange(len(cnt), dtype=np.int64), cnt)
        return lambda x: x.take(vmap)
    tr = np.ascontiguousarray(tr, np.int64)
    ne = np.ascontiguousarray(ne, np.int64)

    def spread(x):
        x = np.ascontiguousarray(x)
        out = np.empty(total, x.dtype)
        core.spread(x, tr, ne, out)
        return out
    return spread


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0, 1, .., c - 1 for each count c, concatenated."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def find(items: list, code: np.ndarray, fall: np.ndarray, ip: np.ndarray,
         m: int, anchors: bool, left: bool = False, trips: bool | None = None):
    """(the items without the groups, :class:`Groups` or None) for a batch
    of ``m`` records whose items (index, offset, item) are ``items``;
    ``anchors``: take events that only tell the time too.  ``left``:
    following threads with switches left to apply -- only groups of
    events that only tell the time and leave tracing on (no status update
    disabling: the next one enabling asks who runs), and round trips only
    with ``trips`` (a clock counting the traced instructions: the
    builder knows beforehand which enables bring no switch in,
    :meth:`Groups.trip_clock`), which the builder takes in the run only
    while the timeline hears no time
    (:attr:`.switches.SwitchTimeline.deaf`) and tracing is on, and only up
    to the enable that may apply a switch, else one at a time as they
    came.  ``trips`` is ``not left`` unless given.

    The round trips (most groups where system calls cut the runs: ~1,100
    a batch on ``find``) are picked out at once -- two items at an index,
    the records' side in numpy, the events' in one pass -- and every
    other group goes through :func:`_one` (:func:`_find_each`: all of
    them, one at a time, what this gives)."""
    n = len(items)
    if trips is None:
        trips = not left
    if (left and not trips) or n < 64:
        return _find_each(items, code, fall, ip, m, anchors, left, trips)
    js = np.fromiter([it[0] for it in items], np.int64, n)
    cut = np.flatnonzero(js[1:] != js[:-1]) + 1
    gp = np.concatenate(([0], cut))             # each group's first item
    gq = np.concatenate((cut, [n]))
    gj = js[gp]
    cand = np.flatnonzero((gq - gp == 2) & (gj > 0) & (gj < m))
    cj = gj[cand]
    cand = cand[(code[cj - 1] == runs.FCALL) & (fall[cj - 1] == ip[cj])]
    ps = gp[cand].tolist()
    E = Event
    ok = [type(e1) is E and type(e2) is E and e1.type == "disabled"
          and e2.type == "enabled" and not e1.status_update
          and not e2.status_update and e2.ip == ret
          and not (e1.has_tsc and not e1.tsc) and not (e2.has_tsc and not e2.tsc)
          for e1, e2, ret in zip([items[p][2] for p in ps],
                                 [items[p + 1][2] for p in ps],
                                 fall[gj[cand] - 1].tolist())]
    trip = cand[np.array(ok, bool)] if ok else cand
    on = np.full(len(gp), -2, np.int8)          # -2: not a group
    on[trip] = 2
    rest = np.flatnonzero(on == -2)
    keep = []
    for g, p, q in zip(rest.tolist(), gp[rest].tolist(), gq[rest].tolist()):
        f = _one(items, p, q, code, fall, ip, m, anchors, left, trips)
        if f is None:
            keep.extend(items[p:q])
        else:
            on[g] = f
    groups = _taken(items, gj, gp, gq, on)
    return (items, None) if groups is None else (keep, groups)


def _taken(items, gj, gp, gq, on) -> Groups | None:
    """The groups taken in bulk (``on`` not -2: 2 a round trip, else the
    enable state after a time-only group), as Groups over ``items``;
    None if there are none."""
    at = np.flatnonzero(on != -2)
    if not len(at):
        return None
    on = on[at]
    trips = on == 2
    on[trips] = 1
    return Groups(items, gj[at] - 1, gp[at], gq[at], trips, on)


def _find_each(items: list, code: np.ndarray, fall: np.ndarray, ip: np.ndarray,
               m: int, anchors: bool, left: bool = False, trips: bool | None = None):
    """:func:`find`, a group at a time."""
    if trips is None:
        trips = not left
    keep = []
    tr, ps, qs, trip, on = [], [], [], [], []
    n = len(items)
    p = 0
    while p < n:
        j = items[p][0]
        q = p + 1
        while q < n and items[q][0] == j:
            q += 1
        f = _one(items, p, q, code, fall, ip, m, anchors, left, trips)
        if f is None:
            keep.extend(items[p:q])
        else:
            tr.append(j - 1)
            ps.append(p)
            qs.append(q)
            trip.append(f == 2)
            on.append(1 if f == 2 else f)
        p = q
    if not tr:
        return items, None
    return keep, Groups(items, np.array(tr, np.int64), np.array(ps, np.int64),
                        np.array(qs, np.int64), np.array(trip, bool),
                        np.array(on, np.int8))


def _one(items, p, q, code, fall, ip, m, anchors, left, trips):
    """The group of items [p, q) (all at one index): 2 a round trip, the
    tracing anchors leave (1 on, 0 off, -1 unsaid), or None: not a group
    (its items are kept)."""
    j, _o1, e1 = items[p]
    if not 0 < j < m:
        return None
    if q - p >= 2 and trips and type(e1) is Event \
            and e1.type == "disabled" and not e1.status_update:
        # a round trip? (a PSB+ at it: events that only tell the time)
        e = _trip_enable(items, p, q)
        if e is not None:
            e2 = items[p + e][2]
            t1 = (e1.tsc or None) if e1.has_tsc else 0
            t2 = (e2.tsc or None) if e2.has_tsc else 0
            ret = int(fall[j - 1])
            if t1 is not None and t2 is not None and code[j - 1] == runs.FCALL \
                    and e2.ip == ret and int(ip[j]) == ret:
                return 2
        if q - p == 2:
            return None
    return _anchors(items, p, q, left) if anchors else None


def _trip_enable(items, p: int, q: int) -> int | None:
    """Where (from p) the enable of a round trip is among items [p, q),
    a disable at p: the one enable that is no status update, every
    other event one that only tells the time -- after the enable, none
    disabling (tracing stays on) -- or None."""
    if q - p == 2:
        _j, _o, ev = items[p + 1]
        return 1 if type(ev) is Event and ev.type == "enabled" and \
            not ev.status_update else None
    e = None
    for k in range(p + 1, q):
        ev = items[k][2]
        if type(ev) is not Event:
            return None
        t = ev.type
        if t == "enabled" and not ev.status_update:
            if e is not None:
                return None
            e = k - p
        elif t in _STRUCTURAL and not (ev.status_update and (
                t == "enabled" or (t == "disabled" and e is None))):
            return None
        elif ev.has_tsc and not ev.tsc:
            return None
    return e


def _told(group) -> int:
    """The time a round trip with a PSB+ in it (its (offset, event) or
    items) tells the timeline while tracing is off
    (:meth:`.switches.SwitchTimeline.time`): the latest TSC from the
    event after the disable up to the first that enables (a PSB+'s status
    update enabling turns tracing on: the times after it are not heard);
    0: none."""
    told = 0
    for x in group[1:]:
        ev = x[-1]
        if ev.has_tsc and ev.tsc > told:
            told = ev.tsc
        if ev.type == "enabled":
            break
    return told


def _anchors(items, p, q, left: bool = False):
    """Whether the items [p, q) (all at one index) only tell the time
    (and, ``left``, disable nothing): the tracing they leave (1 on, 0
    off, -1 unsaid), else None."""
    on = -1
    for _j, _o, ev in items[p:q]:
        if type(ev) is not Event:
            return None
        t = ev.type
        if t in _STRUCTURAL:
            if not (ev.status_update and t in ("enabled", "disabled")) \
                    or (left and t == "disabled"):
                return None
            on = 1 if t == "enabled" else 0
        if ev.has_tsc and not ev.tsc:
            return None
    return on


class _ListItems:
    """A batch's items as a list (what :class:`Groups` reads of them)."""

    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items

    def get(self, p: int, q: int) -> list:
        return self.items[p:q]

    peek = get

    def tscs(self, at: np.ndarray) -> np.ndarray:
        """The TSC of the events at ``at`` (0: none)."""
        items = self.items
        return np.array([ev.tsc if ev.has_tsc else 0 for ev in
                         [items[i][2] for i in at.tolist()]], _U8)


class _RowItems:
    """A batch's items and plain events' rows in one order
    (:func:`find_rows`): item ``i`` is ``rows[src[i]]`` where ``isrow[i]``,
    else ``items[src[i]]``; an Event is made of a row only when asked."""

    __slots__ = ("items", "rows", "isrow", "src", "tsc", "_seen")

    def __init__(self, items: list, rows: np.ndarray, isrow: np.ndarray,
                 src: np.ndarray, tsc: np.ndarray):
        self.items, self.rows, self.isrow, self.src = items, rows, isrow, src
        self.tsc = tsc              # a row's TSC (0: none), per item
        self._seen: dict = {}       # (p, q) -> what peek made

    def get(self, p: int, q: int) -> list:
        rows, items = self.rows, self.items
        out = []
        for k, r in zip(self.src[p:q].tolist(), self.isrow[p:q].tolist()):
            if r:
                t = rows[k].tolist()        # (index, offset, ...: plain.PLAIN)
                out.append((t[0], t[1], plain.event(t)))
            else:
                out.append(items[k])
        return out

    def peek(self, p: int, q: int) -> list:
        """:meth:`get` for a look only (the events not to be changed nor
        handed on): made once per group however often looked at -- a
        round trip with a PSB+ in it is looked at up to four times."""
        g = self._seen.get((p, q))
        if g is None:
            g = self._seen[(p, q)] = self.get(p, q)
        return g

    def tscs(self, at: np.ndarray) -> np.ndarray:
        out = self.tsc[at]
        lst = at[~self.isrow[at]]
        if len(lst):
            out[~self.isrow[at]] = _ListItems(self.items).tscs(self.src[lst])
        return out


def find_rows(items: list, at: np.ndarray, rows: np.ndarray, code: np.ndarray,
              fall: np.ndarray, ip: np.ndarray, m: int, anchors: bool,
              left: bool = False, trips: bool | None = None):
    """:func:`find` over a batch's items and its plain events' rows
    (:mod:`hwtrace.flow.plain`; ``at``: the items' places among both):
    (the items outside the groups, rows made Events, in order;
    :class:`Groups` or None).  The groups of rows alone -- round trips,
    events that only tell the time -- are found on the columns; a group
    with an item in it goes through :func:`_one` (what
    :func:`_find_each` does with every group)."""
    nl, nr = len(items), len(rows)
    n = nl + nr
    if trips is None:
        trips = not left
    if not nr:
        return find(items, code, fall, ip, m, anchors, left, trips)
    order = np.argsort(np.concatenate((at, rows["pos"].astype(np.int64))),
                       kind="stable")
    isrow = order >= nl
    src = np.where(isrow, order - nl, order)
    rsrc = src[isrow]
    js = np.empty(n, np.int64)
    js[isrow] = rows["index"][rsrc].astype(np.int64)
    if nl:
        js[~isrow] = np.fromiter([it[0] for it in items], np.int64, nl)[src[~isrow]]
    # the rows' columns, per item (an item's: what no row has)
    typ = np.full(n, 255, np.uint8)
    typ[isrow] = rows["type"][rsrc]
    flags = np.zeros(n, np.uint8)
    flags[isrow] = rows["flags"][rsrc]
    etsc = np.zeros(n, _U8)
    etsc[isrow] = rows["tsc"][rsrc]
    eip = np.zeros(n, _U8)
    eip[isrow] = rows["ip"][rsrc]
    su = (flags & plain.PF_STATUS_UPDATE) != 0
    has = (flags & plain.PF_HAS_TSC) != 0
    tscok = ~(has & (etsc == 0))
    etsc[~has] = 0

    cut = np.flatnonzero(js[1:] != js[:-1]) + 1
    gp = np.concatenate(([0], cut))             # each group's first item
    gq = np.concatenate((cut, [n]))
    gj = js[gp]
    size = gq - gp
    nrow = np.add.reduceat(isrow.astype(np.int64), gp)
    inside = (gj > 0) & (gj < m)
    on = np.full(len(gp), -2, np.int8)          # -2: not a group
    # a round trip: a disable then an enable (no status update), two rows
    shaped = np.zeros(len(gp), bool)
    if trips:
        s2 = np.flatnonzero((size == 2) & (nrow == 2) & inside)
        p = gp[s2]
        s2 = s2[(typ[p] == plain.DISABLED) & ~su[p] & (typ[p + 1] == plain.ENABLED)
                & ~su[p + 1]]
        shaped[s2] = True
        p = gp[s2]
        r = gj[s2] - 1
        ret = fall[r]
        ok = tscok[p] & tscok[p + 1] & (code[r] == runs.FCALL) & (eip[p + 1] == ret) \
            & (ip[r + 1] == ret)
        on[s2[ok]] = 2
    if anchors:
        # events that only tell the time (a status update enabling or
        # disabling says the tracing it leaves)
        en_dis = (typ == plain.ENABLED) | (typ == plain.DISABLED)
        good = (~plain.STRUCTURAL[typ] | (su & en_dis)) & tscok & isrow
        if left:
            good &= typ != plain.DISABLED
        allgood = np.add.reduceat(good.astype(np.int64), gp) == size
        ga = np.flatnonzero(allgood & inside & ~shaped)
        if len(ga):
            # the last enable or disable of each group, if any
            last = np.where(en_dis, np.arange(n), -1)
            lastp = np.maximum.reduceat(last, gp)[ga]
            said = lastp >= 0
            on[ga] = -1
            on[ga[said]] = (typ[lastp[said]] == plain.ENABLED).astype(np.int8)
    seq = _RowItems(items, rows, isrow, src, etsc)
    # groups with an item in them, and round trips with a PSB+ in them (a
    # disable ... an enable, no status update): one at a time
    wide = np.zeros(len(gp), bool)
    if trips:
        wide = (size > 2) & (nrow == size) & (typ[gp] == plain.DISABLED) & ~su[gp]
        on[wide] = -2
    for g in np.flatnonzero(((nrow < size) | wide) & inside).tolist():
        p, q = int(gp[g]), int(gq[g])
        f = _one(seq.peek(p, q), 0, q - p, code, fall, ip, m, anchors, left, trips)
        if f is not None:
            on[g] = f
    grouped = np.repeat(on != -2, size)
    keep = []
    rest = np.flatnonzero(~grouped)
    if len(rest):
        kr = rest[isrow[rest]]
        made = iter(plain.items_of(rows[src[kr]]))
        keep = [next(made) if r else items[k]
                for r, k in zip(isrow[rest].tolist(), src[rest].tolist())]
    return keep, _taken(seq, gj, gp, gq, on)
