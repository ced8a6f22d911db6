"""A recording's CPU streams fed in time order, sharing their threads.

In cpu mode a thread that moves to another CPU goes on in that CPU's
stream.  Fed one stream after the other, each CPU's call-stack builder
began such a thread afresh (``[began before the trace]``, depth 0) and,
when it came back where it had stopped before, went on with the stale
stack it had parked.  Here the builders of the streams share one
:class:`~hwtrace.analysis.threads.ThreadRegistry` -- a thread's stack is
on the builder running it or parked there -- and every stream's batches
are fed piece by piece in the order of the times they begin at, each
cut where tracing is enabled (:mod:`hwtrace.flow.batchcut`: a thread
comes in only there) if another stream has something to feed before
it goes on there, so when a builder switches a thread in, every
stream has been fed up to that time: the CPU the thread left has
stopped it (its frames end ``SWITCHED_OUT`` there) and this one goes on
with its stack (``SWITCHED_IN``).

The writers still get one stream after the other, as they expect: the
first stream's chunks at once (``calls | head`` prints at once), the
others' held (``hold()``: in memory, or spooled to a file by the
caller -- no I/O here) until their turn: when every stream before them
has ended (a stream's builder finishes when its stream ends; a thread it
leaves running goes on elsewhere, parked).  A chunk's builder is its
context: its name and path tables are only appended to, so what a chunk
refers to is there when it is delivered later.

Writers that arrange their output by thread (``calls``: each has a
``threads_followed()`` method, called first) get every stream's chunks at
once instead, as they come, every builder's after each piece (the one
fed last after the others: a thread another builder gave up to it has its
rows there first), from builders that share one order of activation ids
and sequence numbers and say which slice goes on which (a ``linked``
:class:`~hwtrace.analysis.threads.ThreadRegistry`); and
``threads_gone(tids)`` once threads ran for the last time (the last
context switch of the recording that names them switched them out, and
their CPU's builder is past it, its rows delivered; or the last one
switched them in and their exit is recorded: once their CPU's stream
goes on past its time, their frames there end as at a switch out).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable, NamedTuple

import numpy as np

from hwtrace.analysis.switches import counted_offsets
from hwtrace.analysis.threads import ThreadRegistry
from hwtrace.flow import plain
from hwtrace.flow.batchcut import Places, start_time


class Source(NamedTuple):
    """One CPU's stream: its info, its batches, the recorder's entry."""

    info: object
    batches: Iterable
    entry: object = None
    tsc_hz: float | None = None


def applies(infos: list, clock: str) -> bool:
    """Whether streams of these :class:`StreamInfo` s are taken in time
    order: two or more CPUs' streams, each following its threads by the
    recording's context switches, on a TSC clock."""
    if len(infos) < 2 or clock == "insns":
        return False
    return all(i.tid is None and i.cpu is not None and i.switches
               for i in infos)


def alone(infos: list) -> bool:
    """Whether these are one CPU's stream following its threads by the
    recording's context switches: a view arranged by thread takes it as
    the streams in time order (one)."""
    return len(infos) == 1 and infos[0].tid is None and \
        infos[0].cpu is not None and bool(infos[0].switches)


def _last_runs(builders: list, exits=()) -> tuple:
    """Per builder, the (index in its CPU's switches, tid) of the threads
    whose last run ends there: their last switch of all is one out of
    them on that CPU (a thread still running when the trace ends has
    none); and per builder, the (time, tid) of the threads whose last
    switch of all is one into them on that CPU and whose exit (``exits``:
    (tid, time) pairs) is recorded at or after it -- their last run ends
    at their exit, with no switch out of them (the emulated engine's last
    thread on a CPU: nothing else ran there)."""
    last: dict = {}
    for k, b in enumerate(builders):
        tl = b._follow
        for j, sw in enumerate(tl.switches if tl is not None else ()):
            # (at one time, in after out: a thread moving to another CPU)
            for t, when in ((sw.prev_tid, (sw.time, 0)), (sw.next_tid, (sw.time, 1))):
                if t is not None and t >= 0 and (t not in last or when >= last[t][0]):
                    last[t] = (when, k, j)
    runs: list = [[] for _ in builders]
    ends: list = [[] for _ in builders]
    ended = dict(exits)
    for t, ((time, into), k, j) in last.items():
        if not into:
            runs[k].append((j, t))
        elif ended.get(t, -1) >= time:
            ends[k].append((ended[t], t))
    for r in runs + ends:
        r.sort(reverse=True)            # (taken from the end)
    return runs, ends


def _past_last_runs(runs: list, builder, closed: bool) -> list:
    """The threads of ``runs`` (a builder's, from :func:`_last_runs`;
    taken from the end) whose last run is behind: ``builder`` is past the
    switch out of them (or its stream ended) and holds none of their rows
    (rows wait in a builder for its CPU's next time stamp to time them;
    told gone before they are delivered, a writer would open a second
    section for the thread with them)."""
    tids = []
    while runs and (closed or builder._follow.i > runs[-1][0]):
        if not closed and builder.pending.holds(runs[-1][1]):
            break
        tids.append(runs.pop()[1])
    return tids


class _Held:
    """Chunks held in memory (the default ``hold``)."""

    def __init__(self):
        self._chunks: list = []

    def add(self, chunk) -> None:
        self._chunks.append(chunk)

    def __iter__(self):
        return iter(self._chunks)

    def close(self) -> None:
        self._chunks = []


class _Feed:
    """One stream's batches, taken a piece at a time: as far as the time
    ``limit`` (the next piece of another stream), cut at the first enable
    at or after it -- a whole batch where no other stream has anything to
    feed meanwhile (no cut at all: the builder is fed as one stream alone
    would be)."""

    def __init__(self, k: int, batches: Iterable, coverage=None, clock=None):
        self.k = k
        self.it = iter(batches)
        self.coverage = coverage    # this stream's own collector (a twin)
        #: () -> (time, instruction index, rate) of the stream's builder's
        #: counted clock, or None (the enables' own times are its times)
        self.clock = clock
        self.batch = None
        self.start = None           # the batch's records' first instructions
        self.places = None          # its batchcut.Places, once cut
        self.cols = None            # the batch's enables as columns (_enable_cols)
        self.ei = 0                 # the first of them not behind the cursor
        self.r0 = self.j0 = 0       # the cursor: a record, an item position
        self.first = 0              # the stream's instructions before it
        self.last = 0               # the time the last piece began at
        self.next = None            # ... the next one begins at (None: none)
        self.done = 0               # trace bytes told to progress

    def key(self, run) -> tuple | None:
        """The sort key of the next piece (None: the stream ended)."""
        while self.batch is None:
            batch = next(self.it, None)
            if batch is None:
                return None
            run.totals["events"] += plain.count(batch)
            if self.coverage is not None:
                self.coverage.add_batch(batch)
            if run.progress is not None and len(batch.blocks):
                at = int(batch.blocks["offset"][-1])
                if at > self.done:
                    run.progress(at - self.done)
                    self.done = at
            # (its enables are looked for once it has to be cut)
            self.batch, self.cols, self.ei, self.places = batch, None, 0, None
            self.r0 = self.j0 = 0
            self.first = batch.first_insn
            self.start = None
            if not len(batch.blocks) and not plain.count(batch):
                self.batch = None
        batch = self.batch
        if self.r0 == 0 and self.j0 == 0:
            t = _enabled_at_start(batch)
            at_enable = t is not None
        else:                   # cut at an enable (self.cols is known)
            t = int(self.cols[2][self.ei])
            t = None if t < 0 else t
            at_enable = True
        if at_enable:
            # (the builder goes on from its clock: no later enable between)
            c = self.clock() if self.clock is not None else None
            if c is not None:
                ct, cn, rate = c
                t = max(t if t is not None else 0,
                        int(ct + (self.first - cn) * rate))
        if t is None:
            t = start_time(batch, self.r0)
        if t is None or t < self.last:
            t = self.last
        self.last = t
        # at one time: a stream going on before one where a thread comes in
        return (t, at_enable, self.k)

    def take(self, limit: int | None):
        """The next piece: up to the first enable (after the cursor) at or
        after ``limit``, else the batch's rest."""
        batch = self.batch
        r0, j0 = self.r0, self.j0
        e = n = 0
        places = self.places
        if limit is not None:
            # cut: by the places of the items and plain rows in one order
            if places is None:
                places = self.places = Places(batch)
            if self.cols is None:
                self.cols = _enable_cols(places)
            c = self.clock() if self.clock is not None else None
            if c is not None:
                if self.start is None:
                    st = np.zeros(len(batch.blocks) + 1, np.int64)
                    np.cumsum(batch.blocks["ninsn"], out=st[1:])
                    self.start = st + self.first - int(st[r0])
                c = (c, self.start)
            e, n = _next_enable(self.cols, self.ei, r0, j0, limit, c), len(self.cols[0])
        if places is None:
            # never cut: the batch whole (the cursor is at its start)
            self.batch = None
            return batch
        if e < n:
            j1 = int(self.cols[0][e])
            r1 = places.record(j1)
        else:
            j1, r1 = places.n, len(batch.blocks)
        p = places.piece(self.first, r0, j0, r1, j1)
        if e >= n:
            self.batch = None
        else:
            self.first += int(batch.blocks["ninsn"][r0:r1].sum(dtype="u8"))
            self.r0, self.j0, self.ei = r1, j1, e
        return p


def _enable_cols(places: Places) -> tuple:
    """A batch's enables as columns: (place, record, TSC; -1: none)."""
    j, t = places.enable_columns()
    return j, places.records(j), t


def _next_enable(cols: tuple, e: int, r0: int, j0: int, limit: int,
                 clock=None) -> int:
    """The first enable from ``e`` on past the cursor (record r0, place
    j0) whose time is known and at or after ``limit``; their count if
    none -- looked for a window at a time (a piece is most often cut a
    few enables on).

    ``clock``: ((time, instruction index, rate), the instruction index
    of each record of the batch) of a counted clock, the builder's as
    fed up to the cursor: an enable's time is then the one its builder
    will take it at -- the count since the last time known, moved on by
    each enable's later time stamp (as :meth:`~hwtrace.analysis.switches.
    SwitchTimeline.time` does) -- not its time stamp alone, which may be
    long stale (no timing packet since): cut there, a thread another
    CPU's stream switches in at that time has left this one first."""
    j, r, t = cols
    n = len(j)
    w = 64
    if clock is not None:
        (ct, cn, rate), start = clock
        carry = ct - cn * rate
    while e < n:
        hi = min(n, e + w)
        jw, rw = j[e:hi], r[e:hi]
        tw = t[e:hi]
        if clock is not None:
            # (a stamp of 0 moves no clock: only "none" here is -1)
            nf = start[rw].astype(np.float64) * rate
            _told, off = counted_offsets(carry, nf, tw)
            carry = float(off[-1])
            tw = off + nf
        hit = ((rw > r0) | ((rw == r0) & (jw > j0))) & (tw >= limit) & (tw >= 0)
        k = int(np.argmax(hit))
        if hit[k]:
            return e + k
        e, w = hi, min(w * 4, 1 << 16)
    return n


def _enabled_at_start(batch) -> int | None:
    """The TSC of an enable before the batch's first record, or None."""
    items = batch.items
    rows = batch.plain
    if rows is not None and len(rows):
        # the items and rows before the first record
        k = 0
        while k < len(items) and items[k][0] == 0:
            k += 1
        items = plain.merged(items[:k], rows[:int(np.searchsorted(rows["index"], 1))])
    for i, _o, it in items:
        if i:
            break
        if getattr(it, "type", None) == "enabled" and \
                not getattr(it, "status_update", False) and \
                getattr(it, "has_tsc", False):
            return int(it.tsc)
    return None


def run_interleaved(run, sources: list[Source],
                    hold: Callable[[], object] = _Held,
                    at: Callable[[int], None] | None = None) -> list:
    """Feed ``sources`` (see :func:`applies`) through ``run`` (a
    :class:`~.pipeline.ViewRun`) in time order; returns the builders.
    ``at(k)`` is told which stream is being fed (for error messages).
    The writers get the first stream not yet ended at once, the others
    from ``hold()`` when every stream before them has ended."""
    by_thread = bool(run.writers) and all(hasattr(w, "threads_followed")
                                          for w in run.writers)
    if by_thread:
        for w in run.writers:
            w.threads_followed()
    reg = ThreadRegistry(linked=by_thread)
    n = len(sources)
    builders, states, held = [], [], []
    for k, src in enumerate(sources):
        b = run._builder(src.info, src.tsc_hz, threads=reg)
        builders.append(b)
        states.append(run._state(b))
        held.append(None if k == 0 or by_thread else hold())
        run._wrapped(b, src.entry)
    closed = [False] * n
    live = 0                        # the stream the writers are on
    runs, ends = _last_runs(builders, getattr(sources[0].info, "exits", ())) \
        if by_thread else (None, None)
    feeds: list = []

    def gone() -> None:
        """(by thread) Threads whose last run is behind: the writers
        told, once their rows are delivered."""
        tids = []
        for k, b in enumerate(builders):
            tids += _past_last_runs(runs[k], b, closed[k])
            r = ends[k]
            while r and (closed[k] or (feeds[k].next is not None
                                       and feeds[k].next > r[-1][0])):
                t = r[-1][1]
                if not closed[k] and b._thread == t and b._tracing is False:
                    # it exited (tracing off, this CPU's stream past the
                    # time): its frames end here, as at a switch out
                    reg.lend(b)
                    b._give_up()
                    reg.settle(b)
                    deliver(k)
                elif not closed[k] and b.pending.holds(t):
                    break       # (as in _past_last_runs)
                r.pop()
                tids.append(t)
        if tids:
            for w in run.writers:
                w.threads_gone(tids)

    def emit(k: int, chunks) -> None:
        run._emit(builders[k], states[k], chunks)

    def deliver(k: int) -> None:
        chunks = run._taken(builders[k], states[k])
        if k == live or by_thread:
            emit(k, chunks)
        else:
            for ch in chunks:
                held[k].add(ch)

    def close(k: int) -> None:
        """Stream k ended: what is left of it, and the next stream's turn
        once every one before it has ended."""
        nonlocal live
        if at is not None:
            at(k)
        b = builders[k]
        reg.lend(b)
        run._ended(b, sources[k].entry)
        b.finish()
        reg.settle(b)
        if feeds[k].coverage is not None:
            feeds[k].coverage.gap()
        deliver(k)
        closed[k] = True
        if by_thread:
            gone()
        while not by_thread and live < n and closed[live]:
            live += 1
            if live < n:
                emit(live, held[live])
                held[live].close()

    # coverage: a collector per stream (its blocks go on from batch to
    # batch of its own stream only), added up at the end
    cov = run.coverage
    def clock(k: int):
        tl = getattr(builders[k], "_follow", None)
        if tl is None or not tl.counted:
            return None
        t, n, rate = tl.clock_state()[:3]
        return None if t is None or not rate else (t, n, rate)
    feeds += [_Feed(k, src.batches, cov.twin() if cov is not None else None,
                    lambda k=k: clock(k))
              for k, src in enumerate(sources)]
    heap: list = []

    def push(f: _Feed) -> None:
        if at is not None:
            at(f.k)
        key = f.key(run)
        if key is None:
            f.next = None
            close(f.k)
        else:
            f.next = key[0]
            heapq.heappush(heap, (key, f.k))

    for f in feeds:
        push(f)
    while heap:
        _key, k = heapq.heappop(heap)
        if at is not None:
            at(k)
        limit = heap[0][0][0] if heap else None
        reg.lend(builders[k])
        builders[k].feed_batch(feeds[k].take(limit))
        reg.settle(builders[k])
        if by_thread:
            for j in range(n):
                if j != k and not closed[j]:
                    reg.lend(builders[j])       # (a seal may count on)
                    deliver(j)
                    reg.settle(builders[j])
        deliver(k)
        win = states[k].get("window")
        if win is not None and win.past():
            close(k)            # past the window: nothing more to see
            continue
        push(feeds[k])
        if by_thread:
            gone()          # (after the push: where this stream goes on)
    for k, b in enumerate(builders):
        run._add_totals(b, sources[k].entry)
        if cov is not None:
            cov.absorb(feeds[k].coverage)
    return builders
