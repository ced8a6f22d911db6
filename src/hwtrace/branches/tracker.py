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
* ``leave(th, to=None, time)``: tracing stopped right after the pending
  transfer (a synchronous disable, TIP.PGD): it went into untraced code
  (``to`` where the trace says, else None), e.g. a syscall into a kernel
  that is not traced.
* ``async_exit(th, frm, time)``: an asynchronous exit to untraced code
  (interrupt, exception, signal delivery) before the instruction at ``frm``.
* ``resume(th, to, time)``: execution came back from untraced code at
  ``to`` (TIP.PGE; a signal handler when a signal was delivered).
* ``transfer(th, to)``: the previous transfer went to ``to`` but what
  follows is not observed (a live window closed there).

With ``kernel_untraced`` (the default; the live stepper never sees the
kernel), a ``syscall``/``int n`` instruction is followed by ``leave`` and
``resume`` implicitly, and the first instruction by a ``resume``, so both
sources give the same records.  A decoded trace sets it False: its
enable/disable events say where tracing stopped and resumed (and with the
OS bit, a syscall goes straight on into the traced kernel).  The records a
``leave``/``async_exit`` and the ``resume`` make are described in
:mod:`hwtrace.branches.records`.
Depth counts calls (+1) and returns (-1); a signal handler (an
``interrupt``, or a ``syscall`` whose kernel exit went elsewhere than its
fall-through) runs one level deeper, and the sigreturn that resumes the
interrupted code restores the depth it had.

* ``close(th)``: the source ended the window (the stepper's return-address
  and stack-pointer match); ``gap(th)``: continuity lost.
* ``snapshot(th)`` at a fork, ``inherit(child, snapshot)`` for the child's
  thread: a process forked inside a window is inside it too.

Finished records accumulate in ``tracker.out`` (a list the source drains).
"""

from __future__ import annotations

from .classify import TO_KERNEL, classify
from .mask import Mask
from .records import Branch
from .triggers import Trigger

_DOWN = frozenset({"call", "indirect_call"})


class ThreadState:
    __slots__ = ("pid", "tid", "on", "depth", "wanted", "pend_pc", "pend_x",
                 "pend_time", "sig", "exit", "exit_at")

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
        # how the thread last left traced code: "start" (nothing traced
        # yet), "syscall"/"interrupt" (that instruction, exit_at = its
        # fall-through), "async" (exit_at = the interrupted IP), another
        # kind (exit_at = its fall-through) or None (unknown)
        self.exit: str | None = "start"
        self.exit_at: int | None = None


_MAX_SIG = 64


class Tracker:
    def __init__(self, trigger: Trigger | None = None, mask: Mask | None = None,
                 kernel_untraced: bool = True):
        self.trigger = trigger or Trigger()
        self.kernel_untraced = kernel_untraced
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
        if th.exit == "start" and self.kernel_untraced:
            self.resume(th, pc, time)         # the first instruction seen
        if th.pend_x is not None:
            if self.kernel_untraced and th.pend_x.kind in TO_KERNEL:
                t = th.pend_time
                self.leave(th, None, t)
                self.resume(th, pc, t)
            else:
                self._resolve(th, pc)
        if pc in self.watch:
            self._check(th, pc)
        if x is not None:
            th.pend_pc = pc
            th.pend_x = x
            th.pend_time = time

    def interrupt(self, th: ThreadState, frm: int, to: int, time=None) -> None:
        """An asynchronous transfer from ``frm`` to ``to`` through untraced
        code: ``async_exit`` then ``resume``."""
        self.async_exit(th, frm, time)
        self.resume(th, to, time)

    def leave(self, th: ThreadState, to: int | None = None, time=None) -> None:
        """Tracing stopped after the pending transfer: its record goes to
        ``to`` (None: unknown); remembered for the kind of the resume."""
        x = th.pend_x
        if x is None:
            if th.exit != "start":
                th.exit = None
            return
        frm = th.pend_pc
        th.pend_x = None
        kind = classify(x, frm, to if to is not None else -1)
        th.exit = kind
        th.exit_at = frm + x.size
        if th.on and kind is not None:
            self._taken(th, kind, frm, to)

    def async_exit(self, th: ThreadState, frm: int, time=None) -> None:
        if th.pend_x is not None:
            self._resolve(th, frm)
        th.exit = "async"
        th.exit_at = frm
        if th.on and th.wanted and self.mask.accepts("interrupt", frm):
            self.out.append(Branch(th.pid, th.tid, "interrupt", frm, None, time, th.depth))

    def resume(self, th: ThreadState, to: int, time=None, handlers: bool = True) -> None:
        """Back from untraced code at ``to``.  ``handlers``: a resume
        elsewhere than where the thread left is a signal handler (or a
        sigreturn); False where it may be another thread (per-CPU)."""
        if th.pend_x is not None:
            self.leave(th, None, time)
        ex, at = th.exit, th.exit_at
        th.exit = None
        if ex == "start" or (ex == "syscall" and to == at):
            kind = "sysret"
        elif ex in _DOWN and to == at:
            kind = "return"       # back from a callee outside the traced ranges
        else:
            kind = "iret"
        if not th.on:
            return
        if kind == "return":
            th.depth -= 1
        if handlers and ex in ("syscall", "interrupt", "async") and to != at:
            sig = th.sig
            if sig and sig[-1][0] == to:          # sigreturn to where it hit
                th.depth = sig.pop()[1]
            elif ex == "syscall" and sig and th.depth == sig[-1][1]:
                # the innermost handler returned to its trampoline (the
                # depth it interrupted), whose only syscall is rt_sigreturn:
                # a signal pending there is delivered on the way out, and
                # its handler returns where the first one would have
                th.depth = sig[-1][1] + 1
            else:                                 # a handler, entered on the way back
                self._enter_handler(th, at)
        if th.wanted and self.mask.accepts(kind, None, to):
            self.out.append(Branch(th.pid, th.tid, kind, None, to, time, th.depth))

    def transfer(self, th: ThreadState, to: int) -> None:
        if th.pend_x is not None:
            self._resolve(th, to)

    def close(self, th: ThreadState) -> None:
        th.pend_x = None
        th.on = False
        th.depth = 0
        th.sig.clear()

    def exec_(self, th: ThreadState) -> None:
        """The thread's process ran execve: what it traced next is the
        kernel's return from it (a ``sysret``); depth starts afresh."""
        if th.pend_x is not None:
            self.leave(th)
        th.exit = "start"
        th.depth = 0
        th.sig.clear()

    def snapshot(self, th: ThreadState) -> tuple:
        """The window state a fork would hand on (at the fork syscall)."""
        return th.on, th.depth, tuple(th.sig)

    def inherit(self, child: ThreadState, snap: tuple) -> None:
        """``child`` is a forked process's thread: it starts where its parent
        was (inside the same activations), in the window state of
        :meth:`snapshot`; its first record is the kernel's return (sysret)."""
        child.on, child.depth, sig = snap
        child.sig = list(sig)
        child.pend_x = None
        child.exit = "start"

    def gap(self, th: ThreadState) -> None:
        th.pend_x = None
        if th.exit != "start":
            th.exit = None

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
        if kind is not None:
            self._taken(th, kind, frm, to)

    def _taken(self, th: ThreadState, kind: str, frm: int, to: int | None) -> None:
        """The pending transfer (inside the window) is a ``kind`` to ``to``:
        its record, and the call depth it leaves (a return at depth 0 of a
        ``within`` window closes it).  A syscall/int observed going straight
        on (into a traced kernel) keeps the depth; one into untraced code
        comes back via resume()."""
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

    @staticmethod
    def _enter_handler(th: ThreadState, resume: int) -> None:
        """A signal handler runs one level deeper than the code it
        interrupted, until the sigreturn that resumes at ``resume``."""
        if len(th.sig) >= _MAX_SIG:
            del th.sig[0]
        th.sig.append((resume, th.depth))
        th.depth += 1
