"""The threads of a recording, and which thread of A goes with which of B.

Thread and process ids differ from run to run, so threads are matched by
their place in the process tree: the first traced process of A with the
first of B, then each process's children in the order they were created,
and within a process the main thread with the main thread and the
others in creation order (time of their sideband record, then thread id:
the kernel hands out ids in increasing order).  ``--thread A:TID=B:TID``
pairs fixes pairs by hand; the rest are matched as above around them (a
thread whose partner in the tree was taken by hand stays unpaired).

Where a thread's flow is: a thread-mode bundle has one stream per
thread.  A cpu-mode bundle has one per CPU; a CPU whose context switches
put only one traced thread on it holds that thread's flow, one whose
switches put several there interleaves them: each thread takes its own
segments of it (:mod:`.cpusplit`, by the views' rule for placing the
switches).  A thread that moved between CPUs has its flow in pieces,
which :mod:`.cpumerge` joins.  A CPU stream of a recording with no
context switches at all, whose processes or threads are several, cannot
be cut into threads: :class:`ThreadsError` says to record with ``--mode
thread``.

No I/O: works on a :class:`hwtrace.streams.TraceSet` and its sideband
records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class ThreadsError(Exception):
    """The threads cannot be told apart or paired (one line)."""


@dataclass
class Thread:
    pid: int | None
    tid: int | None
    streams: list                   # hwtrace.streams.Stream s holding its flow
    comm: str = ""
    time: int = 0                   # when it began (sideband clock)
    exit: int | None = None         # exit status, where the sideband has it
    insns: int = 0                  # what the recorder saw (0: unknown)
    left: dict = field(default_factory=dict)    # cpu -> first switch out
    shared: set = field(default_factory=set)    # streams (names) it shares
    creators: dict = field(default_factory=dict)  # tid -> creator (recording's)
    program: str = ""               # the files its process ran: "sh -> tr"

    def batches(self, impl: str | None = None):
        """Its flow as batches (every branch ends a record)."""
        from .cpumerge import merged_batches
        sts = self.streams
        return merged_batches([(st.info.cpu, self._own(st, impl)) for st in sts],
                              self.left,
                              stopped={st.info.cpu for st in sts if st.entry.stopped},
                              wrapped={st.info.cpu for st in sts if st.entry.wrapped})

    def _own(self, st, impl):
        """What of stream ``st`` is this thread's: all of it, or (a CPU
        stream it shares) its segments, walking the stream anew.  A
        stream of its own: the plain events as rows (``plain_events``,
        which steps.StepReader and the joining of streams read on their
        columns; the splitting of a shared stream reads items)."""
        own = st.name not in self.shared
        it = st.batches(view=True, impl=impl, resync=True,
                        space_items=True,   # (an exec: steps.StepReader)
                        plain_events=own)
        if own:
            return it
        from hwtrace.analysis.switches import SwitchTimeline
        from .cpusplit import own_batches
        info = st.info
        tl = SwitchTimeline(info.switches, info.cpu, info.tsc_per_insn,
                            info.clock_exact, getattr(info, "clock_counted", False))
        first: dict = {}            # tid -> (time, cpu) it first ran
        for s in info.switches:
            if s.next_tid > 0 and (s.next_tid not in first or
                                   s.time < first[s.next_tid][0]):
                first[s.next_tid] = (s.time, s.cpu)
        born = {t: c for t, c in self.creators.items()
                if first.get(t, (0, None))[1] == info.cpu}
        # a walk that ends early still tells what its decode found
        return own_batches(it, tl, self.tid, done=st.report, born=born)

    def label(self) -> str:
        who = f"{self.pid}/{self.tid}" if self.pid is not None and \
            self.tid is not None and self.pid != self.tid else \
            str(self.tid if self.tid is not None else self.pid)
        name = self.program or self.comm
        return f"{who} ({name})" if name else who


@dataclass
class Process:
    pid: int | None
    ppid: int = 0
    comm: str = ""
    exe: str = ""
    time: int = 0
    program: str = ""               # the files it ran, in turn (its name)
    threads: list = field(default_factory=list)
    children: list = field(default_factory=list)


def _records(traceset):
    b = traceset.bundle
    return list(b.iter_sideband()) if b is not None else []


def threads_of(traceset) -> list[Process]:
    """The root processes of a recording (children hang below), each with
    the threads that have a trace."""
    from hwtrace.bundle import Exit, Process as P, Switch, Thread as T
    recs = _records(traceset)
    procs: dict = {}
    for r in recs:
        if isinstance(r, P):
            p = procs.get(r.pid)
            if p is None:
                procs[r.pid] = Process(r.pid, r.ppid, r.comm, r.exe, r.time)
            else:                   # an exec: same process, new program
                p.comm, p.exe = r.comm or p.comm, r.exe or p.exe
    from hwtrace.streams import program_names, thread_creators
    for pid, name in program_names(recs):
        if pid in procs:
            procs[pid].program = name
    born = {r.tid: r for r in recs if isinstance(r, T)}
    exits = {r.tid: r.status for r in recs if isinstance(r, Exit)}
    found: list[Thread] = []
    if traceset.mode == "thread":
        for st in traceset.streams:
            tid, pid = st.info.tid, st.info.pid
            if pid is None and tid in born:
                pid = born[tid].pid
            found.append(_thread([st], pid, tid, born, exits, procs))
    else:
        # a CPU-wide recording's switches name every task that ran
        # (idle, kernel threads, the recorder): only traced processes count
        traced = set(procs) or None
        on_cpu: dict = {}           # cpu -> tids
        for r in recs:
            if isinstance(r, Switch) and r.next_tid >= 0 and \
                    (traced is None or r.next_pid in traced):
                on_cpu.setdefault(r.cpu, set()).add(r.next_tid)
        pids = {r.next_tid: r.next_pid for r in recs
                if isinstance(r, Switch) and r.next_tid >= 0}
        switched = any(isinstance(r, Switch) for r in recs)
        mine: dict = {}             # tid -> its CPU streams
        shared: dict = {}           # tid -> names of those it shares
        for st in traceset.streams:
            if not st.entry.instructions_observed and not st.entry.size > 64:
                continue
            tids = on_cpu.get(st.info.cpu, set())
            if not tids:
                if not switched and st.entry.instructions_observed and \
                        (len(procs) > 1 or len(born) > 1):
                    who = sorted(born) if len(born) > 1 else sorted(procs)
                    raise ThreadsError(
                        f"{traceset.description}: {st.name}: no context "
                        f"switches say which of threads "
                        f"{', '.join(map(str, who))} ran on it: diff compares "
                        f"threads; record with --mode thread")
                if len(procs) == 1 and st.entry.instructions_observed:
                    pid = next(iter(procs))
                    mine.setdefault(pid, []).append(st)
                    pids.setdefault(pid, pid)
                continue
            for tid in sorted(tids):
                mine.setdefault(tid, []).append(st)
                if len(tids) > 1:
                    shared.setdefault(tid, set()).add(st.name)
        # who made each thread: its parent thread, or a process's parent
        creators = dict(thread_creators(recs))
        for tid, sts in mine.items():
            t = _thread(sts, pids.get(tid), tid, born, exits, procs)
            t.shared = shared.get(tid, set())
            t.creators = creators
            if t.shared:
                t.insns = 0         # what the recorder counted is the CPU's
            for r in recs:
                if isinstance(r, Switch) and r.prev_tid == tid and \
                        r.cpu in {st.info.cpu for st in sts}:
                    t.left[r.cpu] = min(t.left.get(r.cpu, r.time), r.time)
            found.append(t)
    for t in found:
        p = procs.get(t.pid)
        if p is None:
            p = procs[t.pid] = Process(t.pid, comm=t.comm)
        p.threads.append(t)
    for p in procs.values():
        p.threads.sort(key=lambda t: (t.tid != p.pid, t.time, t.tid or 0))
    roots = []
    for p in sorted(procs.values(), key=lambda p: (p.time, p.pid or 0)):
        parent = procs.get(p.ppid) if p.ppid else None
        if parent is not None and parent is not p:
            parent.children.append(p)
        else:
            roots.append(p)
    return [p for p in roots if _has_threads(p)]


def _has_threads(p: Process) -> bool:
    return bool(p.threads) or any(_has_threads(c) for c in p.children)


def _thread(sts, pid, tid, born, exits, procs) -> Thread:
    b = born.get(tid)
    p = procs.get(pid)
    return Thread(pid, tid, sts, p.comm if p else "", b.time if b else 0,
                  exits.get(tid), sum(s.entry.instructions_observed for s in sts),
                  program=p.program if p else "")


def all_threads(roots: list[Process]) -> list[Thread]:
    out = []

    def walk(p):
        out.extend(p.threads)
        for c in p.children:
            walk(c)
    for r in roots:
        walk(r)
    return out


_OVERRIDE = re.compile(r"^A:(\d+)=B:(\d+)$", re.I)


def parse_override(text: str) -> tuple[int, int]:
    """``A:TID=B:TID`` -> (tid in A, tid in B)."""
    m = _OVERRIDE.match(text.strip())
    if not m:
        raise ThreadsError(f"--thread {text}: expected A:TID=B:TID")
    return int(m.group(1)), int(m.group(2))


@dataclass
class Pairing:
    pairs: list                     # [(Thread of A, Thread of B, how)]
    only_a: list                    # threads of A without a partner
    only_b: list


def pair(roots_a: list[Process], roots_b: list[Process],
         overrides=()) -> Pairing:
    """Pair the threads of two recordings (see the module doc)."""
    ta, tb = all_threads(roots_a), all_threads(roots_b)
    by_a = {t.tid: t for t in ta}
    by_b = {t.tid: t for t in tb}
    fixed = []
    for x, y in overrides:
        if x not in by_a:
            raise ThreadsError(f"--thread A:{x}=B:{y}: no thread {x} in A")
        if y not in by_b:
            raise ThreadsError(f"--thread A:{x}=B:{y}: no thread {y} in B")
        if any(x == f[0].tid or y == f[1].tid for f in fixed):
            raise ThreadsError(f"--thread A:{x}=B:{y}: a thread paired twice")
        fixed.append((by_a[x], by_b[y], "given"))
    taken_a = {id(f[0]) for f in fixed}
    taken_b = {id(f[1]) for f in fixed}
    pairs = list(fixed)

    def threads(pa, pb):
        xa = [t for t in pa.threads if id(t) not in taken_a]
        xb = [t for t in pb.threads if id(t) not in taken_b]
        for x, y in zip(xa, xb):
            taken_a.add(id(x))
            taken_b.add(id(y))
            pairs.append((x, y, "tree"))

    def procs(la, lb):
        for pa, pb in zip(la, lb):
            threads(pa, pb)
            procs(pa.children, pb.children)
    procs(roots_a, roots_b)
    only_a = [t for t in ta if id(t) not in taken_a]
    only_b = [t for t in tb if id(t) not in taken_b]
    pairs.sort(key=lambda p: ta.index(p[0]))
    return Pairing(pairs, only_a, only_b)
