"""Batches into the call-stack builder (part of
:class:`~.callstack.CallStackBuilder`).

A batch's records are taken a run at a time: between two items that
matter (an event that changes the tracing state, an error), the
transfers from each record to the next go through :func:`.runs.solve`
as far as they are regular, the rest one at a time by the builder's own
rules (``_settle``); items in between go through its event handling.
Each record's TSC anchors the clock in sequence with the rows the
transfers make.  A system call's round trip, and events that only tell
the time, need not end a run (:mod:`.roundtrips`).

A jump out of its function into the middle of another is taken one at a
time (a run ends there) when it may unwind.  Where no frame below the
top is that function's it changes nothing (mempcpy jumping into
memcpy's body, once per call on ``find``: a run cut there each time),
as does a conditional jump back to the start of the function it is in (a
loop whose head is the entry, taken for a tail call to itself: ~9,000
cuts on a ``tar -czf`` recording, most followed by 64 records one at a
time); the runs go on past them (``soft``, :func:`.runs.solve`) where
that cannot change a name: where the runs are cut decides the order in
which code no symbol names is named when first met (in bulk by a solve,
one at a time in between), and so the name ids and the call paths made
of them.
So only while no call's or jump's target in the rest of the records
[t, r1) is code not named yet (:meth:`_Arrays.fresh_at`; over a merged
symbol table, where naming only ever adds) -- and, following threads,
once no switch is left to apply (the times the runs tell the timeline
choose the switches), or while the timeline hears no time until the next
event (:attr:`.switches.SwitchTimeline.deaf`: a clock counting the traced
instructions, tracing on -- a ``tar`` recording's three processes share
one stream, their last switch at its very end).
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis import _runs_impl, roundtrips, runs
from hwtrace.analysis.blockcols import columns
from hwtrace.analysis.records import Flag
from hwtrace.analysis.slices import _UNKNOWN
from hwtrace.analysis.symtable import AddrTable
from hwtrace.flow import plain

_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


def structural(ev) -> bool:
    """Whether a decoder event changes what the builder knows (else it
    only tells the time, which the records carry too)."""
    t = ev.type
    return t in _STRUCTURAL and not (ev.status_update and t in ("enabled", "disabled"))


class _Frame:
    __slots__ = ("id", "parent", "func", "name", "nid", "ret", "depth",
                 "begin_idx", "eseq", "flags", "untraced", "tx", "ret_lo",
                 "tid", "pid", "path")


class BatchInput:
    """Mixin of the builder: its batch input."""

    def feed_batch(self, batch, every_item: bool = False) -> None:
        """One :class:`hwtrace.flow.batches.Batch` of this stream (decoded
        with every branch ending a record), in order.  Events that only
        tell the time are skipped (the records carry it) unless
        ``every_item``."""
        blocks = batch.blocks
        m = len(blocks)
        self._jumped = False
        # a CPU's stream following its threads takes the time from every
        # item: a PSB+'s TSC is in its status updates, and the records
        # after it carry it only from the next event on (the estimate of
        # now, which decides the switches due at an enable, ran from the
        # last TSC at the wrong instruction, hundreds of ticks behind)
        spaced = self._space_lookup is not None
        every = every_item or self._follow is not None
        rows = getattr(batch, "plain", None)
        if rows is not None and not len(rows):
            rows = None
        if rows is None:
            items = batch.items if every else \
                [it for it in batch.items if _matters(it[2])
                 or (spaced and getattr(it[2], "type", None) == "space")]
        else:
            # the plain events are rows (flow.plain): made Events only
            # where they are taken one at a time
            items, at = batch.items, plain.item_positions(len(batch.items), rows)
            if not every:
                k = [i for i, it in enumerate(items) if _matters(it[2])
                     or (spaced and getattr(it[2], "type", None) == "space")]
                if len(k) < len(items):
                    items, at = [items[i] for i in k], at[k]
                rows = rows[plain.structural(rows)]
        if m:
            a = _Arrays(blocks, self.n)
            # system calls returning where they were made, and events
            # telling the time, go on in the run (.roundtrips) -- once
            # "[syscall]" has its name id (names are numbered in order of
            # appearance), and, following threads, once no switch is left
            # to apply: the timeline's times, which the events and records
            # tell it, matter only to the choice of switches at an enable
            sc = self.names.get("[syscall]")
            tl = self._follow
            if self.vectorize and sc is not None and m <= 1 << 20:
                # with switches left, only groups that tell the time, taken
                # in the run while the timeline does not hear it (_bulk),
                # and, on a clock counting the traced instructions, round
                # trips up to the enable that may bring a switch in
                # (_horizon)
                left = tl is not None and tl.i < len(tl.switches)
                trips = not left or tl.counted
                if rows is None:
                    items, a.groups = roundtrips.find(
                        items, a.code, a.fall, a.ip, m, tl is not None, left, trips)
                else:
                    items, a.groups = roundtrips.find_rows(
                        items, at, rows, a.code, a.fall, a.ip, m,
                        tl is not None, left, trips)
                    rows = None
                a.sys_nid = sc
        else:
            a = None
        if rows is not None:
            items = plain.merged(items, rows, at)
        self._arrays = a
        r = 0
        for index, offset, item in items:
            if index > r:
                self._records(a, r, index)
                r = index
            self._item(item, offset)
        if r < m:
            self._records(a, r, m)
        self._flush()

    def _item(self, item, offset) -> None:
        t = getattr(item, "type", None)
        if t == "space" and self._space_lookup is not None:
            self._enter_space(item.space)
            return
        if t == "error" and hasattr(item, "code"):
            self._gap("error", item.offset, str(item.code))
        elif t == "status":
            if item.name == "resync_stalled":
                self._gap("gap", item.offset, item.name)
        elif hasattr(item, "status_update"):
            from hwtrace.flow.sinks import event_json
            self.event(item.type, event_json(item, offset))
        else:
            self._feed_one(item)

    def _enter_space(self, space) -> None:
        """The records from here on run ``space``'s code: name it by the
        space's own files (one table per set of files, name ids shared).
        A run never goes on through the switch: the item is kept apart
        from the round trips and cuts the records."""
        lookup = self._space_lookup(space)
        table = self._space_tables.get(id(lookup))
        if table is None:
            table = self._space_tables[id(lookup)] = (lookup, AddrTable(lookup, self.names))
        self._lookup, self.addr = table
        a = self._arrays
        if a is not None:               # what is not named yet: by this table
            a._fresh = None
            if a.groups is not None:
                a.groups._hazard = None
        self._exec_check(space)

    def _records(self, a: "_Arrays", r0: int, r1: int) -> None:
        """Records [r0, r1) of the batch, with no event between them but
        the groups a run goes on through (:mod:`.roundtrips`)."""
        self._at_record(a, r0)
        t, last = r0, r1 - 1
        window = 1 << 20           # the whole run, until irregular ones show
        g = a.groups
        seg = t                    # where the last group was passed
        while t < last:
            self._soft = self._may_soften(a, t, last)
            stop = last if g is None else g.next(t, last)
            if t == stop:
                # a group's transfer: what its events did between two runs
                self._set_pend(a, t)
                self._group_events(a, t)
                t += 1
                self._at_record(a, t)
                window, seg = 1 << 20, t
                continue
            k = 0
            if self.vectorize and self._in_seg and self._stack:
                end = min(stop, t + window)
                c = self._through(a, t, stop, last) \
                    if stop < last and end == stop and self._bulk() else None
                if c is None:
                    k = self._solve(a, t, end)
                    t += k
                    if t == end:
                        window = min(2 * window, 1 << 17)
                        continue
                else:
                    t0 = t
                    c, q = c
                    t += c
                    if t == q or g.at(t):
                        continue
                    # where the events would have cut the run: the same
                    # steps and window from there (where one at a time a
                    # name may be met first, which solves name in bulk)
                    p = g.before(t)
                    if p >= t0:
                        seg = p + 1
                    k = t - max(seg, t0)
                    stop = g.next(t, last)
                window = max(4096, min(1 << 20, 4 * k))
            # irregular (or not vectorizing): one at a time, a few
            steps = 1 if k >= 16 or not self.vectorize else 64
            for _ in range(min(steps, stop - t)):
                self._set_pend(a, t)
                t += 1
                self._at_record(a, t)
        self._soft = False
        self.n = int(a.start[r1])
        self._set_pend(a, last)

    def _bulk(self) -> bool:
        """Whether the groups' events may be taken in the run now (else
        one at a time, as they came): following threads with switches
        left, only while the timeline does not hear the time they tell
        and tracing is on (a status update enabling then asks no one who
        runs) -- the groups found then (:func:`.roundtrips.find`,
        ``left``) leave both so, round trips up to the enable a switch
        may be due at (:meth:`_horizon`)."""
        tl = self._follow
        return tl is None or tl.i >= len(tl.switches) or \
            (tl.deaf and self._tracing is True)

    def _may_soften(self, a: "_Arrays", t: int, last: int) -> bool:
        """Whether solves from transfer t on may go on past jumps that
        may unwind but change nothing (see the module doc)."""
        if not self._jumped or not self.vectorize or self.addr.table() is None:
            return False
        tl = self._follow
        if tl is not None and tl.i < len(tl.switches) and not tl.deaf:
            return False
        return not a.fresh_in(self.addr.fresh, t, last)

    def _through(self, a: "_Arrays", t: int, stop: int, last: int):
        """:meth:`_solve_groups` from t as far as it may go (the batch's
        end, or, once something new to name is met, the last group before
        what may name it): (transfers committed, where it stopped), or
        None: not past the next group."""
        g = a.groups
        soft = self._soft
        try:
            for _ in range(2):
                q = g.quiet(a, self.addr.fresh, t, last,
                            self.addr.table() is None) if g.hazards else last
                q = self._horizon(a, t, q)
                if q <= stop:
                    return None
                # the run is cut at q's group (or goes on to the end): so
                # far, not to the end, nothing new may be named
                if q < last and not soft:
                    self._soft = self._may_soften(a, t, q)
                k = self._solve_groups(a, t, q)
                if k is not None:
                    return k, q
                g.hazards = True        # look where, once
            return None
        finally:
            self._soft = soft

    def _horizon(self, a: "_Arrays", t: int, q: int) -> int:
        """How far from transfer ``t`` (up to ``q``) the run may go on
        through the groups, following threads with switches left: to the
        first round trip whose enable may apply one, taken one at a time
        (the others bring nothing in: :meth:`_replay_clock`; the clock
        counts the traced instructions -- :meth:`.roundtrips.find` took
        the round trips only then -- and says which:
        :meth:`.switches.SwitchTimeline.trips_before_switch`)."""
        tl = self._follow
        if tl is None or tl.i >= len(tl.switches):
            return q
        tr, n, _t1, t2 = a.groups.trip_clock(a, t, q)
        k = tl.trips_before_switch(n, t2)
        return int(tr[k]) if k < len(tr) else q

    def _replay_clock(self, a: "_Arrays", t0: int, t1: int) -> None:
        """What the round trips after transfers [t0, t1), taken in the
        run, told the timeline, one at a time as they came (the times of
        the records and of events that only tell the time between them:
        nothing, tracing on -- :attr:`~.switches.SwitchTimeline.deaf`)."""
        tl = self._follow
        if tl is None or tl.i >= len(tl.switches):
            return
        _tr, n, _t1, t2 = a.groups.trip_clock(a, t0, t1)
        if len(n):
            tl.round_trips(n, t2)

    def _group_events(self, a: "_Arrays", t: int) -> None:
        """The events of the group after transfer t, if one is there
        (:mod:`.roundtrips`), as they came."""
        ev = a.groups.events(t)
        if ev is not None:
            self.n = int(a.start[t + 1])
            for offset, item in ev:
                self._item(item, offset)

    def _set_pend(self, a: "_Arrays", r: int) -> None:
        self._pend = int(a.code[r])
        self._pend_ip = int(a.end[r])
        self._pend_ret = int(a.fall[r])

    def _at_record(self, a: "_Arrays", r: int) -> None:
        """Record r's first instruction: its time, then the transfer that
        led there (or the start of a segment)."""
        self.n = int(a.start[r])
        tsc = int(a.tsc[r])
        if tsc:
            self._anchor(tsc)
            if self._follow is not None:
                self._follow.time(self.n, tsc)
        if self._pend:
            self._settle(int(a.ip[r]))
        elif not self._in_seg:
            self._start_segment(int(a.ip[r]))
        self._after_abort = False

    def _summary(self) -> np.ndarray:
        """STACK rows of the stack (kept current incrementally)."""
        stack = self._stack
        n = len(stack)
        if self._sum_n < n or len(self._sum) != n:
            stid = -1 if self._tid is None else self._tid
            spid = -1 if self._spid is None else self._spid
            rows = [(f.id, f.parent, _UNKNOWN if f.func is None else f.func,
                     f.nid, int(f.flags), spid if f.pid is None else f.pid,
                     stid if f.tid is None else f.tid, f.begin_idx, f.eseq, f.path,
                     f.ret if f.ret is not None else 0,
                     f.ret is not None and f.ret_lo is None)
                    for f in stack[self._sum_n:]]
            self._sum = _joined(self._sum[:self._sum_n], np.array(rows, runs.STACK))
            self._sum_n = n
        return self._sum

    def _solve(self, a: "_Arrays", t0: int, t1: int) -> int:
        """Transfers [t0, t1) vectorized, as far as they are regular."""
        seq0 = self._seq + 1
        tr = runs.Transfers(a.code[t0:t1], a.fall[t0:t1], a.ip[t0 + 1:t1 + 1],
                            a.start[t0 + 1:t1 + 1], a.end[t0:t1])
        c = self._run_solve(tr, seq0, max(0, a.scanned - t0))
        a.scanned = max(a.scanned, t1)
        k = c.k
        if not k:
            return 0
        # the records' anchors, in order with the rows
        tsc = a.tsc[t0 + 1:t0 + 1 + k]
        if tsc.any():
            self.time.anchors_every(seq0, 4, a.start[t0 + 1:t0 + 1 + k], tsc)
            if self._follow is not None:
                r = t0 + 1 + int(np.flatnonzero(tsc)[-1])
                self._follow.time(int(a.start[r]), int(a.tsc[r]))
        self._seq = seq0 + 4 * k
        self._took(c)
        self.n = int(a.start[t0 + k])
        return k

    def _run_solve(self, tr, seq0: int, scanned: int, **extra):
        """:func:`.runs.solve` of ``tr`` from this builder's state."""
        tid = self._thread if self._thread is not None else self._tid
        pid = self._pid if self._pid is not None else self._spid
        c = runs.solve(tr, self._summary(), self.addr, seq0=seq0,
                       next_id=self._next_id, max_depth=self.max_depth,
                       pid=-1 if pid is None else pid,
                       tid=-1 if tid is None else tid,
                       tx=self._tx_depth is not None,
                       lookup=self._lookup is not None, paths=self.want_paths,
                       scanned=scanned, out=self._place, soft=self._soft,
                       **extra)
        if c is not None and c.k < len(tr.code) and \
                (tr.code[c.k] == runs.JUMP or tr.code[c.k] == runs.COND):
            # cut at a jump (or a conditional one: to the start of its own
            # function): from now on in this batch runs may go on past
            # those that change nothing (looking where is not free: only
            # once one was met)
            self._jumped = True
        return c

    def _took(self, c) -> None:
        """A committed run's rows, counts and stack."""
        self._next_id += c.opened
        self.calls += c.opened
        if not c.placed:
            self.pending.enters.add_array(c.enters)
            self.pending.exits.add_array(c.exits)
        if self.want_paths:
            self.paths.add_many(*c.paths)
        self._restack(c)

    def _solve_groups(self, a: "_Arrays", t0: int, t1: int) -> int | None:
        """:meth:`_solve` over transfers with groups of events among them
        (:meth:`.roundtrips.Groups.virtual`; no switch of threads is left
        to apply here), or None: it would name code not named before --
        the events cut the runs, and solves name what they meet in bulk,
        in address order: names are numbered in the order the runs as
        the events cut them meet them (none is named here)."""
        code, fall, tgt, land, src, tsc, named, first = a.groups.virtual(a)
        v0, v1 = int(first[t0]), int(first[t1])
        tr = runs.Transfers(code[v0:v1], fall[v0:v1], tgt[v0:v1], land[v0:v1],
                            src[v0:v1])
        nm = named[v0:v1]
        fresh = self.addr.fresh
        if _runs_impl.core_for(None) is None or self.addr.table() is None:
            # the twin (and a lookup callback) name jump targets as they match
            c = tr.code
            look = ((c == runs.CALL) | (c == runs.JUMP) | (c == runs.COND)) \
                & (tr.tgt != tr.fall) | (c == runs.FCALL)
            if fresh(tr.tgt[look & ~nm]).any():
                return None
            guard = None
        else:
            def guard(m):
                if len(m.unknown) and fresh(m.unknown).any():
                    return True
                o = m.o_tr[m.o_nid < 0]
                return bool(len(o)) and bool(fresh(tr.tgt[o[~nm[o]]]).any())
        seq0 = self._seq + 1
        c = self._run_solve(tr, seq0, int(first[min(max(a.scanned, t0), t1)]) - v0,
                            named=(nm, a.sys_nid), guard=guard)
        if c is None:
            return None
        a.scanned = max(a.scanned, t1)
        kv = v0 + c.k
        # a cut at a transfer of the batch: its group's anchors before it
        # go with the transfer, the slow way
        k = t1 if kv == v1 else int(np.searchsorted(first, kv, side="right")) - 1
        if kv != v1 and kv != first[k]:
            if named[first[k]]:
                raise AssertionError("a run cut inside a round trip")
            kv = int(first[k])
        if k == t0:
            return 0
        w = tsc[v0:kv]
        if w.any():
            self.time.anchors_every(seq0, 4, land[v0:kv], w)
        self._seq = seq0 + 4 * (kv - v0)
        self._took(c)
        self._replay_clock(a, t0, k)
        on, trip = a.groups.after(t0, k)
        if on is not None:
            self._tracing = on
        if trip:
            self._paused = False
        self.n = int(a.start[k])
        return k - t0

    def _place(self, ne: int, nx: int):
        """Where a compiled commit writes its rows: next in the pending
        ones (see :meth:`.rows._Parts.place`)."""
        return self.pending.enters.place(ne), self.pending.exits.place(nx)

    def _restack(self, c) -> None:
        """The stack after a committed run: the bottom ``keep`` frames,
        then the frames it opened that are still open."""
        del self._stack[c.keep:]
        names = self.names
        tx = self._tx_depth is not None
        thread, pid = self._thread, self._pid
        for row in c.top.tolist():
            (i, parent, func, nid, flags, _pid, _tid, begin_idx, eseq, path,
             ret, ret_ok) = row
            f = _Frame()
            f.id, f.parent, f.func, f.nid = i, parent, func, nid
            f.name = names[nid]
            f.ret = ret if ret_ok else None
            f.depth = len(self._stack)
            f.begin_idx, f.eseq, f.flags = begin_idx, eseq, Flag(flags)
            f.untraced, f.tx, f.ret_lo = False, tx, None
            f.tid, f.pid, f.path = thread, pid, path
            self._stack.append(f)
        self._sum = _joined(self._sum[:c.keep], c.top)
        self._sum_n = len(self._stack)



def _joined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """STACK rows ``a`` then ``b``.  np.concatenate checks and promotes a
    structured dtype's fields in Python on every call (~0.1 ms: a few
    percent of a view where system calls cut the runs -- it runs after
    every run); rows of one dtype, both contiguous, are joined as bytes."""
    if a.dtype != b.dtype or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return np.concatenate((a, b))
    return np.frombuffer(bytearray().join((a, b)), a.dtype)


def _matters(item) -> bool:
    """Items the builder must see in place (others only tell the time)."""
    t = getattr(item, "type", None)
    if t in ("error", "status"):
        return True
    if t == "space":
        return False            # an address-space switch: the records say it
    if hasattr(item, "status_update"):
        return structural(item)
    return True


class _Arrays:
    """A batch's records as the builder reads them (:func:`.blockcols.columns`
    with the transfer codes of :mod:`.runs`); instruction indices from
    ``base``."""

    __slots__ = ("ip", "end", "code", "fall", "tsc", "start", "scanned",
                 "groups", "sys_nid", "_fresh", "_fresh_from")

    def __init__(self, blocks: np.ndarray, base: int):
        self.ip, self.end, self.code, self.fall, self.tsc, self.start = \
            columns(blocks, base, runs.ICLASS_CODE)
        self.scanned = 0            # transfers [0, scanned) solve has seen
        self.groups = None          # events in the run (.roundtrips)
        self.sys_nid = -1
        self._fresh = None
        self._fresh_from = 0

    def fresh_at(self, fresh, t0: int = 0) -> np.ndarray:
        """The transfers (sorted) whose target, a call's or a taken
        unconditional jump's, was code not named yet when first asked
        (``fresh``: the names' :meth:`~.symtable.AddrTable.fresh`): where
        something may be named over a merged symbol table (as
        :meth:`.roundtrips.Groups.quiet` asks; a round trip's far call
        names no code) -- those from transfer ``t0`` on at least (asked
        in order: looked for from the first asked on)."""
        if self._fresh is None or t0 < self._fresh_from:
            n = len(self.code) - 1
            c = self.code[t0:n]
            tgt = self.ip[t0 + 1:]
            look = ((c == runs.CALL) | (c == runs.JUMP)) & (tgt != self.fall[t0:n]) \
                | (c == runs.FCALL)
            if self.groups is not None:
                tr = self.groups.trips()
                look[tr[tr >= t0] - t0] = False
            at = np.flatnonzero(look)
            self._fresh = at[fresh(tgt[at])] + t0
            self._fresh_from = t0
        return self._fresh

    def fresh_in(self, fresh, t: int, last: int) -> bool:
        """Whether some transfer in [t, last] targets code not named yet
        (:meth:`fresh_at`), asked again now: what the records since named
        is named for good (naming only ever adds), and those transfers are
        dropped -- a function first called there and called again a few
        records on cut every run up to its next call, its name known."""
        h = self.fresh_at(fresh, t)
        i = int(np.searchsorted(h, t))
        j = int(np.searchsorted(h, last, side="right"))
        if i == j:
            return False
        tgt = self.ip[h[i] + 1:h[i] + 2]
        if fresh(tgt)[0]:
            return True
        w = h[i:j]
        keep = fresh(self.ip[w + 1])
        self._fresh = np.concatenate((h[:i], w[keep], h[j:]))
        return bool(keep.any())
