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
seen for the first time -- unless the builders of a recording's CPU
streams share one :class:`ThreadRegistry` and are fed in time order
(:mod:`hwtrace.export.interleave`): then a thread's stack lives in one
place, running on one builder or parked in the registry, and follows the
thread from CPU to CPU.  A builder switching in a thread that another
one still runs (its segment there ended with a disable, no one switched
in after it) takes it over: the other's frames end ``SWITCHED_OUT`` in
the other's output and go on ``SWITCHED_IN`` here, where its stack
stopped.

A registry made ``linked`` (for a view that prints each thread's
activations whole, ``calls``) also hands its builders one counter of
activation ids and one of sequence numbers (:meth:`ThreadRegistry.lend`
before a builder is fed, :meth:`ThreadRegistry.settle` after), so a
thread's rows from every CPU's builder are in one order, and says which
slice goes on which: ``links`` (a ``SWITCHED_IN`` slice's id -> the id of
the slice it goes on from) and ``ends`` (ids of ``SWITCHED_OUT`` slices
that no slice will go on from: the thread came back elsewhere than its
stack stopped, or the CPU that parked it lost data).
"""

from __future__ import annotations

from hwtrace.analysis.records import Flag


class ThreadRegistry:
    """The threads of one recording's CPU streams, shared by their
    builders: each parked thread's stack (frames, in_seg, paused,
    tx_depth) and the builder that parked it, the builder running each
    thread, and the per-process state of exec handling (the address
    space each process ran last, the processes that exec'd whose thread
    has not come back yet).  A builder on its own has one of its own."""

    def __init__(self, linked: bool = False):
        self.parked: dict[int, tuple] = {}
        self.owner: dict[int, object] = {}      # tid -> the builder that parked it
        self.running: dict[int, object] = {}    # tid -> the builder running it
        self.space_of: dict = {}                # pid -> the address space it ran last
        self.execd: set = set()                 # pids that exec'd, their thread not back yet
        #: (linked) a SWITCHED_IN slice's id -> the id it goes on from
        self.links: dict | None = {} if linked else None
        #: (linked) ids of SWITCHED_OUT slices nothing goes on from
        self.ends: list = []
        self.next_id = 0                        # (linked) the shared counters
        self.seq = 0

    def lend(self, builder) -> None:
        """(linked) ``builder`` is fed next: it goes on from the shared
        counters of activation ids and sequence numbers."""
        if self.links is not None:
            builder._next_id = max(builder._next_id, self.next_id)
            builder._seq = max(builder._seq, self.seq)

    def settle(self, builder) -> None:
        """(linked) ``builder`` was fed: the shared counters go on from its."""
        if self.links is not None:
            self.next_id = max(self.next_id, builder._next_id)
            self.seq = max(self.seq, builder._seq)

    def _dropped(self, state: tuple | None) -> None:
        if state is not None and self.links is not None:
            self.ends.extend(f.id for f in state[0])

    def park(self, tid: int, state: tuple, builder) -> None:
        self.parked[tid] = state
        self.owner[tid] = builder

    def take(self, tid: int) -> tuple | None:
        self.owner.pop(tid, None)
        return self.parked.pop(tid, None)

    def forget(self, builder) -> None:
        """Data was lost on ``builder``'s CPU: the stacks it parked are no
        longer known (those threads may have run in what was lost)."""
        for tid in [t for t, b in self.owner.items() if b is builder]:
            del self.owner[tid]
            self._dropped(self.parked.pop(tid, None))


class FollowThreads:
    """Mixin of :class:`~.callstack.CallStackBuilder` (its state:
    ``_follow``, ``_thread``, ``_pid``, ``_threads`` (a
    :class:`ThreadRegistry`) and its ``_parked``, ``_fresh``)."""

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
        stack = self._stack_of(tid)
        return 2 if stack is not None and self._expects(stack, ip) else 1

    def _stack_of(self, tid: int) -> list | None:
        """Where thread ``tid``'s stack stopped: parked, or on the builder
        of another CPU that still runs it, stopped (:meth:`_holder`)."""
        parked = self._parked.get(tid)
        if parked is not None:
            return parked[0]
        other = self._holder(tid)
        return other._stack if other is not None else None

    def _holder(self, tid: int):
        """The builder of another CPU whose stream left thread ``tid``
        running when tracing stopped there (a disable), or None."""
        other = self._threads.running.get(tid)
        if other is None or other is self or other._thread != tid \
                or other._tracing is not False:
            return None
        return other

    def _park_running(self) -> None:
        """The running thread goes out: its frames end ``SWITCHED_OUT``
        and are kept (with what else its stack needs) in the registry."""
        reg = self._threads
        stack = self._stack
        tid = self._thread
        if reg.running.get(tid) is self:
            del reg.running[tid]
        if stack:
            frames = list(stack)
            while stack:
                self._pop(Flag.SWITCHED_OUT)
            if tid is not None:
                reg.park(tid, (frames, self._in_seg, self._paused,
                               self._tx_depth), self)
        elif tid is not None:
            reg.take(tid)

    def _give_up(self) -> None:
        """Another CPU's builder switches in the thread this one runs
        (stopped): it leaves here, parked for that one to take -- its
        slices here ending at this stream's last time (this CPU's next
        time may be much later: when it runs again)."""
        self._seal()
        self._park_running()
        if self._threads.links is not None:
            # (linked: the slices' ends timed now, not at this CPU's next
            # anchor -- the thread's lines wait for them)
            self._seal()
        self._thread = None
        self._pid = None
        self._pend = 0
        self._in_seg = False
        self._paused = False
        self._tx_depth = None

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
        self._park_running()
        self._thread = tid
        self._pid = pid
        self._pend = 0
        self._after_abort = False
        st = None
        if tid is not None:
            other = self._holder(tid)
            if other is not None:        # it left that CPU for this one
                linked = self._threads.links is not None
                if linked:          # (the shared counter: one order of rows)
                    other._seq = max(other._seq, self._seq)
                other._give_up()
                if linked:
                    self._seq = max(self._seq, other._seq)
            st = self._threads.take(tid)
            self._threads.running[tid] = self
        if pid in self._execd:             # (CallStackBuilder._exec_check)
            self._execd.discard(pid)
            self._exec_entry = pid
            self._threads._dropped(st)
            st = None
        if st is None or not self._expects(st[0], ip):
            self._threads._dropped(st)
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
        links = self._threads.links
        for t in frames:
            f = self._push(t.func, t.ret, t.flags | Flag.SWITCHED_IN,
                           name=t.name, untraced=t.untraced, count=False)
            f.tx = t.tx
            f.ret_lo = t.ret_lo
            if links is not None:
                links[f.id] = t.id
