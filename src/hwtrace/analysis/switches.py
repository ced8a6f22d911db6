"""Which thread runs on a CPU, from the recording's context switches (no I/O).

A CPU's stream interleaves threads: each time the kernel switches threads,
tracing stops for the one going out and starts again where the one coming
in goes on (a disable, then an enable elsewhere).  The sideband says when
(``Switch`` records, on the trace's TSC clock) but the decoded stream says
*where*, and its times are coarse: an event carries the time of the last
timing packet, which may be long before the enable it comes with.

:class:`SwitchTimeline` holds one CPU's switches in time order and a
cursor, and chooses, at an enable (:meth:`SwitchTimeline.choose`), which
switches came before it: those that certainly did (their time is no
later than the last known time), or the next ones, weighed by how well
each one's thread fits where tracing resumes -- the one rule of the
call-stack builder, the branch records and ``hwtrace diff``, which differ
only in how they know where a thread stopped (a ``fit`` callback; the
latter two share :meth:`SwitchTimeline.resumes`).  It also keeps an estimate of *now*: the last known
time plus the instructions since, at the rate (ticks per instruction) the
clock is known to run at (an emulated recording's instruction count: 1),
else measured between the last two timing values.  A timing value seen
while tracing is off (after a disable, before the enable: a CPU idle, an
untraced kernel with timing packets) tells time no traced instruction
took: it moves the last known time but says nothing about the rate --
counted in, it made the rate many times too high (an emulated CPU idle
for a while), the estimate ran ahead of the switches, and switches still
to come were applied at once.  When that clock counts exactly the traced
instructions and only TSC packets tell it (an emulated recording without
CR3 or address filtering, MTC or CYC: ``exact``), the estimate is the
time itself (give or take the few instructions between a PSB+ and the
record boundary it is reported at -- ahead, never behind): no switch after
it came before an enable, so the builders do not look past it for a
thread that "fits" the enable's IP -- two threads running the same loop
stop at the same addresses, and a later switch back to the other one was
taken over the one that was due.

With MTC or CYC packets on, that clock still counts exactly the traced
instructions (``counted``), but libipt's time is no longer the last TSC
plus the instructions since: an MTC's time is where the crystal clock
crossed its period, and the time an instruction carries includes every
timing packet the query decoder read ahead to the next TNT or TIP (and
those pending TNT bits cover earlier branches): it trails or leads the
instruction by up to about an MTC period.  A lead made the estimate run
ahead of an enable, and switches to come were applied there -- a new
thread resumes at the very IP its creator does (both return from
``clone``), so the one that fits was the wrong one, and a worker's
function went to the main thread.  Such a clock moves only by the
instructions traced, or jumps while tracing is off (an idle CPU), which a
TSC packet before the enable says exactly: so while tracing is on a time
value is ignored (the count is the time), and at an enable it counts only
if it is later than the count (a jump; an MTC's time trails there).  The
estimate is then the time itself: the switches up to it came before the
enable, those after it did not, however well their threads would fit.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

#: how many upcoming switches an enable may be matched with
LOOKAHEAD = 4


def counted_offsets(base: float, nf: np.ndarray, tscs: np.ndarray) -> tuple:
    """A counted clock over a run of enables, the rule of
    :meth:`SwitchTimeline.time` in bulk: the enables' instruction
    indices times the rate (``nf``), their time stamps (``tscs``; none:
    0 or less); ``base``: the clock's time less its count times the rate
    before them.  Returns ``(told, off)``: each stamp less its count
    times the rate (-inf: none), and the clock's offset once each is told
    (the running maximum): the clock reads ``off + nf`` at each enable."""
    told = np.where(tscs > 0, tscs - nf, -np.inf)
    return told, np.maximum.accumulate(np.maximum(told, base))


def _tid(t: int) -> int | None:
    """A thread id, or None for idle: -1 (the emulated engines) or 0 (perf:
    the swapper, which runs no user code)."""
    return None if t is None or t <= 0 else t


class SwitchTimeline:
    """``switches``: records with ``cpu``, ``time``, ``prev_tid`` and
    ``next_tid`` (``hwtrace.bundle.Switch``), any CPU's."""

    def __init__(self, switches: Iterable, cpu: int, rate: float | None = None,
                 exact: bool = False, counted: bool = False):
        switches = list(switches)
        mine = [s for s in switches if s.cpu == cpu]
        #: each thread's first switch in, on any CPU
        self._first_in: dict[int, int] = {}
        for s in switches:
            t = _tid(s.next_tid)
            if t is not None and (t not in self._first_in or s.time < self._first_in[t]):
                self._first_in[t] = s.time
        mine.sort(key=lambda s: s.time)          # stable: recorded order on ties
        self.switches = mine
        self.i = 0                                # next switch not yet applied
        self._t: int | None = None                # last known time
        self._n = 0                               # ... at instruction index
        self._rate: float | None = rate           # ticks per instruction
        self._fixed = rate is not None            # the clock's own: not measured
        #: the estimate is the time itself, or a little ahead (a clock
        #: counting exactly the traced instructions, read from TSC packets
        #: alone): a switch after it certainly comes after the enable,
        #: however well its thread would fit there
        self.exact = exact and self._fixed
        #: that clock counts exactly the traced instructions, though MTC or
        #: CYC times (which trail or lead it) are what the decoder reports:
        #: the time moves by the count, or jumps while tracing is off
        self.counted = counted and self._fixed and not self.exact
        #: tracing is on (no disable pending); a counted clock's stream
        #: starts off: an idle CPU's first TSC comes before the enable
        self._on = not self.counted

    def __bool__(self) -> bool:
        return bool(self.switches)

    # -- time ----------------------------------------------------------------

    def time(self, n: int, tsc: int | None) -> None:
        """An event at instruction index ``n`` carries ``tsc``."""
        if tsc is None or tsc == self._t:
            return
        if self.counted and self._t is not None:
            if self._on or tsc <= self._t + (n - self._n) * self._rate:
                return          # the count knows better (see the module)
        if self._t is not None and n > self._n and tsc > self._t and self._on \
                and not self._fixed:
            self._rate = (tsc - self._t) / (n - self._n)
        self._t, self._n = tsc, n

    def round_trips(self, ns, tscs) -> None:
        """Round trips told in bulk, in order, tracing on before and after
        each (what :meth:`time` and :meth:`tracing` make of a disable,
        then an enable at instruction index ``ns[i]`` carrying ``tscs[i]``
        -- 0: no time): a counted clock's, the only one they are told in
        bulk to (the disable's time changes nothing, tracing on; the
        enable's moves the time on if later than the count)."""
        if not self.counted or self._t is None or not self._on:
            raise ValueError("round trips are told in bulk only to a counted clock, "
                             "tracing on, a time known")
        t, n0, rate = self._t, self._n, self._rate
        if len(ns) > 32:
            # only a time above the count so far can move it: those
            # within a tick of the running maximum (as numpy's floats
            # have it) are told one at a time, as below
            ns = np.asarray(ns, np.int64)
            tscs = np.asarray(tscs, np.int64)
            base = t - n0 * rate
            told, off = counted_offsets(base, ns * float(rate), tscs)
            prev = np.concatenate(([base], off[:-1]))
            cand = np.flatnonzero(told > prev - 2.0)
            ns, tscs = ns[cand].tolist(), tscs[cand].tolist()
        for n, tsc in zip(ns, tscs):
            if tsc and tsc != t and tsc > t + (n - n0) * rate:
                t, n0 = tsc, n
        self._t, self._n = t, n0

    def trips_before_switch(self, ns: np.ndarray, tscs: np.ndarray) -> int:
        """How many of the round trips :meth:`round_trips` would be told
        (in order) come before the first whose enable may apply a switch:
        :meth:`choose` on a counted clock applies those up to the estimate
        (the count since the last known time, moved on by each enable's
        later TSC) -- with a tick's margin, so that an estimate at a
        switch's time, by rounding either side, counts as due."""
        if self.i >= len(self.switches) or not len(ns):
            return len(ns)
        if not self.counted or self._t is None or not self._on:
            return 0
        rate = float(self._rate)
        nf = ns.astype(np.float64) * rate
        _told, off = counted_offsets(self._t - self._n * rate, nf, tscs)
        due = np.flatnonzero(off + nf >= self.switches[self.i].time - 1)
        return int(due[0]) if len(due) else len(ns)

    def tracing(self, on: bool) -> None:
        """Tracing went off (a disable) or on again (an enable)."""
        self._on = on

    def clock_state(self) -> tuple:
        """What :meth:`time`, :meth:`tracing` and :meth:`resumes` need of
        the clock, for a compiled twin of them (the branch records'
        round trips, ``hwtrace/branches/core/trips.c``): (last known time,
        its instruction index, rate, tracing on, counted, fixed, the time
        of the next switch not applied or None)."""
        sw = self.switches
        return (self._t, self._n, self._rate, self._on, self.counted, self._fixed,
                sw[self.i].time if self.i < len(sw) else None)

    def set_clock_state(self, t, n, rate, on) -> None:
        """The clock as the compiled twin left it (:meth:`clock_state`)."""
        self._t, self._n, self._rate, self._on = t, n, rate, on

    @property
    def deaf(self) -> bool:
        """Whether a time told now changes nothing (:meth:`time`): a
        counted clock's, while tracing is on, once a time is known -- so
        until the next enable or disable, where the records' times are
        told (each one's, or a run's last) cannot matter to the switches."""
        return self.counted and self._on and self._t is not None

    @property
    def known(self) -> int | None:
        """The last known time (no later than now)."""
        return self._t

    def estimate(self, n: int) -> float | None:
        """Now (instruction index ``n``), extrapolated; None without a rate."""
        if self._t is None or self._rate is None:
            return None
        return self._t + (n - self._n) * self._rate

    # -- switches ------------------------------------------------------------

    def due(self, t: float | None) -> int:
        """Index after the last pending switch at or before time ``t``."""
        k = self.i
        sw = self.switches
        if t is None:
            return k
        while k < len(sw) and sw[k].time <= t:
            k += 1
        return k

    def upcoming(self, start: int) -> range:
        return range(start, min(start + LOOKAHEAD, len(self.switches)))

    def thread_after(self, k: int, current: int | None) -> int | None:
        """The thread running once the switches before index ``k`` are
        applied (``current`` if none)."""
        if k <= self.i:
            return current
        return _tid(self.switches[k - 1].next_tid)

    def pid_after(self, k: int, current: int | None) -> int | None:
        """The process of :meth:`thread_after`."""
        if k <= self.i:
            return current
        return _tid(getattr(self.switches[k - 1], "next_pid", None))

    def leaves(self, tid: int | None, k: int) -> bool:
        """Is ``tid`` switched out by a pending switch before index ``k``?"""
        return tid is not None and any(s.prev_tid == tid
                                       for s in self.switches[self.i:k])

    def ran_before(self, k: int) -> bool:
        """Did the thread the switch before index ``k`` brings in run
        before it (switched in earlier, on any CPU)?  Then what it resumes
        began elsewhere -- even where this CPU's stream begins."""
        if k <= 0 or k > len(self.switches):
            return False
        s = self.switches[k - 1]
        t = _tid(s.next_tid)
        return t is not None and self._first_in.get(t, s.time) < s.time

    def advance(self, k: int) -> None:
        self.i = max(self.i, k)

    # -- the choice at an enable ---------------------------------------------

    def choose(self, n: int, fit: Callable[[int], int]) -> int:
        """Tracing resumes at instruction index ``n``: the index after the
        last switch that came before, for the caller to apply (the running
        thread goes on where it is :attr:`i`).  ``fit(k)`` says how well
        the thread running once the switches before index ``k`` are
        applied fits resuming where tracing does: 2 it stopped right
        there, 1 nothing known against it (seen for the first time, back
        from another CPU, or idle: someone is still to come), 0 it is the
        running thread, never switched out, and it stopped elsewhere.

        The switches certainly before (by the last known time), or before
        by the estimate of now if that thread fits no worse; unless that
        thread stopped right there, the next few (:data:`LOOKAHEAD`) for
        the first whose thread did -- with an exact clock none after the
        estimate, and none to idle (idle resumes nothing) -- or, if the
        running thread stopped elsewhere, the first with a fresh thread
        (by the estimate before now, or the first one looked at)."""
        est = self.estimate(n)
        if self.counted and est is not None:
            return self.due(est)                # the count is the time
        best = self.due(self.known)             # certainly before this enable
        f = fit(best)
        if est is not None:
            k = self.due(est)                   # before it by the estimate
            if k > best:
                fk = fit(k)
                if fk >= f:
                    best, f = k, fk
        if f < 2:
            exact = fresh = None
            sw = self.switches
            for j in self.upcoming(best):
                if self.exact and est is not None and sw[j].time > est:
                    break               # certainly after this enable
                if self.thread_after(j + 1, None) is None:
                    continue            # to idle: not who resumes here
                fj = fit(j + 1)
                if fj == 2:
                    exact = j + 1
                    break
                if fj == 1 and fresh is None and \
                        (est is None or sw[j].time <= est or j == best):
                    fresh = j + 1
            if exact is not None:
                best = exact
            elif f == 0 and fresh is not None:
                best = fresh
        return best

    def resumes(self, n: int, running: bool, pid: int | None, tid: int | None,
                stopped: Callable[[int | None, int | None], bool]
                ) -> tuple[int | None, int | None]:
        """Tracing resumes at instruction index ``n``: (pid, tid) of the
        thread that runs now (``None`` tid: idle), the switches before it
        applied.  ``running``: a thread is known to run (``pid``/``tid``;
        none at the stream's start); ``stopped(pid, tid)``: that thread
        left off right where tracing resumes (an interrupted or
        system-calling thread goes on where it stopped) -- the :meth:`choose`
        fit of the branch records and ``hwtrace diff``, which know where a
        thread stopped but not its stack."""
        if running and self.i >= len(self.switches):
            # no switch left to apply: the running thread goes on (what
            # choose, thread_after and pid_after give)
            return pid, tid

        def fit(k: int) -> int:
            t = self.thread_after(k, tid)
            if t is None:
                return 1
            if t == tid:
                if not running:
                    return 1
                if stopped(pid, tid):
                    return 2
                return 1 if self.leaves(tid, k) else 0
            return 2 if stopped(self.pid_after(k, pid), t) else 1

        best = self.choose(n, fit)
        got = self.pid_after(best, pid), self.thread_after(best, tid)
        self.advance(best)
        return got
