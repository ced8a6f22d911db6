"""The records the call-stack reconstruction emits (small, immutable).

Times are in the stream's clock unit (see :class:`hwtrace.analysis.clock.Clock`):
nanoseconds when the TSC frequency is known, raw TSC ticks when it is not,
and instruction counts when the trace has no timing.  Instruction indices
count the instructions of one stream from 0; an activation spans
``[begin_idx, end_idx)``.
"""

# No ``from __future__ import annotations``: NamedTuple compiles a string
# annotation as a forward reference, ~30 of them at the start-up of every
# command that opens a bundle (hwtrace.streams makes a StreamInfo).
from enum import IntFlag
from typing import NamedTuple


class Flag(IntFlag):
    """Why an activation's boundaries are what they are."""

    NONE = 0
    #: the activation began before the trace (or the trace segment) did:
    #: it was synthesized when its code was first seen; ``begin`` is the
    #: segment start, not the real call
    BEGIN_UNKNOWN = 1
    #: closed at a trace gap (overflow, decode error, disabled region) or at
    #: the end of the trace: its real end is unknown
    TRUNCATED = 2
    #: popped by a return that matched a frame further down the stack
    #: (longjmp, exception unwinding, a lost return)
    UNWOUND = 4
    #: entered by a jump to a function start (tail call)
    TAIL_CALL = 8
    #: entered by a far transfer (syscall, software interrupt, far call)
    FAR = 16
    #: entered by an asynchronous branch (interrupt, exception)
    ASYNC = 32
    #: opened inside a TSX transaction that aborted
    ABORTED = 64
    #: left by a return whose target matched no frame (stack switch,
    #: overwritten return address)
    BAD_RETURN = 128
    #: the slice ends because its thread was switched out of this CPU (a
    #: CPU's stream following context switches): the activation goes on
    #: in a later slice, here or in another CPU's stream
    SWITCHED_OUT = 256
    #: the slice goes on with an activation begun in an earlier slice of
    #: this CPU's stream, before its thread was switched out (not a call)
    SWITCHED_IN = 512
    #: cut at the edge of the window a view was asked for (``--insns``,
    #: ``--time``): the activation goes on outside it
    CLIPPED = 1024


class StreamInfo(NamedTuple):
    """Who a stream belongs to: a thread (pid/tid) or a CPU (cpu mode).

    ``switches``: for a CPU's stream, the recording's context switches
    (``hwtrace.bundle.Switch`` records, or anything with their ``cpu``,
    ``time``, ``prev_tid`` and ``next_tid``; any CPU's: the builder takes
    its own), so its call stacks follow the threads (empty: unknown).
    ``tsc_per_insn``: the TSC ticks per traced instruction when the clock
    counts instructions (an emulated recording: 1, see
    :func:`hwtrace.bundle.tsc_per_insn`); None: measured as it goes.
    ``clock_exact``: that clock counts exactly the traced instructions and
    only TSC packets tell it, so the time at every instruction is known
    (:func:`hwtrace.bundle.insn_clock_exact`).  ``clock_counted``: that
    clock counts exactly the traced instructions, MTC or CYC packets
    perhaps telling it too (:func:`hwtrace.bundle.insn_clock_counted`).
    ``programs``: what each process ran, for naming its tracks and threads."""

    pid: int | None = None
    tid: int | None = None
    cpu: int | None = None
    name: str | None = None
    switches: tuple = ()
    tsc_per_insn: float | None = None
    clock_exact: bool = False
    clock_counted: bool = False
    #: (pid, program name) pairs: what each process of the recording ran
    #: (the file it last exec'd, else its command name); empty: unknown
    programs: tuple = ()
    #: (tid, creator's tid) pairs: who made each thread (or forked each
    #: process) of the recording, for a CPU's stream: a thread's first
    #: run resumes where its creator left off (both return from ``clone``
    #: or ``fork``); empty: unknown
    creators: tuple = ()
    #: (tid, time) pairs: when each thread of the recording ended, by the
    #: sideband's exit records, for a CPU's stream (a thread's last run
    #: may end there with no context switch out of it); empty: unknown
    exits: tuple = ()

    def program(self, pid: int | None) -> str:
        """The name of the program process ``pid`` ran ("" unknown)."""
        for p, name in self.programs:
            if p == pid:
                return name
        return ""

    def label(self) -> str:
        if self.name:
            return self.name
        if self.tid is not None:
            return f"thread {self.tid}"
        if self.cpu is not None:
            return f"cpu {self.cpu}"
        return "trace"


class Enter(NamedTuple):
    """A function activation begins (emitted in execution order)."""

    func: int | None        # function start address (None: unknown code)
    name: str
    depth: int              # 0 = bottom of the reconstructed stack
    begin: float            # time
    begin_idx: int          # instruction index of its first instruction
    flags: Flag
    tid: int | None = None


class Activation(NamedTuple):
    """A function activation ended: one slice of the timeline."""

    func: int | None
    name: str
    depth: int
    begin: float
    end: float
    begin_idx: int
    end_idx: int
    child_insns: int        # instructions executed in callees
    child_time: float       # time spent in callees
    flags: Flag
    tid: int | None = None

    @property
    def insns(self) -> int:
        return self.end_idx - self.begin_idx

    @property
    def self_insns(self) -> int:
        return self.end_idx - self.begin_idx - self.child_insns

    @property
    def duration(self) -> float:
        return self.end - self.begin

    @property
    def self_time(self) -> float:
        return self.end - self.begin - self.child_time


class Marker(NamedTuple):
    """Something happened at one point of the stream: a gap, an overflow, a
    decode error, tracing disabled/enabled.  ``kind`` is one of
    ``overflow``, ``error``, ``disabled``, ``gap``, ``end``, ``lost``."""

    kind: str
    time: float
    idx: int
    offset: int | None
    detail: str
    tid: int | None = None


#: marker kinds that mean data was lost (frames were closed there; "lost":
#: the recorder said so -- a buffer that filled or wrapped)
LOSS_KINDS = frozenset({"overflow", "error", "gap", "lost"})
