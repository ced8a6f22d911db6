"""Call-stack reconstruction from decoded flow (no I/O).

Input: one stream's batches (:mod:`hwtrace.flow.batches`, decoded with
every branch ending a record: ``Stream.batches(view=True)``), or its flow
items one by one (:mod:`hwtrace.analysis.itemflow` groups them into the
same records).  Output, streaming and in execution order, as
:class:`~.slices.Slices` chunks (activations in numpy columns):
activations begun, activations ended (their complete slice), and
:class:`Marker` s at gaps, overflows and decode errors.  Memory is bounded
by the stack depth, the rows waiting for their time and the symbol
tables, not by the trace length.

The runs of records between the events that matter (tracing disabled or
enabled, overflows, errors, TSX, ...) go through :func:`.runs.solve`,
vectorized; what it does not take as regular -- and every event -- goes
through the methods below, one transfer at a time.  Both follow the same
rules:

* ``call``: the instruction after it (the target) begins a new activation,
  whose return address is the call's fall-through.  A call to its own
  fall-through (``call 1f; 1: pop``, the PIC idiom) is not a call.
* a jump (typically indirect: longjmp, an unwinder installing a context)
  out of its function into the middle of a function of a frame below the
  top: the frames above it are closed ``UNWOUND`` at once (without stack
  pointers in the trace, the nearest such frame is taken).  A jump within
  one function unwinds nothing.
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
  switches follows the threads (:mod:`.threads`): each has its own stack,
  and every slice carries the pid/tid of the thread it belongs to.

Times come from the clock (:mod:`.clock`): each record's TSC, and events
carrying one, anchor it; instructions between anchors are interpolated.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hwtrace.analysis import runs
from hwtrace.analysis.clock import TimeBase
from hwtrace.analysis.flowitems import ERROR, EVENT, INSN, ObjectItem, \
    enum_name, event_name, kind_of
from hwtrace.analysis.records import LOSS_KINDS, Flag, Marker, StreamInfo
from hwtrace.analysis.rows import Pending
from hwtrace.analysis.slices import (NameTable, PathTable, Slices,
                                     path_of, to_records, _UNKNOWN)
from hwtrace.analysis.switches import SwitchTimeline
from hwtrace.analysis.symtable import AddrTable
from hwtrace.analysis.batchfeed import BatchInput, _Frame
from hwtrace.analysis.threads import FollowThreads, ThreadRegistry

_NONE, _CALL, _RET, _JUMP, _COND, _FCALL, _FRET, _FJUMP = range(8)
ICLASS_CODE = {
    "other": _NONE, "ptwrite": _NONE, "unknown": _NONE, "error": _NONE,
    "call": _CALL, "return": _RET, "jump": _JUMP, "cond_jump": _COND,
    "far_call": _FCALL, "far_return": _FRET, "far_jump": _FJUMP,
    "indirect": _JUMP,
}

#: Symbolizer callback: address -> (function start, function name) or None
Lookup = Callable[[int], "tuple[int, str] | None"]

_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


class _ClockView:
    """``builder.clock``: the unit, and how many rows wait for a time."""

    def __init__(self, b):
        self._b = b

    @property
    def unit(self):
        return self._b.time.unit

    @property
    def pending(self) -> int:
        return self._b.pending.count


class CallStackBuilder(FollowThreads, BatchInput):
    """Reconstructs the activations of one stream.

    Feed it batches (:meth:`feed_batch`) or flow items (:meth:`feed`,
    :meth:`insn`, or :meth:`branch` for branch records); take the finished
    chunks with :meth:`take_slices` (or classic records with :meth:`take`)
    and call :meth:`finish` at the end.  ``lookup(addr)`` names code: it
    returns ``(start, name)`` of the function containing ``addr`` or None;
    without it functions are named by address and tail calls cannot be
    recognized.  ``vectorize=False`` takes every transfer one at a time
    (the reference the vectorized runs are checked against).  ``threads``:
    a :class:`~.threads.ThreadRegistry` shared with the builders of the
    recording's other CPU streams, fed in time order (threads' stacks
    follow them from CPU to CPU); else the builder has its own."""

    def __init__(self, stream: StreamInfo | None = None,
                 lookup: Lookup | None = None, clock: str = "auto",
                 tsc_hz: float | None = None, max_pending: int = 1 << 16,
                 max_depth: int = 1 << 16, vectorize: bool = True,
                 paths: bool = True, space_lookup=None, threads=None):
        self.stream = stream or StreamInfo()
        st = self.stream
        self._tid = st.tid              # a CPU's stream: its thread, where known
        self._spid = st.pid
        self._cpu_mode = st.tid is None and st.cpu is not None
        self._lookup = lookup
        self.names = NameTable()
        self.paths = PathTable()
        self.addr = AddrTable(lookup, self.names)
        #: ``space_lookup(space)``: the lookup naming an address space's
        #: own code (a bundle whose processes run different programs at
        #: the same addresses); the stream's space items switch to it
        self._space_lookup = space_lookup
        self._space_tables: dict = {}
        self._arrays = None             # the batch being fed
        self.time = TimeBase(clock, tsc_hz, max_pending)
        self.pending = Pending(self.time)
        self.clock = _ClockView(self)
        self.max_pending = max_pending
        self.max_depth = max_depth
        self.vectorize = vectorize
        #: call-path hashes (``Slices`` column ``path``, :attr:`paths`)
        #: wanted -- by folded stacks; else every path is 0
        self.want_paths = paths
        self.n = 0                     # instructions seen
        self._seq = 0                  # rows and anchors, in order
        self._next_id = 0
        self._stack: list[_Frame] = []
        self._sum = np.zeros(0, runs.STACK)
        self._sum_n = 0                # leading frames _sum describes
        self._in_seg = False
        self._pend = _NONE
        self._pend_ip = 0
        self._pend_ret = 0
        self._paused = False
        self._tx_depth: int | None = None
        self._after_abort = False
        self._soft = False             # runs.solve's soft: see batchfeed
        self._jumped = False
        self._codes: dict = {}
        # a CPU's stream following context switches: the running thread,
        # and the stacks of the others (frames, in_seg, paused, tx_depth)
        tl = SwitchTimeline(st.switches, st.cpu, st.tsc_per_insn, st.clock_exact,
                            st.clock_counted) \
            if self._cpu_mode and st.switches else None
        self._follow = tl if tl else None
        self._thread: int | None = None
        self._pid: int | None = None
        #: the threads' stacks and per-process state: shared by the
        #: builders of a recording's CPU streams fed in time order
        self._threads = threads if threads is not None else ThreadRegistry()
        self._parked = self._threads.parked
        self._fresh = False
        self._space_of = self._threads.space_of
        self._execd = self._threads.execd
        self._exec_entry = None         # pid whose next segment begins its new program
        # is tracing on as far as the events said (None: unknown -- the
        # stream's start, or after an overflow or a decode error)
        self._tracing: bool | None = None
        self._items = None             # itemflow.ItemGrouper, made on demand
        self._out: list[Slices] = []
        # counters for summaries
        self.calls = 0
        self.markers: dict[str, int] = {}
        #: the first few losses: (kind, trace offset, instruction index, detail)
        self.loss_samples: list[tuple] = []

    # -- output ------------------------------------------------------------------
    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _flush(self) -> None:
        p = self.pending
        if p.count > self.max_pending:
            self.time.seal(self._next(), self.n)
        if not p.count:
            return
        chunk, marks = p.flush()
        if marks:
            ms = []
            for seq, idx, kind, off, detail, tid, t in marks:
                ms.append((seq, Marker(kind, t, idx, off, detail, tid)))
            chunk = chunk._replace(markers=ms)
        if chunk:
            self._out.append(chunk)

    def take_slices(self) -> list[Slices]:
        """The chunks finished so far (each timed)."""
        if self._items is not None:
            self._items.flush()
        self._flush()
        out, self._out = self._out, []
        return out

    def take(self) -> list:
        """The finished records as Enter/Activation/Marker objects."""
        out = []
        for ch in self.take_slices():
            out += to_records(ch, self.names)
        return out

    # -- symbols -----------------------------------------------------------------
    def _sym(self, addr: int) -> tuple[int, int, bool]:
        """(function start, name id, known) of the code at addr."""
        return self.addr.one(addr)

    def _is_func_start(self, addr: int, cur: _Frame | None) -> bool:
        if self._lookup is None:
            return False
        start, nid, known = self._sym(addr)
        return (known and start == addr and (cur is None or cur.func != addr)
                and ".cold" not in self.names[nid])

    # -- stack operations --------------------------------------------------------
    def _push(self, func, ret, flags=Flag.NONE, name=None, untraced=False,
              base=False, count=True) -> _Frame:
        stack = self._stack
        if count and len(stack) >= self.max_depth:
            self._gap("gap", None, f"stack deeper than {self.max_depth}")
            self._in_seg = True
            flags |= Flag.BEGIN_UNKNOWN
        if name is None:
            if func is None:
                nid = self.names.id("[unknown]")
            else:
                start, nid, _known = self._sym(func)
                if base:
                    func = start
        else:
            nid = self.names.id(name)
        parent = stack[-1] if stack else None
        f = _Frame()
        f.id = self._next_id
        self._next_id += 1
        f.parent = parent.id if parent is not None else -1
        f.func = func
        f.name = self.names[nid]
        f.nid = nid
        f.ret = ret
        f.depth = len(stack)
        f.begin_idx = self.n
        f.eseq = self._next()
        f.flags = Flag(flags)
        f.untraced = untraced
        f.tx = self._tx_depth is not None
        f.ret_lo = None
        f.tid = self._thread
        f.pid = self._pid
        if self.want_paths:
            ppath = parent.path if parent is not None else 0
            f.path = path_of(ppath, nid)
            self.paths.add(f.path, ppath, nid)
        else:
            f.path = 0
        stack.append(f)
        if count:
            self.calls += 1
        self.pending.enters.add_row(self._row(f, -1, -1, f.flags))
        return f

    def _row(self, f: _Frame, end_idx: int, xseq: int, flags) -> tuple:
        tid = f.tid if f.tid is not None else self._tid
        pid = f.pid if f.pid is not None else self._spid
        return (f.id, f.parent, _UNKNOWN if f.func is None else f.func, f.nid,
                f.depth, int(flags), -1 if pid is None else pid,
                -1 if tid is None else tid, f.begin_idx, end_idx, f.eseq,
                xseq, f.path, 0.0, 0.0, 0, 0.0)

    def _pop(self, extra=Flag.NONE) -> _Frame:
        f = self._stack.pop()
        if self._sum_n > len(self._stack):
            self._sum_n = len(self._stack)
        self.pending.exits.add_row(self._row(f, self.n, self._next(),
                                             f.flags | extra))
        return f

    def _close_all(self, extra: Flag) -> None:
        while self._stack:
            self._pop(extra)

    def _marker(self, kind: str, offset, detail: str) -> None:
        self.markers[kind] = self.markers.get(kind, 0) + 1
        if kind in LOSS_KINDS and len(self.loss_samples) < 5:
            self.loss_samples.append((kind, offset, self.n, detail))
        tid = self._thread if self._thread is not None else self._tid
        self.pending.markers.append((self._next(), self.n, kind, offset,
                                     detail, tid))

    def _seal(self) -> None:
        self.time.seal(self._next(), self.n)

    def _gap(self, kind: str, offset, detail: str) -> None:
        """Data lost here: close everything honestly and start over."""
        self._seal()
        self._close_all(Flag.TRUNCATED)
        self._marker(kind, offset, detail)
        if kind in ("overflow", "error"):
            # other threads may have run in what was lost: their stacks
            # are no longer known either, nor is who runs next
            self._threads.forget(self)
            self._tracing = None
        self._in_seg = False
        self._pend = _NONE
        self._paused = False
        self._tx_depth = None

    def _exec_check(self, space) -> None:
        """A process that comes back in another address space running
        another file exec'd: its old program's frames never return (they
        end ``UNWOUND``) and the new one begins at its entry, not "before
        the trace" -- at once for the running thread (a thread's stream),
        else when its thread comes back (``threads._switch_to``)."""
        pid = getattr(space, "pid", None)
        last = self._space_of.get(pid)
        self._space_of[pid] = space
        if last is None or last is space or not last.exe or not space.exe \
                or last.exe == space.exe:
            return
        if self._follow is not None and self._pid != pid:
            self._execd.add(pid)
            return
        self._execd.discard(pid)
        while self._stack:
            self._pop(Flag.UNWOUND)
        self._in_seg = False
        self._paused = False
        self._pend = _NONE
        self._tx_depth = None
        self._exec_entry = pid          # (even if switched out and back first)

    def _start_segment(self, ip: int) -> None:
        """The first instruction of a trace segment: its function began
        before (``BEGIN_UNKNOWN``) unless the segment starts exactly at the
        function's entry (a trace window opened at a function)."""
        self._in_seg = True
        start, _nid, known = self._sym(ip)
        ex = self._exec_entry
        execd = ex is not None and (self._follow is None or ex == self._pid)
        at_entry = known and start == ip and (not self._fresh or execd)
        self._fresh = False
        if execd:
            self._exec_entry = None
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

    def _same_function(self, a: int, b: int) -> bool:
        """Both addresses in one known function (a jump that stays inside
        its function unwinds nothing)."""
        sa, _n, ka = self._sym(a)
        if not ka:
            return False
        sb, _n, kb = self._sym(b)
        return kb and sa == sb

    def _jump_into(self, ip: int) -> None:
        """A jump into the middle of a function that is not the top frame's
        but a caller's: longjmp (or an unwinder installing a context) went
        back to that caller: close what is above it (``UNWOUND``)."""
        start, _nid, known = self._sym(ip)
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
            elif pend == _JUMP and self._lookup is not None and len(stack) > 1 \
                    and not self._same_function(self._pend_ip, ip):
                self._jump_into(ip)
        elif pend == _FCALL:
            self._push(ip, self._pend_ret, Flag.FAR)

    def _anchor(self, tsc) -> None:
        if tsc is not None:
            self.time.anchor(self._next(), self.n, tsc)

    # -- input: flow items one at a time ------------------------------------------------
    def insn(self, ip: int, size: int, iclass) -> None:
        """One executed instruction (``iclass`` a string or enum)."""
        self._grouper().insn(ip, size, iclass)

    def feed(self, item) -> None:
        """One flow item (see :mod:`hwtrace.analysis.flowitems`)."""
        self._grouper().feed(item)

    def _grouper(self):
        if self._items is None:
            from hwtrace.analysis.itemflow import ItemGrouper
            self._items = ItemGrouper(lambda b: self.feed_batch(b, True))
        return self._items

    def _feed_one(self, item) -> None:
        """An event, error or status item (a dict or an object)."""
        m = item if isinstance(item, dict) else ObjectItem(item)
        k = kind_of(m)
        if k == EVENT:
            self.event(event_name(m), m)
        elif k == ERROR:
            self._gap("error", m.get("offset"), str(m.get("error")))
        elif k != INSN:
            st = enum_name(m.get("status"))
            if st in ("resync_stalled",):
                self._gap("gap", m.get("offset"), st)

    def event(self, name: str, m) -> None:
        tsc = m.get("tsc")
        tl = self._follow
        update = m.get("status_update")
        # a status update enabling tracing after a gap (the stream's start,
        # an error, an overflow) or a disable: who runs there is not known
        # -- the sideband is asked, as at a TIP.PGE (the branch records do
        # the same)
        ask = tl is not None and name == "enabled" and update \
            and self._tracing is not True
        if tl is not None:
            tl.time(self.n, tsc)
            if name in ("enabled", "disabled", "async_disabled") \
                    and (not update or ask):
                tl.tracing(name == "enabled")
        if name in ("enabled", "disabled", "async_disabled"):
            self._tracing = name == "enabled"
        elif name == "overflow":
            self._tracing = None
        if name == "tick" or name not in _STRUCTURAL:
            self._anchor(tsc)
            return
        off = m.get("offset")
        if update and name in ("enabled", "disabled"):
            # a PSB+ restating the tracing state: nothing changed (but who
            # runs, where that was not known)
            if ask and m.get("ip") is not None:
                self._follow_switches(m.get("ip"))
            self._anchor(tsc)
            return
        if name == "enabled":
            self._enabled(m, tsc)
        elif name in ("disabled", "async_disabled"):
            self._anchor(tsc)
            self._disabled(name, m)
        elif name == "overflow":
            if self._in_seg:
                self._gap("overflow", off, "trace overflow: data lost")
            else:
                self._marker("overflow", off, "trace overflow: data lost")
            self._anchor(tsc)
        elif name == "stop":
            self._anchor(tsc)
            self._paused = True
        elif name == "async_branch":
            self._anchor(tsc)
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
            self._anchor(tsc)
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

    # -- input: branch records (spec/branch-trace.md) -----------------------------------
    def branch(self, kind: str, frm: int, to: int, time=None) -> None:
        """One branch record: each counts as one step of the stream's
        index; ``time`` (if any) anchors the clock."""
        self.n += 1
        if time is not None:
            self._anchor(time)
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
        if self.pending.count > self.max_pending:
            self._flush()

    def finish(self) -> None:
        """End of the stream: close what is open (``TRUNCATED``).  A return
        that was the last instruction did return: its frame ends normally."""
        if self._items is not None:
            self._items.flush()
        if self._pend in (_RET, _FRET) and self._stack:
            self._pend = _NONE
            self._pop()
        self._seal()
        if self._stack:
            tl = self._follow
            # a thread switched out after its last instruction here goes on
            # elsewhere; one still running when the trace ends is cut short
            left = tl is not None and tl.leaves(self._thread, len(tl.switches))
            if left:        # (kept for another CPU's stream to go on with)
                self._park_running()
            else:
                self._close_all(Flag.TRUNCATED)
        if self._threads.running.get(self._thread) is self:
            del self._threads.running[self._thread]
        self._in_seg = False
        self._pend = _NONE
        self._seal()
        self._flush()
        self.pending.enters.release()
        self.pending.exits.release()


def reconstruct(items, stream: StreamInfo | None = None,
                lookup: Lookup | None = None, clock: str = "auto",
                tsc_hz: float | None = None,
                builder: CallStackBuilder | None = None, **kw):
    """Yield Enter/Activation/Marker records for one stream's flow items.

    Pass ``builder`` to inspect it afterwards (clock unit, counters)."""
    b = builder or CallStackBuilder(stream, lookup, clock, tsc_hz, **kw)
    g = b._grouper()
    for item in items:
        g.feed(item)
        if g.full:
            g.flush()
            yield from b.take()
    b.finish()
    yield from b.take()


def _field(r, name):
    if isinstance(r, dict):
        return r.get(name)
    return getattr(r, name, None)


def reconstruct_branches(records, lookup: Lookup | None = None,
                         clock: str = "auto", tsc_hz: float | None = None,
                         **kw):
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
