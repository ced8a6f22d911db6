"""Call-stack reconstruction from a decoded instruction flow (no I/O).

Input: the items of one stream (see :mod:`hwtrace.analysis.flowitems`), in
decode order.  Output, streaming and in execution order: :class:`Enter`
when an activation begins, :class:`Activation` when it ends (its complete
slice), :class:`Marker` at gaps, overflows and decode errors.  Memory is
bounded by the stack depth, the clock's pending queue and the symbol cache,
not by the trace length.

How control flow maps to activations:

* ``call``: the instruction after it (the target) begins a new activation,
  whose return address is the call's fall-through.  A call to its own
  fall-through (``call 1f; 1: pop``, the PIC idiom) is not a call.
* a jump (typically indirect: longjmp, an unwinder installing a context)
  into the middle of a function of a frame below the top: the frames above
  it are closed ``UNWOUND`` at once (without stack pointers in the trace,
  the nearest such frame is taken).
* ``return``: pops the top frame if the target is its return address.  If
  not, the stack is searched downwards for a frame with that return address
  and everything above it is closed as ``UNWOUND`` (longjmp, exception
  unwinding, a return we missed).  If no frame matches, only the top frame
  is closed, flagged ``BAD_RETURN``.  When the bottom frame (synthesized
  at the start of a trace segment, return address unknown) returns, a new
  bottom frame for the code returned into begins there (``BEGIN_UNKNOWN``)
  as a sibling: its real begin lies before the trace.
* ``jump`` (and taken ``cond_jump``) to the start of another function (per
  the symbolizer): a tail call; the top frame ends and the target begins at
  the same depth with the same return address (``TAIL_CALL``).
* ``far_call``/``far_return``: like call/return, flagged ``FAR``; an
  asynchronous branch (interrupt with the kernel traced) opens an ``ASYNC``
  frame returning to the interrupted instruction.
* tracing disabled after a call/far call (filtered-out callee, syscall into
  an untraced kernel) or asynchronously (interrupt): an untraced frame
  (``[untraced]``, ``[syscall]``; ``ASYNC`` for an asynchronous disable
  such as an interrupt into an untraced kernel) is opened; when tracing
  is enabled again at its return address it simply ends; enabled at the
  return address of an untraced frame further down ends everything above
  it (a signal handler's sigreturn); enabled anywhere else inside it is a
  callback from untraced code (a signal handler after an asynchronous
  exit, in a thread's stream) -- except in a CPU's stream after an
  asynchronous exit, where it is most likely another thread: a gap.
  Enabled elsewhere otherwise is a *gap*.
* gaps (overflow, decode error, enabled at an unrelated place, a stack
  deeper than ``max_depth``): every open frame is closed there, flagged
  ``TRUNCATED``, and a :class:`Marker` is emitted; the stack restarts from
  the next instruction.  At the end of the trace open frames are closed
  ``TRUNCATED`` too.  Nothing is left open to pile up as a staircase.
* TSX: frames opened inside a transaction that aborts are closed
  ``ABORTED`` at the abort.
* a CPU's stream whose :class:`StreamInfo` carries the recording's context
  switches follows the threads: each has its own stack.  At an enable the
  switches that certainly came before it (by time), or the next ones
  whose thread is expected right there (its stack stopped with a return
  address equal to the enable's IP), or a thread seen for the first time
  (when the running one is not expected there) say who runs now
  (:mod:`.switches`).  The thread going out has its open frames closed
  ``SWITCHED_OUT`` and kept; when it comes back where it stopped they are
  opened again as ``SWITCHED_IN`` slices of the same activations (so the
  records still nest like parentheses, one CPU track), and its stack goes
  on as if never interrupted: no gap.  A thread that comes back elsewhere
  ran on another CPU meanwhile: it starts afresh (``BEGIN_UNKNOWN``), as
  does a thread seen for the first time.  Records carry the thread's tid.

Times come from the :class:`~hwtrace.analysis.clock.Clock` (TSC anchors
from events carrying ``tsc``, interpolated by instruction index; or
instruction counts).
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from hwtrace.analysis.clock import Clock
from hwtrace.analysis.flowitems import (ERROR, EVENT, INSN, ObjectItem,
                                        enum_name, event_name, kind_of)
from hwtrace.analysis.records import (Activation, Enter, Flag, Marker,
                                      StreamInfo)
from hwtrace.analysis.switches import SwitchTimeline

# transfer codes of the previous instruction
_NONE, _CALL, _RET, _JUMP, _COND, _FCALL, _FRET, _FJUMP = range(8)
ICLASS_CODE = {
    "other": _NONE, "ptwrite": _NONE, "unknown": _NONE, "error": _NONE,
    "call": _CALL, "return": _RET, "jump": _JUMP, "cond_jump": _COND,
    "far_call": _FCALL, "far_return": _FRET, "far_jump": _FJUMP,
    "indirect": _JUMP,
}

#: Symbolizer callback: address -> (function start, function name) or None
Lookup = Callable[[int], "tuple[int, str] | None"]


class _Frame:
    __slots__ = ("func", "name", "ret", "depth", "begin_idx", "begin",
                 "flags", "child_insns", "child_time", "parent", "untraced",
                 "tx", "ret_lo", "tid")

    def __init__(self, func, name, ret, depth, begin_idx, flags, parent,
                 untraced=False, tx=False, tid=None):
        self.func = func
        self.name = name
        self.ret = ret
        self.depth = depth
        self.begin_idx = begin_idx
        self.begin = None
        self.flags = flags
        self.child_insns = 0
        self.child_time = 0.0
        self.parent = parent
        self.untraced = untraced
        self.tx = tx
        self.ret_lo = None      # branch records: returns land in (ret_lo, ret_lo+15]
        self.tid = tid          # the thread (a CPU's stream following switches)


class CallStackBuilder:
    """Reconstructs the activations of one stream.

    Feed items with :meth:`feed` (or instructions with :meth:`insn`), take
    the finished records with :meth:`take`, and call :meth:`finish` at the
    end.  ``lookup(addr)`` names code: it returns ``(start, name)`` of the
    function containing ``addr`` or None; without it functions are named by
    address and tail calls cannot be recognized.
    """

    def __init__(self, stream: StreamInfo | None = None,
                 lookup: Lookup | None = None, clock: str = "auto",
                 tsc_hz: float | None = None, max_pending: int = 1 << 16,
                 max_depth: int = 1 << 16):
        self.stream = stream or StreamInfo()
        self._tid = self.stream.tid if self.stream.tid is not None else self.stream.cpu
        self._cpu_mode = self.stream.tid is None and self.stream.cpu is not None
        self._lookup = lookup
        self._syms: dict[int, tuple[int, str, bool]] = {}
        self._out: list = []
        self.clock = Clock(self._resolved, clock, tsc_hz, max_pending)
        self.max_depth = max_depth
        self.n = 0                     # instructions seen
        self._stack: list[_Frame] = []
        self._in_seg = False
        self._pend = _NONE
        self._pend_ip = 0
        self._pend_ret = 0
        self._paused = False
        self._tx_depth: int | None = None
        self._after_abort = False
        self._codes: dict = {}
        # a CPU's stream following context switches: the running thread,
        # and the stacks of the others (frames, in_seg, paused, tx_depth)
        tl = SwitchTimeline(self.stream.switches, self.stream.cpu,
                            self.stream.tsc_per_insn) \
            if self._cpu_mode and self.stream.switches else None
        self._follow = tl if tl else None
        self._thread: int | None = None
        self._parked: dict[int, tuple] = {}
        self._fresh = False             # switched in a thread without its stack
        # counters for summaries
        self.calls = 0
        self.markers: dict[str, int] = {}

    # -- output --------------------------------------------------------------

    def take(self) -> list:
        out, self._out = self._out, []
        return out

    def _resolved(self, item, t) -> None:
        tag = item[0]
        if tag == 0:                       # enter
            f = item[1]
            f.begin = t
            self._out.append(Enter(f.func, f.name, f.depth, t, f.begin_idx,
                                   f.flags, self._tid if f.tid is None else f.tid))
        elif tag == 1:                     # exit
            _, f, end_idx, extra = item
            begin = f.begin if f.begin is not None else t
            if t < begin:
                t = begin
            self._out.append(Activation(
                f.func, f.name, f.depth, begin, t, f.begin_idx, end_idx,
                f.child_insns, f.child_time, f.flags | extra,
                self._tid if f.tid is None else f.tid))
            p = f.parent
            if p is not None:
                p.child_time += t - begin
        else:                              # marker
            _, kind, idx, offset, detail, tid = item
            self._out.append(Marker(kind, t, idx, offset, detail,
                                    self._tid if tid is None else tid))

    # -- symbols -------------------------------------------------------------

    def _sym(self, addr: int) -> tuple[int, str, bool]:
        """(function start, name, known) of the code at addr, cached;
        unknown code is named by its address."""
        s = self._syms.get(addr)
        if s is None:
            r = self._lookup(addr) if self._lookup else None
            s = (r[0], r[1], True) if r else (addr, f"0x{addr:x}", False)
            if len(self._syms) > 1 << 20:
                self._syms.clear()
            self._syms[addr] = s
        return s

    def _is_func_start(self, addr: int, cur: _Frame | None) -> bool:
        if self._lookup is None:
            return False
        start, name, known = self._sym(addr)
        return (known and start == addr and (cur is None or cur.func != addr)
                and ".cold" not in name)

    # -- stack operations ----------------------------------------------------

    def _push(self, func, ret, flags=Flag.NONE, name=None, untraced=False,
              base=False):
        stack = self._stack
        if len(stack) >= self.max_depth:
            self._gap("gap", None, f"stack deeper than {self.max_depth}")
            self._in_seg = True
            flags |= Flag.BEGIN_UNKNOWN
        if name is None:
            if func is None:
                name = "[unknown]"
            else:
                start, name, _known = self._sym(func)
                if base:
                    func = start
        parent = stack[-1] if stack else None
        f = _Frame(func, name, ret, len(stack), self.n, flags, parent,
                   untraced, self._tx_depth is not None, self._thread)
        stack.append(f)
        self.calls += 1
        self.clock.push((0, f), self.n)
        return f

    def _pop(self, extra=Flag.NONE) -> _Frame:
        f = self._stack.pop()
        n = self.n
        if f.parent is not None:
            f.parent.child_insns += n - f.begin_idx
        self.clock.push((1, f, n, extra), n)
        return f

    def _close_all(self, extra: Flag) -> None:
        while self._stack:
            self._pop(extra)

    def _marker(self, kind: str, offset, detail: str) -> None:
        self.markers[kind] = self.markers.get(kind, 0) + 1
        self.clock.push((2, kind, self.n, offset, detail, self._thread), self.n)

    def _gap(self, kind: str, offset, detail: str) -> None:
        """Data lost here: close everything honestly and start over."""
        self.clock.seal(self.n)
        self._close_all(Flag.TRUNCATED)
        self._marker(kind, offset, detail)
        if kind in ("overflow", "error"):
            # other threads may have run in what was lost: their stacks
            # are no longer known either
            self._parked.clear()
        self._in_seg = False
        self._pend = _NONE
        self._paused = False
        self._tx_depth = None

    def _start_segment(self, ip: int) -> None:
        """The first instruction of a trace segment: its function began
        before (``BEGIN_UNKNOWN``) unless the segment starts exactly at the
        function's entry (a trace window opened at a function)."""
        self._in_seg = True
        start, _name, known = self._sym(ip)
        at_entry = known and start == ip and not self._fresh
        self._fresh = False
        self._push(ip, None, Flag.NONE if at_entry else Flag.BEGIN_UNKNOWN,
                   base=True)

    def _resume(self, to: int) -> None:
        """Execution comes back from untraced code (a record whose ``from``
        is unknown).  Back where the kernel frame on top expected: that
        frame ends.  Elsewhere (a signal handler): the kernel frame ends and
        the code resumed at runs as an asynchronous activation that returns
        to where the interrupted code stood."""
        top = self._stack[-1] if self._stack else None
        if top is None or not top.untraced:
            return
        expect = top.ret
        if expect == to or (top.ret_lo is not None
                            and 0 < to - top.ret_lo <= 15):
            self._pop()
            return
        self._pop()
        self._push(to, expect if expect is not None else top.ret_lo,
                   Flag.ASYNC)

    def _return(self, target: int, far: bool = False) -> None:
        stack = self._stack
        top = stack[-1]
        if top.ret == target or (top.ret_lo is not None
                                 and 0 < target - top.ret_lo <= 15):
            self._pop()
            return
        for k in range(len(stack) - 2, -1, -1):
            f = stack[k]
            if f.ret == target or (f.ret_lo is not None
                                   and 0 < target - f.ret_lo <= 15):
                while len(stack) > k + 1:
                    self._pop(Flag.UNWOUND)
                self._pop()
                return
        if top.ret is None and top.ret_lo is None and len(stack) > 1 \
                and stack[-2].untraced:
            # a callback returns into the untraced code that called it (or
            # a signal handler into its trampoline)
            self._pop()
            return
        if top.ret is None and len(stack) == 1:
            # the segment's bottom frame returns into code seen for the
            # first time: its caller, begun before the trace
            self._pop()
            self._push(target, None, Flag.BEGIN_UNKNOWN, base=True)
            return
        self._pop(Flag.BAD_RETURN)
        if not stack:
            self._push(target, None, Flag.BEGIN_UNKNOWN, base=True)

    def _jump_into(self, ip: int) -> None:
        """A jump into the middle of a function that is not the top frame's
        but a caller's: longjmp (or an unwinder installing a context) went
        back to that caller: close what is above it (``UNWOUND``)."""
        start, _name, known = self._sym(ip)
        stack = self._stack
        if not known or start == stack[-1].func:
            return
        for k in range(len(stack) - 2, -1, -1):
            if stack[k].func == start:
                while len(stack) > k + 1:
                    self._pop(Flag.UNWOUND)
                return

    def _settle(self, ip: int) -> None:
        """The previous instruction transferred control to ip."""
        pend, self._pend = self._pend, _NONE
        if pend == _CALL:
            if ip != self._pend_ret:
                self._push(ip, self._pend_ret)
        elif pend == _RET or pend == _FRET:
            self._return(ip, pend == _FRET)
        elif pend == _JUMP or pend == _COND:
            if ip == self._pend_ret:
                return
            stack = self._stack
            if self._is_func_start(ip, stack[-1]):
                old = self._pop()
                self._push(ip, old.ret, Flag.TAIL_CALL | (old.flags & Flag.FAR))
            elif pend == _JUMP and self._lookup is not None and len(stack) > 1:
                self._jump_into(ip)
        elif pend == _FCALL:
            self._push(ip, self._pend_ret, Flag.FAR)

    # -- input ---------------------------------------------------------------

    def insn(self, ip: int, size: int, iclass) -> None:
        """One executed instruction (``iclass`` a string or enum)."""
        code = ICLASS_CODE.get(iclass) if type(iclass) is str else None
        if code is None:
            code = self._codes.get(iclass)
            if code is None:
                code = ICLASS_CODE.get(enum_name(iclass), _NONE)
                self._codes[iclass] = code
        if self._pend:
            self._settle(ip)
        elif not self._in_seg:
            self._start_segment(ip)
        self._after_abort = False
        self.n += 1
        if code:
            self._pend = code
            self._pend_ip = ip
            self._pend_ret = ip + size

    def feed(self, item) -> None:
        m = item if isinstance(item, dict) else ObjectItem(item)
        k = kind_of(m)
        if k == INSN:
            self.insn(m.get("ip"), m.get("size") or 0, m.get("iclass"))
        elif k == EVENT:
            self.event(event_name(m), m)
        elif k == ERROR:
            self._gap("error", m.get("offset"), str(m.get("error")))
        else:
            st = enum_name(m.get("status"))
            if st in ("resync_stalled",):
                self._gap("gap", m.get("offset"), st)

    def event(self, name: str, m) -> None:
        tsc = m.get("tsc")
        tl = self._follow
        if tl is not None:
            tl.time(self.n, tsc)
            if name in ("enabled", "disabled", "async_disabled") \
                    and not m.get("status_update"):
                tl.tracing(name == "enabled")
        if name == "tick" or name not in _STRUCTURAL:
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            return
        off = m.get("offset")
        if m.get("status_update") and name in ("enabled", "disabled"):
            # a PSB+ restating the tracing state: nothing changed
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            return
        if name == "enabled":
            self._enabled(m, tsc)
        elif name in ("disabled", "async_disabled"):
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            self._disabled(name, m)
        elif name == "overflow":
            if self._in_seg:
                self._gap("overflow", off, "trace overflow: data lost")
            else:
                self._marker("overflow", off, "trace overflow: data lost")
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
        elif name == "stop":
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            self._paused = True
        elif name == "async_branch":
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            frm, to = m.get("from"), m.get("to")
            if self._after_abort:
                # the abort's jump to the fallback path: not an interrupt
                self._after_abort = False
                if frm is not None and self._pend and self._in_seg:
                    self._settle(frm)
            elif frm is not None and self._in_seg:
                if self._pend:
                    self._settle(frm)
                self._push(to, frm, Flag.ASYNC) if to is not None else \
                    self._push(None, frm, Flag.ASYNC, name="[interrupt]")
        elif name == "tsx":
            if tsc is not None:
                self.clock.anchor(self.n, tsc)
            self._tsx(m)

    def _enabled(self, m, tsc) -> None:
        ip = m.get("ip")
        if self._follow is not None and ip is not None:
            self._follow_switches(ip)
        stack = self._stack
        top = stack[-1] if stack else None
        if self._paused and top is not None and top.untraced:
            if ip == top.ret:
                self._anchor(tsc)
                self._paused = False
                self._pop()
                return
            # back to an interrupted frame further down (a signal handler's
            # sigreturn): what ran on top of it is done
            for k in range(len(stack) - 2, -1, -1):
                f = stack[k]
                if f.untraced and ip is not None and f.ret == ip:
                    self._anchor(tsc)
                    self._paused = False
                    while len(stack) > k + 1:
                        self._pop(Flag.UNWOUND)
                    self._pop()
                    return
            if ip is not None and not (top.flags & Flag.ASYNC and self._cpu_mode
                                       and self._follow is None):
                # called back from untraced code (a filtered-out callee
                # calling a traced function; in a thread's stream, a signal
                # handler run from an interrupt)
                self._anchor(tsc)
                self._paused = False
                self._push(ip, None, top.flags & Flag.ASYNC, base=True)
                return
            # a CPU's stream (switches unknown) going on elsewhere after an
            # asynchronous exit: most likely another thread: a gap
        elif self._paused and m.get("resumed"):
            self._anchor(tsc)
            self._paused = False
            return
        if self._in_seg:
            self._gap("gap", m.get("offset"), "tracing resumed elsewhere")
        self._paused = False
        self._pend = _NONE
        self._anchor(tsc)

    # -- context switches (a CPU's stream) -------------------------------------

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
        best = tl.due(tl.known)                 # certainly before this enable
        fit = self._fit(best, ip)
        est = tl.estimate(self.n)
        if est is not None:
            k = tl.due(est)                     # before it by the estimate
            if k > best:
                f = self._fit(k, ip)
                if f >= fit:
                    best, fit = k, f
        if fit < 2:
            exact = fresh = None
            for j in tl.upcoming(best):
                if tl.thread_after(j + 1, None) is None:
                    continue        # to idle: not who resumes here
                f = self._fit(j + 1, ip)
                if f == 2:
                    exact = j + 1
                    break
                if f == 1 and fresh is None and \
                        (est is None or tl.switches[j].time <= est or j == best):
                    fresh = j + 1
            if exact is not None:
                best = exact
            elif fit == 0 and fresh is not None:
                best = fresh
        if best > tl.i:
            cur = self._thread
            self._switch_to(tl.thread_after(best, cur), ip, tl.leaves(cur, best))
            tl.advance(best)

    def _switch_to(self, tid: int | None, ip: int, left: bool = True) -> None:
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
        self._pend = _NONE
        self._after_abort = False
        st = self._parked.pop(tid, None) if tid is not None else None
        if st is None or not self._expects(st[0], ip):
            # first seen, or back from another CPU: its stack starts afresh,
            # in what it was doing before (nothing begins here) -- unless
            # this is where the stream itself begins
            self._fresh = self.n > 0
            self._in_seg = False
            self._paused = False
            self._tx_depth = None
            return
        frames, self._in_seg, self._paused, self._tx_depth = st
        n = self.n
        parent = None
        for t in frames:
            f = _Frame(t.func, t.name, t.ret, t.depth, n, t.flags | Flag.SWITCHED_IN,
                       parent, t.untraced, t.tx, tid)
            f.ret_lo = t.ret_lo
            stack.append(f)
            self.clock.push((0, f), n)
            parent = f

    def _anchor(self, tsc) -> None:
        if tsc is not None:
            self.clock.anchor(self.n, tsc)

    def _disabled(self, name: str, m) -> None:
        if not self._in_seg:
            return
        pend, self._pend = self._pend, _NONE
        stack = self._stack
        self._paused = True
        at = m.get("at") if name == "async_disabled" else None
        if pend == _FCALL:
            self._push(None, self._pend_ret, Flag.FAR, name="[syscall]",
                       untraced=True)
        elif at is not None:
            # interrupted at `at`: the pending transfer (a call too) went
            # there first, and execution resumes there
            if pend:
                self._pend = pend
                self._settle(at)
            self._push(None, at, Flag.ASYNC, name="[untraced]", untraced=True)
        elif pend == _CALL:
            ip = None if m.get("ip_suppressed") else m.get("ip")
            if ip is not None:
                self._push(ip, self._pend_ret, untraced=True)
            else:
                self._push(None, self._pend_ret, name="[untraced]",
                           untraced=True)
        elif pend == _RET and stack and stack[-1].ret is None \
                and len(stack) > 1 and stack[-2].untraced:
            self._pop()              # a callback returned into untraced code

    def _tsx(self, m) -> None:
        if m.get("aborted"):
            self._after_abort = True
            if self._tx_depth is not None:
                while len(self._stack) > max(self._tx_depth, 1):
                    self._pop(Flag.ABORTED)
            self._tx_depth = None
        elif m.get("speculative"):
            if self._tx_depth is None:
                self._tx_depth = len(self._stack)
        else:
            self._tx_depth = None

    def branch(self, kind: str, frm: int, to: int, time=None) -> None:
        """One branch record (spec/branch-trace.md): each counts as one
        step of the stream's index; ``time`` (if any) anchors the clock."""
        self.n += 1
        if time is not None:
            self.clock.anchor(self.n, time)
        if frm is None and to is None:
            return
        if not self._in_seg:
            self._start_segment(frm if frm is not None else to)
            if frm is None:
                # tracing begins here: the record only says where
                return
        if kind in ("call", "indirect_call", "far", "syscall", "interrupt"):
            flags = (Flag.NONE if kind in ("call", "indirect_call") else
                     Flag.ASYNC if kind == "interrupt" else Flag.FAR)
            ret = frm if kind == "interrupt" else None
            if to is None:
                # into untraced code (the kernel): a frame that stands for it
                f = self._push(None, ret, flags, name=f"[{kind}]",
                               untraced=True)
            else:
                f = self._push(to, ret, flags)
            if kind != "interrupt":
                f.ret_lo = frm
        elif kind in ("return", "sysret", "iret"):
            if to is None:
                return
            if frm is None:
                self._resume(to)
            else:
                self._return(to, kind != "return")
        elif kind in ("jump", "indirect_jump", "cond"):
            top = self._stack[-1]
            if self._is_func_start(to, top):
                old = self._pop()
                f = self._push(to, old.ret, Flag.TAIL_CALL)
                f.ret_lo = old.ret_lo

    def finish(self) -> None:
        """End of the stream: close what is open (``TRUNCATED``).  A return
        that was the last instruction did return: its frame ends normally."""
        if self._pend in (_RET, _FRET) and self._stack:
            self._pend = _NONE
            self._pop()
        self.clock.seal(self.n)
        if self._stack:
            tl = self._follow
            # a thread switched out after its last instruction here goes on
            # elsewhere; one still running when the trace ends is cut short
            left = tl is not None and tl.leaves(self._thread, len(tl.switches))
            self._close_all(Flag.SWITCHED_OUT if left else Flag.TRUNCATED)
        self._in_seg = False
        self._pend = _NONE
        self.clock.finish()


_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


def reconstruct(items: Iterable, stream: StreamInfo | None = None,
                lookup: Lookup | None = None, clock: str = "auto",
                tsc_hz: float | None = None,
                builder: CallStackBuilder | None = None, **kw) -> Iterator:
    """Yield Enter/Activation/Marker records for one stream's flow items.

    Pass ``builder`` to inspect it afterwards (clock unit, counters)."""
    b = builder or CallStackBuilder(stream, lookup, clock, tsc_hz, **kw)
    insn = b.insn
    feed = b.feed
    for item in items:
        if type(item) is dict and "iclass" in item and "error" not in item \
                and "event" not in item:
            insn(item["ip"], item.get("size", 0), item["iclass"])
        else:
            feed(item)
        if b._out:
            yield from b.take()
    b.finish()
    yield from b.take()


def _field(r, name):
    if isinstance(r, dict):
        return r.get(name)
    return getattr(r, name, None)


def reconstruct_branches(records: Iterable, lookup: Lookup | None = None,
                         clock: str = "auto", tsc_hz: float | None = None,
                         **kw) -> Iterator:
    """Yield records for a stream of branch records (pid, tid, kind, from,
    to, time), one reconstruction per thread; each record's ``tid`` says
    which.  Dicts or objects (``from`` may be spelled ``from_``/``src``)."""
    builders: dict = {}
    for r in records:
        tid = _field(r, "tid")
        b = builders.get(tid)
        if b is None:
            b = builders[tid] = CallStackBuilder(
                StreamInfo(_field(r, "pid"), tid), lookup, clock, tsc_hz, **kw)
        frm = _field(r, "from")
        if frm is None:
            frm = _field(r, "from_")
        if frm is None:
            frm = _field(r, "src")
        to = _field(r, "to")
        if to is None:
            to = _field(r, "dst")
        b.branch(enum_name(_field(r, "kind")), frm, to, _field(r, "time"))
        if b._out:
            yield from b.take()
    for b in builders.values():
        b.finish()
        yield from b.take()
