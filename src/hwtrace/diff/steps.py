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
it does to that depth (``delta``: +1 a call, -1 a return), and whether it
is the first step of a program its process exec'd (``exec``: the frames
open before never return; the batches' :class:`SpaceItem` s say so).

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

from hwtrace.flow.batches import ErrorItem, SpaceItem, StatusItem
from hwtrace.flow.events import Event
from hwtrace.x86.insn import IClass

#: a step; ``ip``, ``end`` and the word of ``n``/``gap``/``cls``/``size``
#: come first: these three 64-bit words are what is compared (KEY_WORDS)
_FIELDS = [("ip", "<u8"), ("end", "<u8"), ("n", "<u4"), ("gap", "u1"),
           ("cls", "u1"), ("size", "u1"), ("_pad", "u1"),   # zero: compared
           ("rip", "<u8"), ("rend", "<u8"), ("idx", "<u8"),
           ("off", "<u8"), ("depth", "<i4"), ("delta", "i1"), ("exec", "u1")]
STEP = np.dtype({"names": [n for n, _ in _FIELDS],
                 "formats": [f for _, f in _FIELDS],
                 "offsets": [0, 8, 16, 20, 21, 22, 23, 24, 32, 40, 48, 56, 60, 61],
                 "itemsize": 64})
KEY_WORDS = 3
assert STEP.itemsize == 64

OTHER = int(IClass.OTHER)
PTWRITE = int(IClass.PTWRITE)
CALL = int(IClass.CALL)
FAR_CALL = int(IClass.FAR_CALL)
RETURN = int(IClass.RETURN)
FAR_RETURN = int(IClass.FAR_RETURN)

# per instruction class: 1 ends no step (plain), 2 a call, 3 a return
_KIND = np.zeros(256, np.int8)
_KIND[[OTHER, PTWRITE]] = 1
_KIND[[CALL, FAR_CALL]] = 2
_KIND[[RETURN, FAR_RETURN]] = 3

#: events after which the flow is not known to go on from where it stood
#: (``lost``: a CPU stream ended and the thread went on in another,
#: :class:`hwtrace.diff.cpumerge.LostItem`)
GAP_EVENTS = frozenset({"overflow", "lost"})


def is_gap(item) -> bool:
    """Was data lost here (a decode error, an overflow, a resync, the
    end of a CPU stream the flow went on from)?"""
    if isinstance(item, ErrorItem):
        return True
    if isinstance(item, StatusItem):
        return item.name == "resynced"
    return getattr(item, "type", None) in GAP_EVENTS


class _Open:
    """The step still open at the end of a batch (its last record may
    be followed by the next instruction in the next batch)."""

    __slots__ = ("ip", "off", "n", "gap", "end", "cls", "size", "exec")

    def __init__(self, ip, off, n, gap, end, cls, size, exec_=False):
        self.ip, self.off, self.n, self.gap = ip, off, n, gap
        self.end, self.cls, self.size = end, cls, size
        self.exec = exec_

    def goes_on(self, ip: int, gap: bool) -> bool:
        return _KIND[self.cls] == 1 and not gap and ip == self.end + self.size


class StepReader:
    """Steps of one thread's batches, in chunks (numpy arrays of
    :data:`STEP`).

    ``translate(addresses) -> addresses`` maps this run's code addresses
    into the other run's space (default: as they are).  ``taps`` are
    called with every chunk as it is read (coverage counters).  The
    records of the last step of a batch are held back until the next
    batch says whether it goes on, so a chunk never ends in a step that
    might still grow, and no batch is ever copied whole."""

    def __init__(self, batches: Iterable, translate: Callable | None = None,
                 taps=()):
        self._batches = iter(batches)
        self._translate = translate
        self._taps = list(taps)
        self._open: _Open | None = None
        self._gap_next = False              # a gap before the next record
        self._exec_next = False             # an exec before the next record
        self._exe: dict = {}                # pid -> the file its space runs
        self._ready: list = []              # chunks made, not yet handed out
        self.insns = 0                      # index of the next step's first insn
        self.depth = 0                      # depth of the next step
        self.gaps = 0                       # gaps seen
        self.last_stop = None               # (event, address) of the last
                                            # disable, error or overflow
        self.done = False

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while not self._ready:
            if self.done:
                raise StopIteration
            try:
                b = next(self._batches)
            except StopIteration:
                self.done = True
                o, self._open = self._open, None
                if o is not None:
                    self._emit(self._one(o, None))
                continue
            self._feed(b)
        out = self._ready.pop(0)
        for t in self._taps:
            t(out)
        return out

    # -- internals -----------------------------------------------------------

    def _emit(self, out: np.ndarray) -> None:
        """Finish ``out`` (depth, translation) and queue it."""
        if not len(out):
            return
        d = out["delta"]
        dsum = np.cumsum(d, dtype=np.int64)
        out["depth"] = self.depth + dsum - d
        self.depth += int(dsum[-1])
        if self._translate is not None:
            out["ip"] = self._translate(out["rip"])
            out["end"] = self._translate(out["rend"])
        else:
            out["ip"] = out["rip"]
            out["end"] = out["rend"]
        self._ready.append(out)

    def _one(self, o: _Open, nxt: int | None) -> np.ndarray:
        """The open step alone (its next step starts at ``nxt``)."""
        out = np.zeros(1, STEP)
        r = out[0]
        r["rip"], r["rend"], r["n"], r["off"] = o.ip, o.end, o.n, o.off
        r["cls"], r["size"], r["gap"], r["idx"] = o.cls, o.size, o.gap, self.insns
        r["exec"] = o.exec
        k = _KIND[o.cls]
        r["delta"] = -1 if k == 3 else \
            1 if k == 2 and nxt is not None and nxt != o.end + o.size else 0
        self.insns += o.n
        return out

    def _execs(self, item) -> bool:
        """Does this address-space switch begin another program in the
        same process (an exec)?"""
        sp = item.space
        pid, exe = getattr(sp, "pid", None), getattr(sp, "exe", None)
        last = self._exe.get(pid)
        self._exe[pid] = exe
        return pid is not None and bool(last) and bool(exe) and last != exe

    def _feed(self, batch) -> None:
        blocks = batch.blocks
        n = len(blocks)
        pending, self._gap_next = self._gap_next, False
        epending, self._exec_next = self._exec_next, False
        gapat = None
        execat = None
        stopper = None                      # the last item that stops the flow
        at = -1                             # ... its place in the items
        gaps = []                           # the records data was lost before
        E = Event
        for k, (index, _offset, item) in enumerate(batch.items):
            if type(item) is E:
                # (most are a system call's disable and enable: a CPU
                # stream of ``dd bs=1`` has ~40,000 a batch)
                t = item.type
                if t == "disabled":
                    if not item.status_update:
                        stopper, at = item, k
                    continue
                if t != "async_disabled" and t not in GAP_EVENTS:
                    continue
            elif isinstance(item, SpaceItem):
                if self._execs(item):
                    if index >= n:
                        self._exec_next = True
                    else:
                        if execat is None:
                            execat = np.zeros(n, bool)
                        execat[index] = True
                continue
            if _stop(item) is not None:
                stopper, at = item, k
            if is_gap(item):
                gaps.append(index)
        rows = batch.plain
        if rows is not None and len(rows):
            stopper = _rows(batch.items, rows, stopper, at, gaps)
        for index in gaps:
            self.gaps += 1
            if index >= n:                  # before the next batch's first
                self._gap_next = True
                continue
            if gapat is None:
                gapat = np.zeros(n, bool)
            gapat[index] = True
        if stopper is not None:
            self.last_stop = _stop(stopper)
        if n == 0:
            self._gap_next |= pending
            self._exec_next |= epending
            return
        if pending:
            if gapat is None:
                gapat = np.zeros(n, bool)
            gapat[0] = True
        if epending:
            if execat is None:
                execat = np.zeros(n, bool)
            execat[0] = True
        ip = blocks["ip"]
        end = blocks["end_ip"]
        size = blocks["size"]
        cls = blocks["iclass"]
        o = self._open
        cont = o is not None and o.goes_on(int(ip[0]), bool(
            (gapat is not None and gapat[0]) or (execat is not None and execat[0])))
        if o is not None and not cont:
            self._emit(self._one(o, int(ip[0])))
        # which records end a step (the last one: not known yet)
        plain = _KIND[cls[:-1]] == 1
        if gapat is None and execat is None and not plain.any():
            last = np.arange(n - 1)
        else:
            ends = ~plain | (ip[1:] != end[:-1] + size[:-1])
            if gapat is not None:
                ends |= gapat[1:]
            if execat is not None:
                ends |= execat[1:]
            last = np.flatnonzero(ends)
        k = len(last)
        if k:
            first = np.empty(k, np.intp)
            first[0] = 0
            first[1:] = last[:-1] + 1
            out = np.empty(k, STEP)
            out["_pad"] = 0                     # in a compared word
            if gapat is None:
                out["gap"] = 0
            out["exec"] = 0
            if k == n - 1:                      # one record per step
                out["rip"] = ip[:-1]
                out["rend"] = end[:-1]
                counts = blocks["ninsn"][:-1].astype(np.uint64)
                out["off"] = blocks["offset"][:-1]
                c, sz = cls[:-1], size[:-1]
                if gapat is not None:
                    out["gap"] = gapat[:-1]
                if execat is not None:
                    out["exec"] = execat[:-1]
            else:
                out["rip"] = ip[first]
                out["rend"] = end[last]
                counts = np.add.reduceat(
                    blocks["ninsn"][:int(last[-1]) + 1].astype(np.uint64), first)
                out["off"] = blocks["offset"][first]
                c, sz = cls[last], size[last]
                if gapat is not None:
                    out["gap"] = gapat[first]
                if execat is not None:
                    out["exec"] = execat[first]
            if cont:
                out["rip"][0] = o.ip
                out["off"][0] = o.off
                out["gap"][0] = o.gap
                out["exec"][0] = o.exec
                counts[0] += o.n
            out["n"] = counts
            out["cls"] = c
            out["size"] = sz
            csum = np.cumsum(counts)
            out["idx"] = self.insns + csum - counts
            self.insns += int(csum[-1])
            nxt = np.empty(k, np.uint64)
            nxt[:-1] = out["rip"][1:]
            nxt[-1] = ip[int(last[-1]) + 1]
            kind = _KIND[c]
            delta = (kind == 2) & (nxt != out["rend"] + sz)
            out["delta"] = delta.astype(np.int8) - (kind == 3).astype(np.int8)
            self._emit(out)
            start = int(last[-1]) + 1
            self._open = _Open(int(ip[start]), int(blocks["offset"][start]),
                               int(blocks["ninsn"][start:].sum()),
                               bool(gapat is not None and gapat[start]),
                               int(end[-1]), int(cls[-1]), int(size[-1]),
                               bool(execat is not None and execat[start]))
        elif cont:
            o.n += int(blocks["ninsn"].sum())
            o.end, o.cls, o.size = int(end[-1]), int(cls[-1]), int(size[-1])
        else:
            self._open = _Open(int(ip[0]), int(blocks["offset"][0]),
                               int(blocks["ninsn"].sum()),
                               bool(gapat is not None and gapat[0]),
                               int(end[-1]), int(cls[-1]), int(size[-1]),
                               bool(execat is not None and execat[0]))


def _rows(items: list, rows: np.ndarray, stopper, at: int, gaps: list):
    """What a batch's plain rows (:mod:`hwtrace.flow.plain`) tell the
    reader: the last item or row (made an Event) that stops the flow, of
    those and ``stopper`` (item ``at``), the last of the items that do;
    the record indices of the rows that lose data go into ``gaps`` (a
    set of records: their order with the items' does not matter)."""
    from hwtrace.flow import plain
    typ = rows["type"]
    su = (rows["flags"] & plain.PF_STATUS_UPDATE) != 0
    over = typ == plain.TYPE["overflow"]
    gaps.extend(rows["index"][over].tolist())
    stops = np.flatnonzero(((typ == plain.DISABLED) | over) & ~su)
    if len(stops):
        last = int(stops[-1])
        # the later of the two in the batch's one order
        if stopper is None or \
                rows["pos"][last] > plain.item_positions(len(items), rows)[at]:
            stopper = plain.event(rows[last].tolist())
    return stopper


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


def concat(parts: list) -> np.ndarray:
    """Step arrays end to end, as :data:`STEP` (``np.concatenate`` would
    pack the records and lose the layout the comparison reads words of)."""
    out = np.empty(sum(len(p) for p in parts), STEP)
    at = 0
    for p in parts:
        out[at:at + len(p)] = p
        at += len(p)
    return out


def read_all(batches: Iterable, translate: Callable | None = None) -> np.ndarray:
    """Every step of ``batches`` in one array (tests, small traces)."""
    return concat(list(StepReader(batches, translate)))
