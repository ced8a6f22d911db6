"""The machinery both sources share (no I/O): executed instructions in,
branch records out, with the trigger windows, call depth and filter mask
applied the same way whatever the source.

A source tells the :class:`Tracker`, per thread and in program order:

* ``step(th, pc, x, time)``: the instruction at ``pc`` executes; ``x`` is
  its ``hwtrace.x86.Insn`` when it is a control transfer
  (:func:`~hwtrace.branches.classify.is_transfer`), else None.  The
  previous transfer's target is ``pc``.
* ``interrupt(th, frm, to, time)``: an asynchronous transfer (a signal
  handler entered at ``to``; ``frm`` = the instruction that would have
  executed next, or that faulted).
* ``transfer(th, to)``: the previous transfer went to ``to`` but what
  follows is not observed (a live window closed there).
Depth counts calls (+1) and returns (-1); a signal handler (an
``interrupt``, or a ``syscall`` whose kernel exit went elsewhere than its
fall-through) runs one level deeper, and the sigreturn that resumes the
interrupted code restores the depth it had.

* ``close(th)``: the source ended the window (the stepper's return-address
  and stack-pointer match); ``gap(th)``: continuity lost.

Finished records accumulate in ``tracker.out`` (a list the source drains).
"""

from __future__ import annotations

from .classify import classify
from .mask import Mask
from .records import Branch
from .triggers import Trigger

_DOWN = frozenset({"call", "indirect_call"})


class ThreadState:
    __slots__ = ("pid", "tid", "on", "depth", "wanted", "pend_pc", "pend_x",
                 "pend_time", "sig")

    def __init__(self, pid, tid, on: bool, wanted: bool):
        self.pid = pid
        self.tid = tid
        self.on = on
        self.depth = 0
        self.wanted = wanted
        self.pend_pc = 0
        self.pend_x = None
        self.pend_time = None
        self.sig: list[tuple[int, int]] = []   # (resume address, depth) per handler


_MAX_SIG = 64


class Tracker:
    def __init__(self, trigger: Trigger | None = None, mask: Mask | None = None):
        self.trigger = trigger or Trigger()
        self.mask = mask or Mask()
        self.watch = self.trigger.watch
        self.out: list[Branch] = []
        self._threads: dict[tuple, ThreadState] = {}

    def thread(self, pid, tid) -> ThreadState:
        key = (pid, tid)
        th = self._threads.get(key)
        if th is None:
            th = self._threads[key] = ThreadState(
                pid, tid, self.trigger.initially_on, self.mask.wants_thread(pid, tid))
        return th

    # -- what sources call ----------------------------------------------

    def step(self, th: ThreadState, pc: int, x, time=None) -> None:
        if th.pend_x is not None:
            self._resolve(th, pc)
        if pc in self.watch:
            self._check(th, pc)
        if x is not None:
            th.pend_pc = pc
            th.pend_x = x
            th.pend_time = time

    def interrupt(self, th: ThreadState, frm: int, to: int, time=None) -> None:
        if th.pend_x is not None:
            self._resolve(th, frm)
        if th.on:
            if th.wanted and self.mask.accepts("interrupt", frm):
                self.out.append(Branch(th.pid, th.tid, "interrupt", frm, to, time, th.depth))
            self._enter_handler(th, frm)

    def transfer(self, th: ThreadState, to: int) -> None:
        if th.pend_x is not None:
            self._resolve(th, to)

    def close(self, th: ThreadState) -> None:
        th.pend_x = None
        th.on = False
        th.depth = 0
        th.sig.clear()

    def gap(self, th: ThreadState) -> None:
        th.pend_x = None

    # -- internals ----------------------------------------------------------

    def _check(self, th: ThreadState, pc: int) -> None:
        t = self.trigger
        if th.on:
            if pc == t.stop:
                th.on = False
        elif pc == t.start or pc == t.within:
            th.on = True
            th.depth = 0
            th.sig.clear()

    def _resolve(self, th: ThreadState, to: int) -> None:
        x = th.pend_x
        th.pend_x = None
        if not th.on:
            return
        frm = th.pend_pc
        kind = classify(x, frm, to)
        if kind is None:
            return
        d = th.depth
        if th.wanted and self.mask.accepts(kind, frm):
            self.out.append(Branch(th.pid, th.tid, kind, frm, to, th.pend_time, d))
        if kind in _DOWN:
            th.depth = d + 1
        elif kind == "return":
            if d == 0 and self.trigger.within is not None:
                th.on = False
            else:
                th.depth = d - 1
        elif kind == "syscall" or kind == "interrupt":
            fall = frm + x.size
            if to != fall:
                sig = th.sig
                if sig and sig[-1][0] == to:      # sigreturn to where it hit
                    th.depth = sig.pop()[1]
                else:                             # a handler, entered at syscall exit
                    self._enter_handler(th, fall)

    @staticmethod
    def _enter_handler(th: ThreadState, resume: int) -> None:
        """A signal handler runs one level deeper than the code it
        interrupted, until the sigreturn that resumes at ``resume``."""
        if len(th.sig) >= _MAX_SIG:
            del th.sig[0]
        th.sig.append((resume, th.depth))
        th.depth += 1
