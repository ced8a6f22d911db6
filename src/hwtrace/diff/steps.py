"""One thread's flow as *steps*: the unit ``hwtrace diff`` compares.

A step is a straight run of instructions that starts where control
arrived (a branch target, the first instruction after a gap) and ends
with the first branch (or where the flow is cut: a gap, the end of the
trace).  Decoded batches (``view=True``: every branch ends a record) are
almost that already; a record may also end without a branch where the
decoder stopped for an event (a PSB, a disable/enable that resumes at
the next instruction), and where such events fall depends on the trace's
bytes, not on the program, so two runs that did the same thing can cut
the same code into records differently.  Records that end without a
branch and are followed by the next instruction (no data lost between)
are therefore joined into one step.  Two runs took the same path exactly
as long as their steps are equal, so comparing runs is comparing step
arrays with numpy, chunk by chunk.

Each step (:data:`STEP`) carries its first and last instruction's
addresses (``rip``/``rend`` as recorded; ``ip``/``end`` translated into
the other run's address space, see :mod:`.relocate`), the instruction
index of its first instruction in the thread (``idx``), the trace offset
of its first record (``off``), its instruction count, the class and size
of its last instruction, whether data was lost right before it (``gap``),
the call depth it runs at (relative to where the trace starts) and what
it does to that depth (``delta``: +1 a call, -1 a return).

A call is a CALL (or a far call, such as a syscall into a traced
kernel) whose next step does not start at its fall-through (``call 1f;
1: pop`` is not a call, nor is a syscall that comes back to the next
instruction with the kernel untraced); a return is a RETURN or FAR_RETURN.

No I/O: :class:`StepReader` takes any iterable of
:class:`hwtrace.flow.batches.Batch` es.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

from hwtrace.flow.batches import ErrorItem, StatusItem
from hwtrace.x86.insn import IClass

STEP = np.dtype([("ip", "<u8"), ("end", "<u8"), ("rip", "<u8"),
                 ("rend", "<u8"), ("idx", "<u8"), ("off", "<u8"),
                 ("n", "<u4"), ("depth", "<i4"), ("cls", "u1"),
                 ("size", "u1"), ("gap", "u1"), ("delta", "i1")])

OTHER = int(IClass.OTHER)
PTWRITE = int(IClass.PTWRITE)
CALL = int(IClass.CALL)
FAR_CALL = int(IClass.FAR_CALL)
RETURN = int(IClass.RETURN)
FAR_RETURN = int(IClass.FAR_RETURN)

#: events after which the flow is not known to go on from where it stood
GAP_EVENTS = frozenset({"overflow"})


def is_gap(item) -> bool:
    """Was data lost here (a decode error, an overflow, a resync)?"""
    if isinstance(item, ErrorItem):
        return True
    if isinstance(item, StatusItem):
        return item.name == "resynced"
    return getattr(item, "type", None) in GAP_EVENTS


class StepReader:
    """Steps of one thread's batches, in chunks (numpy arrays of
    :data:`STEP`).

    ``translate(addresses) -> addresses`` maps this run's code addresses
    into the other run's space (default: as they are).  ``taps`` are
    called with every chunk as it is read (coverage counters); the last
    step of a batch is held back until the next batch says whether it
    goes on (a chunk never ends in a step that might still grow)."""

    def __init__(self, batches: Iterable, translate: Callable | None = None,
                 taps=()):
        self._batches = iter(batches)
        self._translate = translate
        self._taps = list(taps)
        self._carry = np.zeros(0, _REC)     # records of the open step
        self._carry_gap = False             # a gap before the next record
        self.insns = 0                      # index of the next step's first insn
        self.depth = 0                      # depth of the next step
        self.gaps = 0                       # gaps seen
        self.last_stop = None               # (event, address) of the last
                                            # disable, error or overflow
        self.done = False

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while not self.done:
            try:
                b = next(self._batches)
            except StopIteration:
                self.done = True
                out = self._steps(self._carry, self._carry["gapb"],
                                  final=True)
                self._carry = np.zeros(0, _REC)
                if len(out):
                    return self._tap(out)
                break
            out = self._feed(b)
            if len(out):
                return self._tap(out)
        raise StopIteration

    # -- internals -----------------------------------------------------------

    def _tap(self, steps: np.ndarray) -> np.ndarray:
        for t in self._taps:
            t(steps)
        return steps

    def _feed(self, batch) -> np.ndarray:
        blocks = batch.blocks
        nc = len(self._carry)
        recs = np.empty(nc + len(blocks), _REC)
        if nc:
            recs[:nc] = self._carry
        for f in _REC.names[:-1]:
            recs[f][nc:] = blocks[f]
        gap = np.zeros(len(recs), bool)
        if nc:
            gap[:nc] = self._carry["gapb"]
        pending = False
        if self._carry_gap:
            if nc < len(recs):
                gap[nc] = True
            else:
                pending = True
        for index, _offset, item in batch.items:
            stop = _stop(item)
            if stop is not None:
                self.last_stop = stop
            if is_gap(item):
                self.gaps += 1
                k = nc + index
                if k < len(recs):
                    gap[k] = True
                else:
                    pending = True
        self._carry_gap = pending
        recs["gapb"] = gap
        return self._steps(recs, gap, final=False)

    def _steps(self, recs: np.ndarray, gap: np.ndarray, final: bool) -> np.ndarray:
        """Group ``recs`` into steps; keep the open one (unless ``final``)."""
        n = len(recs)
        if n == 0:
            return np.zeros(0, STEP)
        ip = recs["ip"]
        end = recs["end_ip"]
        cls = recs["iclass"]
        # record i ends a step when its last instruction is a branch, or
        # the next record does not follow on, or data was lost before it
        ends = np.empty(n, bool)
        plain = (cls == OTHER) | (cls == PTWRITE)
        if n > 1:
            follows = ip[1:] == end[:-1] + recs["size"][:-1]
            ends[:-1] = ~plain[:-1] | ~follows | gap[1:]
        ends[-1] = True
        last = np.flatnonzero(ends)
        if not final:
            keep = last[:-1]            # the last record's step may go on
            cut = int(keep[-1]) + 1 if len(keep) else 0
            self._carry = recs[cut:].copy()
            last = keep
        if not len(last):
            return np.zeros(0, STEP)
        first = np.empty(len(last), np.intp)
        first[0] = 0
        first[1:] = last[:-1] + 1
        out = np.empty(len(last), STEP)
        out["rip"] = ip[first]
        out["rend"] = end[last]
        counts = np.add.reduceat(
            recs["ninsn"][:int(last[-1]) + 1].astype(np.uint64), first)
        out["n"] = counts
        csum = np.cumsum(counts)
        out["idx"] = self.insns + csum - counts
        self.insns += int(csum[-1])
        out["off"] = recs["offset"][first]
        c = cls[last]
        out["cls"] = c
        sz = recs["size"][last]
        out["size"] = sz
        out["gap"] = gap[first]
        # the next step's first address: the one after, or the open step's
        nxt = np.empty(len(last), np.uint64)
        nxt[:-1] = out["rip"][1:]
        has_next = np.ones(len(last), bool)
        if final:
            has_next[-1] = False
            nxt[-1] = 0
        else:
            nxt[-1] = self._carry["ip"][0]
        fall = out["rend"] + sz
        calls = ((c == CALL) | (c == FAR_CALL)) & (nxt != fall) & has_next
        rets = (c == RETURN) | (c == FAR_RETURN)
        delta = calls.astype(np.int8) - rets.astype(np.int8)
        out["delta"] = delta
        dsum = np.cumsum(delta, dtype=np.int64)
        out["depth"] = self.depth + dsum - delta
        self.depth += int(dsum[-1])
        if self._translate is not None:
            out["ip"] = self._translate(out["rip"])
            out["end"] = self._translate(out["rend"])
        else:
            out["ip"] = out["rip"]
            out["end"] = out["rend"]
        return out


def _stop(item):
    """(what, address) if ``item`` stops the flow (tracing disabled, data
    lost), else None."""
    if isinstance(item, ErrorItem):
        return (item.kind, item.ip)
    t = getattr(item, "type", None)
    if t == "async_disabled":
        return (t, item.at)
    if t in ("disabled", "overflow") and not item.status_update:
        return (t, None if item.ip_suppressed else item.ip)
    return None


# a batch record plus the gap flag (carried with the open step)
_REC = np.dtype([("ip", "<u8"), ("end_ip", "<u8"), ("offset", "<u8"),
                 ("ninsn", "<u4"), ("iclass", "u1"), ("size", "u1"),
                 ("gapb", "?")])


def read_all(batches: Iterable, translate: Callable | None = None) -> np.ndarray:
    """Every step of ``batches`` in one array (tests, small traces)."""
    chunks = list(StepReader(batches, translate))
    return np.concatenate(chunks) if chunks else np.zeros(0, STEP)
