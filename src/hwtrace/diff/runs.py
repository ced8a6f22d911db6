"""Two recordings compared: the records ``hwtrace diff`` prints, in order.

:func:`diff_runs` takes two opened recordings
(:class:`hwtrace.streams.TraceSet`), pairs their threads
(:mod:`.threads`), and for each pair decodes both threads side by side
into steps (:mod:`.steps`; B's addresses read in A's terms,
:mod:`.relocate`), finds where they part and meet again (:mod:`.align`)
and counts what each ran (:mod:`.coverage`).  It yields plain dicts
(:mod:`.records` documents a divergence's):

``diff`` (what is compared), per process pair ``process`` (how its
code is compared: by address, module+offset or symbol+offset, and why),
per thread pair ``pair``, its ``divergence`` s and ``pair_end`` (totals,
whether the threads ran alike), ``thread`` for a thread only one run
has, ``coverage`` rows, and last ``summary`` (``same``: the exit status
is 0 exactly when it is true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from . import records as R
from .align import WINDOW, compare
from .coverage import Coverage, difference
from .relocate import Relocation, relocation
from .steps import StepReader
from .symtab import process_symtab
from .threads import all_threads, pair, threads_of


@dataclass
class Options:
    overrides: list = field(default_factory=list)   # [(tid A, tid B)]
    max_divergences: int | None = 10                 # per thread pair
    top: int = 10                                    # "differ most" rows
    window: int = WINDOW
    impl: str | None = None                          # batch producer


class _Run:
    """One recording: its symbols per process, read once."""

    def __init__(self, ts):
        self.ts = ts
        self._sym: dict = {}

    def symtab(self, pid):
        s = self._sym.get(pid)
        if s is None:
            s = self._sym[pid] = process_symtab(self.ts, pid)
        return s

    def reader(self, pid):
        spaces = self.ts.spaces
        sp = spaces.of_pid(pid) if spaces is not None and pid is not None \
            else None
        if sp is None and spaces is not None:
            sp = spaces.union()
        if sp is None:
            image = self.ts.streams[0].image      # a raw trace's image

            def read(addr, size, image=image):
                return image.read(addr, size)
            return read

        def read(addr, size, sp=sp):
            return sp.image.read(addr, size)
        return read


def _who(t) -> dict:
    return {"pid": t.pid, "tid": t.tid, "comm": t.comm, "program": t.program}


def diff_runs(a_ts, b_ts, opts: Options | None = None) -> Iterator[dict]:
    opts = opts or Options()
    A, B = _Run(a_ts), _Run(b_ts)
    roots_a, roots_b = threads_of(a_ts), threads_of(b_ts)
    pairing = pair(roots_a, roots_b, opts.overrides)
    yield {"type": "diff", "a": a_ts.description, "b": b_ts.description,
           "threads": {"a": len(all_threads(roots_a)),
                       "b": len(all_threads(roots_b)),
                       "paired": len(pairing.pairs)}}
    rels: dict = {}
    covs: dict = {}                 # (pid A, pid B) -> (Coverage A, Coverage B)
    same = not pairing.only_a and not pairing.only_b
    total_div = 0
    lost = 0                        # divergences where one trace lost data
    by = set()
    for number, (ta, tb, how) in enumerate(pairing.pairs, 1):
        key = (ta.pid, tb.pid)
        sa, sb = A.symtab(ta.pid), B.symtab(tb.pid)
        rel = rels.get(key)
        if rel is None:
            rel = rels[key] = relocation(sa, sb)
            by.add(rel.by)
            yield _process(ta, tb, rel)
        ca, cb = Coverage(sa), Coverage(sb)
        yield {"type": "pair", "pair": number, "paired_by": how,
               "a": _who(ta), "b": _who(tb), "compared_by": rel.by}
        ra = StepReader(ta.batches(opts.impl), taps=[ca])
        rb = StepReader(tb.batches(opts.impl), None if rel.identity else rel,
                        taps=[cb])
        ctx_a = R.SideContext(sa, A.reader(ta.pid), "A")
        ctx_b = R.SideContext(sb, B.reader(tb.pid), "B", rel)
        n = 0
        status: dict = {}
        begins = (_begins(ta, opts.impl), _begins(tb, opts.impl))
        for div in compare(ra, rb, max_divergences=opts.max_divergences,
                           window=opts.window, status=status,
                           same_space=rel.identity, begins=begins):
            n += 1
            lost += div.a.gap != div.b.gap
            yield R.divergence(number, div, ctx_a, ctx_b)
        more = bool(status.get("more"))
        if n:
            same = False
        total_div += n
        yield {"type": "pair_end", "pair": number, "same": n == 0,
               "divergences": n, "more": more,
               "a": {"insns": ra.insns, "gaps": ra.gaps,
                     "wrapped": any(st.entry.wrapped for st in ta.streams)},
               "b": {"insns": rb.insns, "gaps": rb.gaps,
                     "wrapped": any(st.entry.wrapped for st in tb.streams)}}
        got = covs.get(key)
        if got is None:
            covs[key] = (ca, cb)
        else:
            got[0].merge(ca)
            got[1].merge(cb)
    for t in pairing.only_a:
        yield {"type": "thread", "only": "a", **_who(t)}
    for t in pairing.only_b:
        yield {"type": "thread", "only": "b", **_who(t)}
    for (pa, pb), (ca, cb) in covs.items():
        d = difference(ca, cb, rels[(pa, pb)], opts.top)
        if not d.same:
            same = False
        yield from _coverage(d, ca.sym, cb.sym, pa, pb, len(covs) > 1)
    yield {"type": "summary", "same": same, "divergences": total_div,
           "at_lost_data": lost,
           "pairs": len(pairing.pairs), "only_a": len(pairing.only_a),
           "only_b": len(pairing.only_b),
           "compared_by": sorted(by)}


def _begins(t, impl) -> int | None:
    """Where in its run a thread's trace begins (instruction index): 0
    for a complete trace; for one that kept only the newest part (a
    circular buffer wrapped), the instructions the recorder saw less those
    the trace holds (counted here: such a trace is as small as its
    buffer); None where the recorder didn't count."""
    if not any(st.entry.wrapped for st in t.streams):
        return 0
    if not t.insns:
        return None
    held = sum(int(b.blocks["ninsn"].sum()) for b in t.batches(impl))
    return max(t.insns - held, 0)


def _process(ta, tb, rel: Relocation) -> dict:
    notes = []
    for n in rel.notes:
        d = {"how": {"address": "address", "module": "module+offset",
                     "symbol": "symbol+offset", "none": "only in B"}[n.how],
             "a": n.a, "b": n.b}
        if n.how == "symbol":
            d["build_id"] = {"a": n.a_build, "b": n.b_build}
            d["functions"] = {"matched": n.matched, "only_b": n.unmatched}
        elif n.how == "module":
            d["moved"] = n.moved
        notes.append(d)
    return {"type": "process",
            "a": {"pid": ta.pid, "comm": ta.comm, "program": ta.program},
            "b": {"pid": tb.pid, "comm": tb.comm, "program": tb.program},
            "compared_by": rel.by,
            "modules": notes}


def _coverage(d, sa, sb, pa, pb, tag: bool) -> Iterator[dict]:
    extra = {"process": {"a": pa, "b": pb}} if tag else {}
    for side, rows in (("a", d.only_a), ("b", d.only_b)):
        for r in rows:
            yield {"type": "coverage", "kind": "function", "only": side,
                   "module": r.module, "function": r.name,
                   "calls": r.a_calls if side == "a" else r.b_calls,
                   "insns": r.a_insns if side == "a" else r.b_insns, **extra}
    for side, rows, sym in (("a", d.edges_a, sa), ("b", d.edges_b, sb)):
        for e in rows:
            yield {"type": "coverage", "kind": "edge", "only": side,
                   "from": e.frm, "from_at": sym.describe(e.frm),
                   "to": e.to, "to_at": sym.describe(e.to),
                   "count": e.count, **extra}
    for r in d.most:
        yield {"type": "coverage", "kind": "count", "module": r.module,
               "function": r.name, "calls": {"a": r.a_calls, "b": r.b_calls},
               "insns": {"a": r.a_insns, "b": r.b_insns}, **extra}
    if d.skipped:
        yield {"type": "coverage", "kind": "note",
               "text": "edges not compared in other builds' code: " +
               ", ".join(d.skipped), **extra}
