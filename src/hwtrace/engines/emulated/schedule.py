"""One clock for every thread of a recording (no I/O).

The execution sources log each thread on its own: the QEMU plugin keeps a
buffer per guest thread and appends it to the log in chunks, the stepper
writes what it sees in the order it sees it.  The host clock (TIME
records: the TSC when the plugin or stepper read it) is the only thing
that says how threads' work interleaved, and the log has it at a few
points only: where a chunk starts, at every kernel entry and exit, and
before a thread's first block after another thread of its process entered
or left the kernel (the QEMU plugin), before each batch of records (the
stepper; a syscall's entry carries the TSC read before it was stepped).

A *slice* is a thread's work from one TIME record to the next: it began
at host time ``h0`` and ended by ``h1`` (the next TIME of the thread; for
its last slice, ``h0`` again: nothing says it lasted longer).  The
generators run slices in host-time order, and give each an emulated start
time (``E``):

    E(s) = max(the clock of the stream it runs on,
               the thread's own end so far,
               E_end(r) for every slice r with h1(r) <= h0(s))

so whatever really ended before a slice began (a thread's ``clone`` before
the new thread's first instruction, a child's ``exit`` before the parent's
``waitpid`` returned, a worker's ``exit`` before ``pthread_join``
returned, ``exit_group`` after every instruction its threads had begun)
comes before it on the emulated clock too, however the slices were spread
over CPUs.  A stream whose clock is behind ``E`` idles until then
(``ptgen.Tracer.idle_until``).  The emulated clock otherwise advances one
tick per retired instruction, as before.

The compiled generator (``ptgen_fast.c``) implements the same rules; the
tests compare the two.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from . import execlog as xl


class Slice(NamedTuple):
    h0: int                 # host clock when the slice began
    h1: int                 # host clock by which it had ended
    tid: int
    ordinal: int            # its place among the thread's slices (empty ones included)
    seg: int                # segment index in the thread
    lo: int                 # its items: segment.items[lo:hi]
    hi: int
    first_ip: int | None    # the first block's address (None: no block)
    next_ip: int | None     # the thread's next instruction after the slice (None: unknown)
    execs: int              # PROC_EXEC records in it
    last: bool              # the thread's last slice


def _blocks():
    from .flow import BlockInfo
    return BlockInfo


def thread_slices(tid: int, th) -> list[Slice]:
    """The slices of one thread (``flow.ThreadInfo``), in program order,
    without the empty ones (no item but the TIME that starts them)."""
    BlockInfo = _blocks()
    raw = []        # [h0, seg, lo, hi, first_ip, items, execs]
    for si, seg in enumerate(th.segments):
        items = seg.items
        cur = [seg.time, si, 0, 0, None, 0, 0]
        for i, it in enumerate(items):
            t = type(it)
            if t is xl.Time:
                if i or cur[5]:     # (nothing before a segment's first TIME: no slice)
                    cur[3] = i
                    raw.append(cur)
                cur = [it.value, si, i, 0, None, 0, 0]
                continue
            cur[5] += 1
            if t is BlockInfo:
                if cur[4] is None:
                    cur[4] = it.pc
            elif t is xl.ProcExec:
                cur[6] += 1
        cur[3] = len(items)
        raw.append(cur)
    h = None
    for r in raw:           # the host clock never runs back within a thread
        if h is not None and r[0] < h:
            r[0] = h
        h = r[0]
    out = []
    nxt = None
    for k in range(len(raw) - 1, -1, -1):
        r = raw[k]
        if not r[5]:
            continue
        h1 = raw[k + 1][0] if k + 1 < len(raw) else r[0]
        out.append(Slice(r[0], h1, tid, k, r[1], r[2], r[3], r[4], nxt, r[6], not out))
        if r[4] is not None:
            nxt = r[4]
    out.reverse()
    return out


def slices(trace) -> list[Slice]:
    """Every thread's slices, in the order the generators run them: by
    host start time, then end time, then thread id and program order."""
    out = []
    for tid, th in trace.threads.items():
        out += thread_slices(tid, th)
    out.sort(key=lambda s: (s.h0, s.h1, s.tid, s.ordinal))
    return out


class Frontier:
    """The latest emulated end of the slices that, by the host clock,
    ended before a given time (queried in non-decreasing host order);
    ``base`` before any."""

    def __init__(self, base: int = 0):
        self._heap: list[tuple[int, int]] = []
        self.value = base

    def at(self, h0: int) -> int:
        heap = self._heap
        while heap and heap[0][0] <= h0:
            _h1, e = heapq.heappop(heap)
            if e > self.value:
                self.value = e
        return self.value

    def add(self, h1: int, e_end: int) -> None:
        heapq.heappush(self._heap, (h1, e_end))


# ---------------------------------------------------------------- the drivers

class _Discard:
    """The sink of a thread nobody traces (it still keeps the clock)."""
    stopped = False

    def write(self, data: bytes) -> int:
        return len(data)


def _catch_up(flow, st, tr, sl: Slice, start: int, running: bool) -> None:
    """Before ``sl`` runs on ``tr``: if the stream's clock is behind the
    slice's start, the thread (``running``: it ran last on this stream)
    leaves user code where it is (as if interrupted: it did not run
    meanwhile) and the stream idles until then."""
    if start <= tr.t:
        return
    if running and not st.in_kernel:
        flow._switch_out(st, tr, sl.first_ip if sl.first_ip is not None else sl.next_ip)
    tr.idle_until(start)


def run_cpus(trace, cfg, num_cpus: int, sink_for=None, cr3=None, *, switches=None,
             exits=None, starts=None, execs=None) -> list:
    """Cpu mode: one tracer per CPU; each slice runs on the CPU its chunk
    began on (the source's sample), switching threads in and out (FUP +
    TIP.PGD / TIP.PGE) where they change.  Returns the tracers by CPU; the
    keyword dicts/lists get what :func:`flow.generate` documents."""
    from . import flow
    from .ptgen import Tracer
    states = {tid: flow._ThreadState(tid, th.pid, flow._ctx_ok(cfg, cr3, th.pid),
                                     set(trace.handlers.get(th.pid, ())))
              for tid, th in trace.threads.items()}
    tracers = [Tracer(cfg, sink_for(c) if sink_for else None) for c in range(num_cpus)]
    front = Frontier(cfg.timing.t0)
    own_end: dict[int, int] = {}        # tid -> emulated time its last slice ended
    on_cpu: dict[int, tuple] = {}       # cpu -> (tid, its next ip) of the thread on it
    where: dict[int, int] = {}          # tid -> cpu it last ran on
    last_tid: dict[int, int] = {}       # cpu -> tid that ran last (-1: idle)
    for sl in slices(trace):
        tid = sl.tid
        seg = trace.threads[tid].segments[sl.seg]
        cpu = seg.cpu % num_cpus if seg.cpu >= 0 else 0
        st = states[tid]
        tr = tracers[cpu]
        prev = on_cpu.get(cpu)
        if prev is None or prev[0] != tid:
            if prev is not None and where.get(prev[0]) == cpu:
                flow._switch_out(states[prev[0]], tr, prev[1])
            if tid in where and where[tid] != cpu:
                oc = where[tid]
                oprev = on_cpu.get(oc)
                if oprev is not None and oprev[0] == tid:
                    flow._switch_out(st, tracers[oc], oprev[1])
                    del on_cpu[oc]
                if switches is not None and last_tid.get(oc) == tid:
                    # it migrated: the CPU it left goes idle
                    switches.append((oc, tracers[oc].t, st.pid, tid, -1, -1))
                    last_tid[oc] = -1
        start = max(front.at(sl.h0), own_end.get(tid, 0))
        if start > tr.t:
            p = last_tid.get(cpu, -1)
            if switches is not None and p not in (-1, tid):
                switches.append((cpu, tr.t, states[p].pid, p, -1, -1))   # the CPU idles
                last_tid[cpu] = -1
            _catch_up(flow, st, tr, sl, start, prev is not None and prev[0] == tid)
        if switches is not None and last_tid.get(cpu) != tid:
            p = last_tid.get(cpu, -1)
            switches.append((cpu, tr.t, states[p].pid if p in states else -1, p,
                             st.pid, tid))
        last_tid[cpu] = tid
        _ran(sl, tr, starts, execs)
        flow._run_items(st, tr, seg.items, sl.lo, sl.hi)
        on_cpu[cpu] = (tid, sl.next_ip)
        where[tid] = cpu
        own_end[tid] = tr.t
        front.add(sl.h1, tr.t)
        if sl.last:
            flow._end_thread(st, tr)
            if exits is not None:
                exits[tid] = tr.t
            del on_cpu[cpu]
            del where[tid]
    for tr in tracers:
        tr.finish()
    return tracers


def _ran(sl: Slice, tr, starts, execs) -> None:
    if starts is not None and sl.tid not in starts:
        starts[sl.tid] = tr.t
    if sl.execs and execs is not None:
        execs.setdefault(sl.tid, []).extend([tr.t] * sl.execs)


def run_threads(trace, cfg_for, sink_for=None, cr3=None, *, exits=None, starts=None,
                execs=None) -> dict:
    """Thread mode: one tracer per thread, begun when the thread begins
    (its first PSB+ has the TSC of that time).  ``cfg_for(tid)``: its
    TraceConfig (None: not traced, its clock is still kept);
    ``sink_for(tid)`` its sink.  Returns {tid: tracer} (untraced ones too)."""
    from dataclasses import replace

    from . import flow
    from .ptgen import Tracer, TraceConfig
    base = trace.t0
    front = Frontier(base)
    tracers: dict = {}
    states: dict = {}

    def begin(tid, start):
        th = trace.threads[tid]
        cfg = cfg_for(tid)
        sink = sink_for(tid) if (cfg is not None and sink_for) else None
        if cfg is None:
            cfg, sink = TraceConfig(ctl=0), _Discard()
        cfg = replace(cfg, timing=replace(cfg.timing, t0=max(start, cfg.timing.t0)))
        tracers[tid] = Tracer(cfg, sink)
        states[tid] = flow._ThreadState(tid, th.pid, flow._ctx_ok(cfg, cr3, th.pid),
                                        set(trace.handlers.get(th.pid, ())))
        return tracers[tid]

    for sl in slices(trace):
        tid = sl.tid
        start = front.at(sl.h0)
        tr = tracers.get(tid)
        if tr is None:
            tr = begin(tid, start)
        else:
            _catch_up(flow, states[tid], tr, sl, start, True)
        st = states[tid]
        _ran(sl, tr, starts, execs)
        flow._run_items(st, tr, trace.threads[tid].segments[sl.seg].items, sl.lo, sl.hi)
        front.add(sl.h1, tr.t)
        if sl.last:
            flow._end_thread(st, tr)
            tr.finish()
            if exits is not None:
                exits[tid] = tr.t
    for tid in trace.threads:
        if tid not in tracers:          # nothing ran: an empty stream
            tr = begin(tid, base)
            tr.finish()
            if exits is not None:
                exits[tid] = tr.t
    return tracers
