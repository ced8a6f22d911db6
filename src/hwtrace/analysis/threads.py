"""A CPU's stream follows its threads (part of the call-stack builder).

In a CPU's stream every context switch is a disable and an enable: the
sideband's switches (:class:`~.switches.SwitchTimeline`) say which
thread comes in; the decoded stream says where it resumes.  At each
enable the switches that certainly came before it (by time), or the next
ones whose thread is expected right there (its stack stopped with a
return address equal to the enable's IP), or a thread seen for the first
time (when the running one is not expected there) say who runs now.  The
thread going out has its open frames closed ``SWITCHED_OUT`` and kept;
when it comes back where it stopped they are opened again as
``SWITCHED_IN`` slices of the same activations, and its stack goes on as
if never interrupted.  A thread that comes back elsewhere ran on another
CPU meanwhile: it starts afresh (``BEGIN_UNKNOWN``), as does a thread
seen for the first time.
"""

from __future__ import annotations

from hwtrace.analysis.records import Flag


class FollowThreads:
    """Mixin of :class:`~.callstack.CallStackBuilder` (its state:
    ``_follow``, ``_thread``, ``_pid``, ``_parked``, ``_fresh``)."""

    @staticmethod
    def _expects(stack: list, ip: int) -> bool:
        """Did this stack stop where execution resumes at ``ip`` (an
        untraced frame on top returning there, or one further down: a
        sigreturn)?"""
        if not stack or not stack[-1].untraced:
            return False
        top = stack[-1]
        if top.ret == ip or (top.ret_lo is not None and 0 < ip - top.ret_lo <= 15):
            return True
        return any(f.untraced and f.ret == ip for f in stack[:-1])

    def _fit(self, k: int, ip: int) -> int:
        """How well the thread running once the switches before index ``k``
        are applied fits resuming at ``ip``: 2 its stack stopped right
        there, 1 nothing known against it (a thread seen for the first
        time, one whose stack here is stale because it left this CPU
        meanwhile, or idle: someone is still to come), 0 it is the running
        thread, never switched out, and it stopped elsewhere."""
        tl = self._follow
        cur = self._thread
        tid = tl.thread_after(k, cur)
        if tid is None:
            return 1
        if tid == cur:
            if not self._in_seg or not self._stack:
                return 1
            if self._expects(self._stack, ip):
                return 2
            return 1 if tl.leaves(cur, k) else 0
        parked = self._parked.get(tid)
        return 2 if parked is not None and self._expects(parked[0], ip) else 1

    def _follow_switches(self, ip: int) -> None:
        """Tracing is enabled at ``ip``: which thread is it?"""
        tl = self._follow
        best = tl.choose(self.n, lambda k: self._fit(k, ip))
        if best > tl.i:
            cur = self._thread
            tid = tl.thread_after(best, cur)
            pid = tl.pid_after(best, self._pid)
            self._switch_to(tid, pid, ip, tl.leaves(cur, best), tl.ran_before(best))
            tl.advance(best)

    def _switch_to(self, tid: int | None, pid: int | None, ip: int,
                   left: bool = True, ran: bool = False) -> None:
        """Thread ``tid`` comes in (resuming at ``ip``): the running one's
        frames end ``SWITCHED_OUT`` and are kept; the new one's kept frames
        (if it stopped right at ``ip``) go on as ``SWITCHED_IN`` slices.
        The running thread coming back (``left``: it was switched out
        meanwhile) goes on with its stack if it stopped right there, else
        afresh (it ran on another CPU)."""
        if tid == self._thread and (not left or tid is None
                                    or self._expects(self._stack, ip)):
            return
        stack = self._stack
        if stack:
            frames = list(stack)
            while stack:
                self._pop(Flag.SWITCHED_OUT)
            if self._thread is not None:
                self._parked[self._thread] = (frames, self._in_seg, self._paused,
                                              self._tx_depth)
        else:
            self._parked.pop(self._thread, None)
        self._thread = tid
        self._pid = pid
        self._pend = 0
        self._after_abort = False
        st = self._parked.pop(tid, None) if tid is not None else None
        if pid in self._execd:             # (CallStackBuilder._exec_check)
            self._execd.discard(pid)
            self._exec_entry = pid
            st = None
        if st is None or not self._expects(st[0], ip):
            # first seen, or back from another CPU: its stack starts afresh,
            # in what it was doing before (nothing begins here) -- unless
            # this is where the stream itself begins and the thread had
            # not run before (``ran``: it migrated here, maybe switched out
            # right after a call on the other CPU, whose stream counted it)
            self._fresh = self.n > 0 or ran
            self._in_seg = False
            self._paused = False
            self._tx_depth = None
            return
        frames, self._in_seg, self._paused, self._tx_depth = st
        for t in frames:
            f = self._push(t.func, t.ret, t.flags | Flag.SWITCHED_IN,
                           name=t.name, untraced=t.untraced, count=False)
            f.tx = t.tx
            f.ret_lo = t.ret_lo
