"""Branch records from a decoded trace: a bundle or a raw ``.pt`` stream
(decoded into batches through :mod:`hwtrace.streams`), or a ``.jsonl`` file
of flow items (``ptoracle insn`` / ``hwtrace decode --format jsonl``
lines) with ``--elf`` images.

Batches (every branch ending a record) give each transfer at once: record
``r``'s last instruction went to record ``r + 1``'s first.  The runs of
records between events are turned into records with numpy -- kind from
the instruction class (``INDIRECT`` says call vs indirect call; a far
transfer's bytes say syscall, interrupt, sysret, iret or far), call depth
by a running sum, the mask as array tests.  Everything else goes through
the shared :class:`~hwtrace.branches.tracker.Tracker`, one transfer at a
time, so the trigger windows, the depth rules and the mask are exactly the
ones a live process gets: the events (tracing disabled and enabled, an
interrupt, an overflow, a decode error), the records where a trigger
address executes, and the transfer pending across them.

Where tracing stops and starts again (TIP.PGD / TIP.PGE, and the
asynchronous FUP+TIP.PGD of an interrupt into an untraced kernel), the
records have a None end (see :mod:`.records`): a synchronous disable
ends the pending transfer with ``to`` None (a ``syscall``), an
asynchronous one is an ``interrupt`` from the interrupted IP, and each
enable is a ``sysret``/``iret`` from None to its IP.  Status updates
(a PSB+ restating the state) are neither exits nor resumes.

Threads: a thread's stream gives its pid/tid to every record.  A CPU's
stream (``record --mode cpu``, perf imports) interleaves threads; the
sideband's context switches say which one runs: at each enable, the
thread switched in last by then (the switch times are on the trace's TSC
clock, the time of the enable estimated from the last timing packet and
the instructions since).  Each thread has its own depth and window state.
Without switches a CPU's records have no pid/tid, and an enable elsewhere
than where tracing stopped may be another thread, so it is not taken for
a signal handler.

    trace = decoded_records("bundle/", TriggerSpec(within="fib"))
    for rec in trace.records(): ...          # Branch objects
    for a in trace.arrays(): ...             # numpy chunks (records.dtype)
"""

from __future__ import annotations

import bisect
import functools
from pathlib import Path
from typing import Iterator

import numpy as np

from hwtrace._unique import unique
from hwtrace.flow.plain import (EVENT_TYPES, PF_HAS_TSC, PF_IP_SUPPRESSED,
                                PF_STATUS_UPDATE, PLAIN)
from hwtrace.x86 import Mode, X86Error, decoder_for
from hwtrace.x86.insn import IClass, Insn, Kind

from . import _impl, resolve
from .classify import classify, is_transfer
from .mask import MaskSpec
from .records import KIND_CODE, Branch, concat, dtype, iter_arrays
from .tracker import Tracker
from .triggers import TriggerSpec


class DecodedError(Exception):
    """The trace cannot be decoded (one line, for the user)."""


class CodeReader:
    """Instruction bytes at runtime addresses, from mapped files (the
    input's ``code``: the same files its decoder read)."""

    def __init__(self):
        self._maps: list[tuple[int, int, str, int]] = []   # (start, end, path, off)
        self._files: dict[str, bytes] = {}
        self._starts: list[int] = []

    def add(self, start: int, size: int, path: str, offset: int) -> None:
        self._maps.append((start, start + size, path, offset))
        self._maps.sort()
        self._starts = [m[0] for m in self._maps]

    def read(self, addr: int, n: int = 15) -> bytes:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return b""
        start, end, path, off = self._maps[i]
        if addr >= end:
            return b""
        data = self._files.get(path)
        if data is None:
            try:
                with open(path, "rb") as f:
                    f.seek(off)
                    data = self._files[path] = b"\0" * off + f.read(end - start)
            except OSError:
                data = self._files[path] = b""
        o = off + addr - start
        return data[o:o + min(n, end - addr)]


_NOT_BRANCH = frozenset({"other", "ptwrite", "unknown", "error"})
_DT = dtype()
_NODEPTH = -(1 << 31)
_CALL, _ICALL, _RET = KIND_CODE["call"], KIND_CODE["indirect_call"], KIND_CODE["return"]
_JUMP, _IJUMP = KIND_CODE["jump"], KIND_CODE["indirect_jump"]
_COND, _NCOND = KIND_CODE["cond"], KIND_CODE["cond_not_taken"]
_KIND_ID = {k: i for i, k in enumerate(KIND_CODE)}
# IClass -> record class: 0 none, 1 call, 2 return, 3 jump, 4 cond, 5 far
_CLS = np.zeros(256, np.int8)
_CLS[[2, 3, 4, 5, 6, 7, 8, 10]] = [1, 2, 3, 4, 5, 5, 5, 3]
# (class << 2 | indirect << 1 | taken) -> record kind (-1 none), and
# whether the kind comes from the instruction's bytes (far transfers,
# indirect jumps): one table look-up per transfer instead of a mask per class
_KLUT = np.full(32, -1, np.int16)
_FARLUT = np.zeros(32, bool)
for _ind in (0, 1):
    for _tk in (0, 1):
        _j = _ind << 1 | _tk
        _KLUT[1 << 2 | _j] = _ICALL if _ind else _CALL
        _KLUT[2 << 2 | _j] = _RET
        _KLUT[3 << 2 | _j] = _IJUMP if _ind else _JUMP
        _KLUT[4 << 2 | _j] = _COND if _tk else _NCOND
        _FARLUT[5 << 2 | _j] = True
        _FARLUT[3 << 2 | _j] = bool(_ind)
del _ind, _tk, _j
_ARANGE = np.arange(1 << 16, dtype=np.int64)
_FARLUT8 = _FARLUT.astype(np.uint8)
_ALL_ALLOWED = np.ones(len(KIND_CODE), np.uint8)
_NO_RANGES = np.zeros(0, np.uint64)
#: records.dtype()'s layout for the compiled core: itemsize, then the
#: offsets of pid, tid, kind, from, to, time, depth
_LAYOUT = (_DT.itemsize,) + tuple(_DT.fields[f][1] for f in
                                  ("pid", "tid", "kind", "from", "to", "time", "depth"))
#: record kind -> depth change (calls +1, returns -1)
_DELTA = np.zeros(len(KIND_CODE), np.int64)
_DELTA[[_CALL, _ICALL]] = 1
_DELTA[_RET] = -1
_SYSCALL = KIND_CODE["syscall"]
#: the compiled round trips' kind codes: (return, syscall, sysret)
_TRIP_CODES = (_RET, _SYSCALL, KIND_CODE["sysret"])
#: the compiled round trips' view of plain rows (hwtrace.flow.plain.PLAIN):
#: itemsize, the offsets of index, tsc, ip, pos, type and flags, the type
#: codes of enabled, disabled, cbr and exec_mode, the flag bits
#: ip_suppressed, status_update and has_tsc
_PLAIN_LAYOUT = (PLAIN.itemsize,) + tuple(
    PLAIN.fields[f][1] for f in ("index", "tsc", "ip", "pos", "type", "flags")) + tuple(
    EVENT_TYPES.index(t) for t in ("enabled", "disabled", "cbr", "exec_mode")) + (
    PF_IP_SUPPRESSED, PF_STATUS_UPDATE, PF_HAS_TSC)
_NO_ROWS = np.zeros(0, PLAIN)


class _Consumer:
    """One stream into the tracker: flow items one at a time
    (``insn(ip, size, iclass)``, ``feed(item)``) or batches
    (:meth:`feed_batch`).  ``follow``: a CPU's context switches
    (:class:`hwtrace.analysis.switches.SwitchTimeline`) to say whose
    records these are."""

    def __init__(self, tracker: Tracker, th, reader: CodeReader, per_cpu: bool = False,
                 follow=None, env=None, born: dict | None = None):
        # the trace's enable/disable events say where tracing stopped and
        # resumed (with the OS bit, a syscall goes on into the kernel)
        tracker.kernel_untraced = False
        self.tracker = tracker
        self.th = th
        self.reader = reader
        #: ``env(space)``: (code reader, Trigger, Mask) of an address space
        #: (a bundle whose programs share addresses); the batches' space
        #: items switch to it
        self.env = env
        self._per_reader: dict = {}
        # a per-CPU stream interleaves threads: tracing disabled and enabled
        # elsewhere may be a context switch, not the same thread going on
        # (unless the switches say which thread it is)
        self.per_cpu = per_cpu and follow is None
        self.follow = follow
        #: tid -> its creator's, for the threads that first run on this
        #: CPU: such a thread begins where its creator left off
        self.born = born or {}
        self.time = None
        self.n = 0
        # is tracing on as far as the events said (None: unknown -- the
        # stream's start, or after an overflow or a decode error)
        self.enabled: bool | None = None
        self._decode = decoder_for(Mode.BIT64)
        self._cache: dict[int, object] = {}
        self._far: dict[int, int] = {}
        self._far_keys = np.zeros(0, np.uint64)     # _far as sorted arrays
        self._far_vals = np.zeros(0, np.int16)
        self.chunks: list = []     # batch path: output in order (arrays, Branch lists)

    def _enter_space(self, space) -> None:
        """The records from here on run ``space``'s code: its files'
        bytes classify the transfers (each reader with its own caches),
        its symbols place the trigger and the mask."""
        reader, trigger, mask = self.env(space)
        if reader is not self.reader:
            self._per_reader[id(self.reader)] = (self.reader, self._cache, self._far,
                                                 self._far_keys, self._far_vals)
            got = self._per_reader.get(id(reader))
            if got is None:
                got = (reader, {}, {}, np.zeros(0, np.uint64), np.zeros(0, np.int16))
            self.reader, self._cache, self._far, self._far_keys, self._far_vals = got
        t = self.tracker
        t.trigger, t.mask, t.watch = trigger, mask, trigger.watch

    def _insn_at(self, ip: int):
        c = self._cache
        if ip in c:
            return c[ip]
        x = None
        code = self.reader.read(ip)
        if code:
            try:
                d = self._decode(code, 0)
                if is_transfer(d):
                    x = d
            except X86Error:
                pass
        c[ip] = x
        return x

    flush_at = 1 << 62
    flush = None
    #: the transfers' core: None (the compiled one where it loaded),
    #: "python" (the twin, _vector's numpy) or "compiled"
    impl: str | None = None

    # -- flow items one at a time ------------------------------------------------------
    def insn(self, ip: int, size: int, iclass) -> None:
        x = None if iclass in _NOT_BRANCH else self._insn_at(ip)
        t = self.tracker
        t.step(self.th, ip, x, self.time)
        if len(t.out) >= self.flush_at:
            self.flush()

    def feed(self, item) -> None:
        if not isinstance(item, dict):
            return
        if "error" in item:
            self.tracker.gap(self.th)
            self.enabled = None
            return
        ev = item.get("event")
        if ev is None:
            if "iclass" in item and "ip" in item:
                self.insn(item["ip"], item.get("size", 0), item["iclass"])
            return
        su = bool(item.get("status_update"))
        self._event(ev, item.get("tsc"), su,
                    None if ev == "disabled" and item.get("ip_suppressed")
                    else item.get("ip"), item.get("at"))

    def _event(self, ev: str, tsc, status_update: bool, ip, at) -> None:
        """An event (ptoracle's ``event`` name): its TSC (None: none),
        whether it is a status update, its IP (a disable's None where
        suppressed) and an async disable's ``at`` -- what :meth:`feed`
        reads of its JSON object, and a batch of its
        :class:`~hwtrace.flow.events.Event` (:meth:`_batch_event`)."""
        if tsc is not None:
            self.time = tsc
            if self.follow is not None:
                self.follow.time(self.n, tsc)
        if self.follow is not None and ev in ("disabled", "async_disabled") \
                and not status_update:
            self.follow.tracing(False)
        th = self.th
        t = self.tracker
        if ev == "async_disabled":
            # interrupted at `at` (user-only trace: the kernel is not traced)
            self.enabled = False
            if at is not None:
                t.async_exit(th, at, self.time)
            else:
                t.gap(th)
        elif ev == "disabled":
            self.enabled = False
            if not status_update:
                # the pending transfer went into untraced code (a syscall
                # into the kernel, or out of the filtered ranges)
                t.leave(th, ip, self.time)
        elif ev == "enabled":
            if status_update and self.enabled:
                # a PSB+ restating where tracing already is (its FUP): no
                # transfer happened -- the pending branch goes on to the
                # next instruction as usual
                return
            self.enabled = True
            # (a status update here follows a gap -- the stream's start,
            # an error, an overflow -- after which who runs is not known)
            if self.follow is not None:
                self.follow.tracing(True)
                self._switch(ip)
                th = self.th
            if ip is None:
                t.gap(th)
            else:
                # per-CPU: tracing turned on again may be another thread
                t.resume(th, ip, self.time, handlers=not self.per_cpu)
        elif ev == "overflow":
            self.enabled = None
            t.gap(th)

    def _batch_event(self, ev) -> None:
        """:meth:`feed` of ``event_json(ev)`` (what it reads of it), from
        the Event itself: no JSON object per event (a system call makes
        two)."""
        t = ev.type
        self._event(t, ev.tsc if ev.has_tsc else None, bool(ev.status_update),
                    (None if ev.ip_suppressed else ev.get("ip", 0)) if t == "disabled"
                    else ev.get("ip", 0) if t == "enabled" else None,
                    ev.get("at", 0) if t == "async_disabled" else None)

    def _row_event(self, t: str, tsc: int, ip: int, flags: int) -> None:
        """:meth:`_batch_event` of a plain row (its type name, tsc, ip and
        flags): the Event the row tells, read without making it (a row
        has no ``at``: 0)."""
        self._event(t, tsc if flags & PF_HAS_TSC else None,
                    bool(flags & PF_STATUS_UPDATE),
                    (None if flags & PF_IP_SUPPRESSED else ip) if t == "disabled"
                    else ip if t == "enabled" else None,
                    0 if t == "async_disabled" else None)

    def _switch(self, ip: int | None) -> None:
        """Tracing resumes in a CPU's stream at ``ip``: the thread the
        sideband says runs now, chosen as for the call-stack builder
        (:meth:`hwtrace.analysis.switches.SwitchTimeline.resumes`); here a
        thread fits ``ip`` when it left off right there (an interrupted
        or syscalling thread resumes where it stopped)."""
        tl = self.follow
        cur = self.th
        ctid = cur.tid if cur is not None else None
        cpid = cur.pid if cur is not None else None
        threads = self.tracker._threads

        def left_off(th) -> bool:
            return th is not None and ip is not None and th.exit_at == ip and \
                th.exit in ("async", "syscall", "interrupt")

        def stopped(pid, tid) -> bool:
            th = cur if (pid, tid) == (cpid, ctid) else threads.get((pid, tid))
            if th is None and tid in self.born:
                # not run yet: it begins where its creator left off (both
                # return from clone or fork)
                c = self.born[tid]
                th = cur if ctid == c else next(
                    (t for t in threads.values() if t.tid == c), None)
            return left_off(th)

        pid, tid = tl.resumes(self.n, cur is not None, cpid, ctid, stopped)
        if cur is None or (cur.pid, cur.tid) != (pid, tid):
            if cur is not None and cur.pend_x is not None:
                self.tracker.leave(cur, None, self.time)
            self.th = self.tracker.thread(pid, tid)

    # -- batches -----------------------------------------------------------------------------
    def _out(self) -> None:
        """Records the tracker made one at a time, into the output (the
        list itself: made into records by :meth:`take`, all at once --
        a system call makes two, between two runs of records)."""
        out = self.tracker.out
        if out:
            self.chunks.append(out)
            self.tracker.out = []

    def take(self) -> list[np.ndarray]:
        """The records so far, as one array (or none)."""
        self._out()
        c, self.chunks = self.chunks, []
        lists = [ch for ch in c if type(ch) is list]
        if lists:
            made = list(iter_arrays([b for ch in lists for b in ch]))
            made = made[0] if len(made) == 1 else concat(made)
            at = 0
            for i, ch in enumerate(c):
                if type(ch) is list:
                    c[i] = made[at:at + len(ch)]
                    at += len(ch)
        if len(c) > 1:
            c = [concat(c)]
        return c

    def feed_batch(self, batch) -> None:
        """A batch's records, items and plain rows (``Batch.plain``,
        :mod:`hwtrace.flow.plain`: the events a row tells exactly) in
        their one order: row ``kr`` is the next place where its ``pos``
        says so, else item ``k``."""
        blocks = batch.blocks
        m = len(blocks)
        first = int(batch.first_insn)
        if m:
            a = _Rec(blocks, first)
        r = 0
        items = batch.items
        rows = getattr(batch, "plain", None)
        if rows is None or not len(rows):
            rows, pos = _NO_ROWS, ()
        else:
            pos = rows["pos"].tolist()
        k, nitems = 0, len(items)
        kr, nrows = 0, len(pos)
        places = nitems + nrows
        core = _impl.core_for(self.impl) if m else None
        while k + kr < places:
            if kr < nrows and pos[kr] == k + kr:
                # (index, offset, tsc, ip, ratio, pos, type, flags, ...)
                index, _o, tsc, ip, _ra, _p, typ, flags = rows[kr].item()[:8]
                kr += 1
                item = None
                t = EVENT_TYPES[typ]
            else:
                index, offset, item = items[k]
                k += 1
                t = getattr(item, "type", None)
            if index > r:
                self._records(a, r, index)
                r = index
            self.n = first if not m else int(a.start[r])
            if item is None:
                self._row_event(t, tsc, ip, flags)
            elif t == "error" and hasattr(item, "code"):
                self.feed({"error": str(item.code), "offset": item.offset})
                continue
            elif hasattr(item, "status_update"):
                self._batch_event(item)
            else:
                if t == "space" and self.env is not None:
                    self._enter_space(item.space)
                continue
            if t == "enabled" and core is not None and k + kr + 1 < places:
                got = self._trips(core, a, items, k, rows, kr, r)
                if got is not None:
                    k, kr, r = got
        if r < m:
            self._records(a, r, m)
        self.n = int(a.start[m]) if m else first
        self._out()

    def _trips(self, core, a: "_Rec", items: list, k: int, rows: np.ndarray, kr: int,
               r: int):
        """Where the thread just came back from untraced code: the plain
        system-call round trips from item ``k``, row ``kr`` (of
        ``Batch.plain``; none: :data:`_NO_ROWS`) and record ``r`` on, by
        the compiled core (``trips``: the runs of records between them,
        each syscall and sysret, as :meth:`_records` and :meth:`_event`
        make them, while the same thread runs on); (k, kr, r) after
        them, or None where it did none."""
        th, t = self.th, self.tracker
        if th is None or not th.on or th.pend_x is not None or th.exit is not None \
                or not self.enabled or t.watch:
            return None
        tl = self.follow
        clock = None if tl is None else tl.clock_state()
        allowed, ranges = _mask_arrays(t.mask)
        got = core.trips(
            items, k, rows, kr, r, a.ip, a.fall, a.end_ip, a.key, a.tsc, a.start, _KLUT, _FARLUT8,
            _DELTA, self._far, self._far_kind, self._sys_size,
            functools.partial(self._pend_kind, a), allowed, ranges,
            bool(th.wanted), -1 if th.pid is None else th.pid,
            -1 if th.tid is None else th.tid, _TRIP_CODES, _LAYOUT, _PLAIN_LAYOUT,
            (th.depth, self.time, clock))
        if got is None:
            return None
        (k, kr, r, th.depth, self.time, clock, recs, th.exit_at, th.pend_pc,
         th.pend_time) = got
        if tl is not None:
            tl.set_clock_state(*clock)
        self.n = int(a.start[r])
        if recs:
            self._out()
            self.chunks.append(np.frombuffer(recs, _DT))
        return k, kr, r

    def _sys_size(self, frm: int) -> int:
        """The size of the system call instruction at ``frm`` (its bytes:
        what :meth:`_x` and the tracker's ``leave`` read), or -1 where
        it is none."""
        if self._far_kind(frm) != _SYSCALL:
            return -1
        return self._insn_at(frm).size

    def _pend_kind(self, a: "_Rec", r: int, to: int) -> int:
        """The record kind code of record r's branch going to ``to`` (-1
        none, -2 no branch pending): what the tracker's ``_resolve`` makes
        of it where a PSB+ split a run."""
        x = self._x(a, r)
        if x is None:
            return -2
        kind = classify(x, int(a.end_ip[r]), to)
        return -1 if kind is None else _KIND_ID[kind]

    def _x(self, a: "_Rec", r: int):
        """The branch instruction ending record r (an x86 Insn), or None;
        from its bytes, or -- where the files lack them -- what the
        record's class says it was."""
        c = int(a.cls[r])
        if not c:
            return None
        x = self._insn_at(int(a.end_ip[r]))
        if x is None and c != 5:
            ind = bool(a.key[r] & 2)
            kind = {1: Kind.CALL_IND if ind else Kind.CALL_REL, 2: Kind.RET,
                    3: Kind.JMP_IND if ind else Kind.JMP_REL, 4: Kind.JCC}[c]
            x = Insn(int(a.fall[r] - a.end_ip[r]), IClass.OTHER, kind, is_branch=True)
        return x

    def _step_record(self, a: "_Rec", r: int) -> None:
        """Record r one instruction at a time where it matters: its first
        (the pending transfer lands), any trigger address inside, its
        last (a branch becomes pending)."""
        t, th = self.tracker, self.th
        ip, end = int(a.ip[r]), int(a.end_ip[r])
        time = self._time(a, r)
        x = self._x(a, r)
        single = ip == end
        t.step(th, ip, x if single else None, time)
        if single:
            return
        watch = t.watch
        if watch:
            for w in sorted(w for w in watch if ip < w <= end):
                t.step(th, w, x if w == end else None, time)
        if end not in watch:
            t.step(th, end, x, time)

    def _time(self, a, r) -> int | None:
        v = int(a.tsc[r])
        if v:
            self.time = v
            if self.follow is not None:
                self.follow.time(int(a.start[r]), v)
        return self.time

    def _records(self, a: "_Rec", r0: int, r1: int) -> None:
        """Records [r0, r1) with no event between them."""
        t = self.tracker
        if self.th is None:
            self.th = t.thread(None, None)
        watch = t.watch
        self.n = int(a.start[r0])
        if not watch:
            # no trigger address to step on: the first record, then every
            # transfer after it at once (a system call's run)
            self._step_record(a, r0)
            if r1 - r0 > 1:
                self._vector(a, r0, r1 - 1)
                th = self.th
                th.pend_pc = int(a.end_ip[r1 - 1])
                th.pend_x = self._x(a, r1 - 1)
                th.pend_time = self._time(a, r1 - 1)
            return
        hits = a.watch_hits(watch, r0, r1)
        self._step_record(a, r0)
        r = r0 + 1
        hi = 0
        while r < r1:
            while hi < len(hits) and hits[hi] < r:
                hi += 1
            s = int(hits[hi]) if hi < len(hits) else r1
            if s > r:
                # transfers r-1 .. s-2 (the first is the one pending)
                self._vector(a, r - 1, s - 1)
            if s < r1:
                th = self.th
                th.pend_pc = int(a.end_ip[s - 1])
                th.pend_x = self._x(a, s - 1)
                th.pend_time = self._time(a, s - 1)
                self._step_record(a, s)
            r = s + 1
        if r1 - r0 > 1 and (not len(hits) or hits[-1] != r1 - 1):
            # the last record's branch is pending
            th = self.th
            th.pend_pc = int(a.end_ip[r1 - 1])
            th.pend_x = self._x(a, r1 - 1)
            th.pend_time = self._time(a, r1 - 1)

    def _kinds(self, a: "_Rec", t0: int, t1: int) -> np.ndarray:
        taken = a.ip[t0 + 1:t1 + 1] != a.fall[t0:t1]
        key = a.key[t0:t1] | taken.view(np.uint8)
        kind = _KLUT[key]
        # far transfers, and indirect jumps (JMPABS is no indirect jump):
        # their kind from the instruction's bytes, per address
        far = np.flatnonzero(_FARLUT[key])
        if len(far):
            addr = a.end_ip[t0 + far]
            # the kinds of addresses seen before: sorted arrays, looked up
            # at once; new ones by _far_kind, then merged in
            keys, vals = self._far_keys, self._far_vals
            pos = np.searchsorted(keys, addr)
            hit = keys[np.minimum(pos, len(keys) - 1)] == addr if len(keys) \
                else np.zeros(len(addr), bool)
            if not hit.all():
                u = unique(addr[~hit])
                ku = np.array([self._far_kind(x) for x in u.tolist()], np.int16)
                keys = np.concatenate((keys, u))
                order = np.argsort(keys, kind="stable")
                keys = self._far_keys = keys[order]
                vals = self._far_vals = np.concatenate((vals, ku))[order]
                pos = np.searchsorted(keys, addr)
            kf = vals[pos]
            sel = kf != -2                  # -2: no bytes (keep the class's word)
            kind[far[sel]] = kf[sel]
        return kind

    def _far_kind(self, frm: int) -> int:
        """The record kind of the far transfer or indirect jump at ``frm``
        (its bytes; -2 where the files lack them, -1 not a record)."""
        k = self._far.get(frm)
        if k is None:
            x = self._insn_at(frm)
            if x is None:
                k = -2
            else:
                name = classify(x, frm, -1)
                k = _KIND_ID[name] if name is not None else -1
            self._far[frm] = k
        return k

    def _vector(self, a: "_Rec", t0: int, t1: int) -> None:
        """Transfers [t0, t1) (record t's branch to record t + 1), the
        first being the thread's pending one: records, depth and windows
        at once."""
        th = self.th
        t = self.tracker
        th.pend_x = None
        if t1 <= t0 or not th.on:
            if t1 > t0:
                self._time(a, t1 - 1)
            return
        core = _impl.core_for(self.impl)
        if core is not None:
            self._vector_compiled(core, a, t0, t1)
            return
        kind = self._kinds(a, t0, t1)
        br = np.flatnonzero(kind >= 0)
        if not len(br):
            self._time(a, t1 - 1)
            return
        k = kind[br]
        delta = _DELTA[k]
        depth = th.depth + np.cumsum(delta) - delta
        if t.trigger.within is not None:
            close = np.flatnonzero((k == _RET) & (depth == 0))
            if len(close):
                c = int(close[0])
                br, k, delta, depth = br[:c + 1], k[:c + 1], delta[:c + 1], depth[:c + 1]
                delta[-1] = 0
                th.on = False
        frm = a.end_ip[t0 + br]
        to = a.ip[t0 + br + 1]
        tsc = a.tsc[t0:t1 + 1].astype(np.int64)
        # each branch's time: the last timing value at or before it
        head = tsc[:len(kind)]
        last = -1 if self.time is None else self.time
        if head.any():
            # forward fill: the position of the last timing value at or
            # before each transfer (-1: none yet)
            at = np.maximum.accumulate(np.where(head != 0, _ARANGE[:len(head)]
                                                if len(head) <= len(_ARANGE)
                                                else np.arange(len(head)), -1))[br]
            times = np.where(at >= 0, tsc[np.maximum(at, 0)], last)
        else:
            times = np.full(len(br), last, np.int64)
        self._time(a, t1 - 1)
        th.depth = int(depth[-1] + delta[-1])
        mask = t.mask
        keep = np.ones(len(br), bool) if th.wanted else np.zeros(len(br), bool)
        if len(mask.kinds) < len(KIND_CODE):
            allowed = np.zeros(len(KIND_CODE), bool)
            allowed[[KIND_CODE[x] for x in mask.kinds]] = True
            keep &= allowed[k]
        if mask.ranges:
            inr = np.zeros(len(br), bool)
            for lo, hi in mask.ranges:
                inr |= (frm >= np.uint64(lo)) & (frm < np.uint64(hi))
            keep &= inr
        if not keep.any():
            return
        self._out()
        out = np.zeros(int(keep.sum()), _DT)
        out["pid"] = -1 if th.pid is None else th.pid
        out["tid"] = -1 if th.tid is None else th.tid
        out["kind"] = k[keep]
        out["from"] = frm[keep]
        out["to"] = to[keep]
        out["time"] = times[keep]
        out["depth"] = depth[keep]
        self.chunks.append(out)


    def _vector_compiled(self, core, a: "_Rec", t0: int, t1: int) -> None:
        """:meth:`_vector` by the compiled core (``transfers``): the same
        records, depth and window."""
        th = self.th
        t = self.tracker
        allowed, ranges = _mask_arrays(t.mask)
        recs, kept, depth, closed, nbr = core.transfers(
            a.ip, a.fall, a.end_ip, a.key, a.tsc, t0, t1, _KLUT, _FARLUT8, _DELTA,
            self._far, self._far_kind, th.depth, -1 if self.time is None else self.time,
            t.trigger.within is not None, allowed, ranges, bool(th.wanted),
            -1 if th.pid is None else th.pid, -1 if th.tid is None else th.tid,
            _RET, _LAYOUT)
        self._time(a, t1 - 1)
        if not nbr:
            return
        if closed:
            th.on = False
        th.depth = depth
        if kept:
            self._out()
            self.chunks.append(np.frombuffer(recs, _DT))


_MASKED: dict = {}


def _mask_arrays(mask) -> tuple:
    """(kinds allowed, u1 per kind code; ranges, flat u8 lo/hi pairs) of a
    (frozen) :class:`~.mask.Mask` for the compiled core: made once per
    mask, not per run of records (one per system call)."""
    got = _MASKED.get(id(mask))
    if got is None or got[0] is not mask:
        if len(mask.kinds) < len(KIND_CODE):
            allowed = np.zeros(len(KIND_CODE), np.uint8)
            allowed[[KIND_CODE[x] for x in mask.kinds]] = 1
        else:
            allowed = _ALL_ALLOWED
        ranges = np.array(mask.ranges, np.uint64).reshape(-1) if mask.ranges \
            else _NO_RANGES
        if len(_MASKED) > 64:
            _MASKED.clear()
        got = _MASKED[id(mask)] = (mask, allowed, ranges)
    return got[1], got[2]


class _Rec:
    """A batch's records as the branch source reads them
    (:func:`hwtrace.analysis.blockcols.columns` with this module's
    classes); instruction indices from ``first``."""

    __slots__ = ("ip", "end_ip", "fall", "cls", "tsc", "start", "key")

    def __init__(self, blocks: np.ndarray, first: int):
        from hwtrace.analysis.blockcols import columns
        self.ip, self.end_ip, self.cls, self.fall, self.tsc, self.start = \
            columns(blocks, first, _CLS)
        # class << 2 | indirect << 1 (decoded._KLUT's key, but taken); the
        # indirect flag is 4 in the block's flags
        key = self.cls.view(np.uint8) << 2
        key |= (blocks["flags"] & 4) >> 1
        self.key = key

    def watch_hits(self, watch, r0: int, r1: int) -> np.ndarray:
        """Records in [r0, r1) holding one of these addresses."""
        ip, end = self.ip[r0:r1], self.end_ip[r0:r1]
        hit = np.zeros(r1 - r0, bool)
        for w in watch:
            w = np.uint64(w)
            hit |= (ip <= w) & (w <= end)
        return r0 + np.flatnonzero(hit)


class DecodedTrace:
    """Branch records of an opened input (``hwtrace.cli._inputs.Input``)."""

    #: the batches' plain events as rows (``Batch.plain``), not Event
    #: items: a system call's disable and enable are two of them, read
    #: from their columns (False: every event an item -- the same records)
    plain_events = True

    def __init__(self, inp, reader: CodeReader, trigger: TriggerSpec, mask: MaskSpec):
        self.source = inp
        self.symbolizer = inp.symbolizer
        self.reader = reader
        self.base = resolve.main_base(self.symbolizer)
        # bind now: unknown symbols fail before any decoding
        self.trigger = trigger.bind(self.symbolizer, self.base)
        self.mask = mask.bind(self.symbolizer, self.base)
        # a bundle whose processes run different programs at the same
        # addresses: each space's code, trigger and mask are its own files'
        traces = getattr(inp, "traces", None)
        self._spaced = traces.space_lookup() if traces is not None else None
        self._specs = (trigger, mask)
        self._envs: dict = {}
        if self._spaced is not None:
            mapped = {m.path for sp in traces.spaces.spaces for m in sp.mappings}
            self._extra = [m for m in inp.code if m.path not in mapped]     # --elf

    def _env(self, space):
        lookup = self._spaced(space)
        got = self._envs.get(id(lookup))
        if got is None:
            sym = lookup.__self__
            reader = CodeReader()
            for m in space.mappings:
                reader.add(m.start, m.size, m.path, m.offset)
            for m in self._extra:
                reader.add(m.start, m.size, m.path, m.offset)
            base = resolve.main_base(sym)
            trigger, mask = self._specs
            got = self._envs[id(lookup)] = (lookup, reader, _bind_trigger(trigger, sym, base),
                                            _bind_mask(mask, sym, base))
        return got[1:]

    def arrays(self) -> Iterator[np.ndarray]:
        """Every stream's records in turn, as numpy chunks."""
        from hwtrace.analysis.switches import SwitchTimeline
        for s in self.source.streams:
            info = s.info
            tracker = Tracker(self.trigger, self.mask, kernel_untraced=False)
            per_cpu = info.tid is None and info.cpu is not None
            follow = None
            if per_cpu and info.switches:
                tl = SwitchTimeline(info.switches, info.cpu, info.tsc_per_insn,
                                    info.clock_exact,
                                    getattr(info, "clock_counted", False))
                follow = tl if tl else None
            th = None if follow is not None else tracker.thread(info.pid, info.tid)
            born = _born_here(info) if follow is not None else None
            if th is not None and not th.wanted:
                continue
            spaced = self._spaced is not None and s.batches is not None
            c = _Consumer(tracker, th, self.reader, per_cpu=per_cpu, follow=follow,
                          env=self._env if spaced else None, born=born)
            if s.batches is not None:
                more = {"space_items": True} if spaced else {}
                if self.plain_events:
                    more["plain_events"] = True
                for b in s.batches(**more):
                    c.feed_batch(b)
                    yield from c.take()
            else:
                if c.th is None:
                    c.th = tracker.thread(info.pid, info.tid)
                n = 0
                for item in s.items():
                    c.feed(item)
                    n += 1
                    if not n & 0xFFF:
                        yield from c.take()
                yield from c.take()

    def records(self) -> Iterator[Branch]:
        """Every stream's records in turn, as Branch objects."""
        from .records import KINDS
        for a in self.arrays():
            for pid, tid, kind, frm, to, time, depth in a.tolist():
                yield Branch(None if pid < 0 else pid, None if tid < 0 else tid,
                             KINDS[kind], frm or None, to or None,
                             None if time < 0 else time,
                             None if depth == _NODEPTH else depth)


def _born_here(info) -> dict:
    """tid -> its creator's tid, for the threads whose first switch in is
    on this stream's CPU (as ``hwtrace diff`` pairs them)."""
    first: dict = {}            # tid -> (time, cpu) it first ran
    for s in info.switches:
        if s.next_tid > 0 and (s.next_tid not in first or s.time < first[s.next_tid][0]):
            first[s.next_tid] = (s.time, s.cpu)
    return {t: c for t, c in getattr(info, "creators", ())
            if first.get(t, (0, None))[1] == info.cpu}


#: an address no code is at: a trigger or range whose function this
#: space's files do not define never fires there
_NOWHERE = (1 << 64) - 1


def _bind_trigger(spec: TriggerSpec, sym, base):
    from .triggers import Trigger

    def a(v):
        if v is None:
            return None
        try:
            return resolve.address(sym, v, base)
        except resolve.SymbolNotFound:
            return _NOWHERE
    return Trigger(a(spec.start), a(spec.stop), a(spec.within))


def _bind_mask(spec: MaskSpec, sym, base):
    from .mask import Mask
    ranges = []
    for r in spec.ranges:
        try:
            ranges.append(resolve.address_range(sym, r, base))
        except resolve.SymbolNotFound:
            ranges.append((_NOWHERE, _NOWHERE))
    return Mask(spec.kinds, spec.pids, spec.tids, tuple(ranges))


def open_decoded(inp, trigger: TriggerSpec = TriggerSpec(),
                 mask: MaskSpec = MaskSpec()) -> DecodedTrace:
    """Branch records of an opened input; raises resolve.SymbolNotFound
    or ValueError (bad trigger/range)."""
    reader = CodeReader()
    for m in inp.code:              # the files the decoder read its code from
        reader.add(m.start, m.size, m.path, m.offset)
    return DecodedTrace(inp, reader, trigger, mask)


def decoded_records(path, trigger: TriggerSpec = TriggerSpec(),
                    mask: MaskSpec = MaskSpec(), elf=(), image_path=()) -> DecodedTrace:
    """Open a bundle, a raw ``.pt`` or a flow-items ``.jsonl`` (with
    ``elf`` images) -- the Python API's door; raises DecodedError,
    resolve.SymbolNotFound or ValueError (bad trigger/range)."""
    from hwtrace.cli import CliError
    from hwtrace.cli._inputs import open_input
    try:
        inp = open_input(Path(path), list(elf), list(image_path))
    except CliError as e:
        raise DecodedError(str(e)) from None
    if any(s.branches is not None for s in inp.streams):
        raise DecodedError(f"{path}: holds branch records already")
    return open_decoded(inp, trigger, mask)
