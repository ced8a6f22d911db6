"""What each run executed, and what only one of them did (no I/O).

:class:`Coverage` is a tap on a :class:`~.steps.StepReader`: it sees
every chunk of steps as it is read and counts, per function (of the
process's :class:`~.symtab.SymTab`), the instructions run in it and the
calls into it, and per edge -- a branch and the instruction executed
after it -- how often it was taken.  Everything is numpy per chunk;
memory grows with the code run, not with the trace.

:func:`difference` sets two runs' counts side by side: functions only
one run executed (by module and name), edges only one run took (B's
addresses translated into A's, see :mod:`.relocate`; only in modules both
runs have the same build of -- another build's edges are other code), and
the functions run by both whose call or instruction counts differ most.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .counting import PairCounter, pairs_in
from .steps import OTHER, PTWRITE
from .symtab import SymTab

class Coverage:
    """Counts of one thread's steps (own addresses)."""

    def __init__(self, symtab: SymTab):
        self.sym = symtab
        n = len(symtab.names) + 1               # slot 0: outside every module
        self.insns = np.zeros(n, np.int64)
        self.calls = np.zeros(n, np.int64)
        self.edge_counter = PairCounter()
        self._last = None                       # last step of the previous chunk

    def __call__(self, steps: np.ndarray) -> None:
        if not len(steps):
            return
        fid = self.sym.lookup(steps["rip"]) + 1
        self.insns += np.bincount(fid, weights=steps["n"],
                                  minlength=len(self.insns)).astype(np.int64)
        # calls: the step after a call begins the callee
        called = np.zeros(len(steps), bool)
        called[1:] = steps["delta"][:-1] > 0
        # edges: a step ending in a branch, and the next one (no gap between)
        cls = steps["cls"]
        branch = (cls != OTHER) & (cls != PTWRITE)
        link = branch[:-1] & (steps["gap"][1:] == 0)
        frm = steps["rend"][:-1][link]
        to = steps["rip"][1:][link]
        last = self._last
        if last is not None:
            called[0] = last["delta"] > 0
            if last["cls"] not in (OTHER, PTWRITE) and not steps["gap"][0]:
                frm = np.concatenate([[last["rend"]], frm])
                to = np.concatenate([[steps["rip"][0]], to])
        self.calls += np.bincount(fid[called], minlength=len(self.calls))
        self._last = steps[-1].copy()
        self.edge_counter.add(frm, to)

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(from, to, count) of every edge, sorted."""
        return self.edge_counter.items()

    def merge(self, other: "Coverage") -> None:
        """Add another thread's counts (same process, same SymTab)."""
        self.insns += other.insns
        self.calls += other.calls
        self.edge_counter.merge(other.edge_counter)

    def functions(self) -> dict:
        """{(module, name): (calls, insns)} of the functions run."""
        out = {}
        for i in np.flatnonzero(self.insns | self.calls).tolist():
            key = self.sym.key(i - 1)
            c, n = out.get(key, (0, 0))
            out[key] = (c + int(self.calls[i]), n + int(self.insns[i]))
        return out


@dataclass
class FunctionRow:
    module: str
    name: str
    a_calls: int = 0
    b_calls: int = 0
    a_insns: int = 0
    b_insns: int = 0


@dataclass
class EdgeRow:
    side: str                   # "a" | "b": the run that took it
    frm: int                    # own addresses
    to: int
    count: int


@dataclass
class CoverageDiff:
    only_a: list = field(default_factory=list)      # FunctionRow
    only_b: list = field(default_factory=list)
    edges_a: list = field(default_factory=list)     # EdgeRow
    edges_b: list = field(default_factory=list)
    most: list = field(default_factory=list)        # FunctionRow, both ran
    skipped: list = field(default_factory=list)     # B modules not edge-compared

    @property
    def same(self) -> bool:
        return not (self.only_a or self.only_b or self.edges_a or
                    self.edges_b or self.most)


def difference(a: Coverage, b: Coverage, relocate, top: int = 10) -> CoverageDiff:
    """A's and B's counts set side by side (``relocate``: a
    :class:`~.relocate.Relocation` of B's addresses into A's)."""
    d = CoverageDiff()
    fa = a.functions()
    rename = relocate.module_names()
    fb = {}
    for (mod, name), v in b.functions().items():
        k = (rename.get(mod, mod), name)
        c, n = fb.get(k, (0, 0))
        fb[k] = (c + v[0], n + v[1])
    for key, (c, n) in sorted(fa.items(), key=lambda kv: -kv[1][1]):
        if key not in fb:
            d.only_a.append(FunctionRow(key[0], key[1], a_calls=c, a_insns=n))
    for key, (c, n) in sorted(fb.items(), key=lambda kv: -kv[1][1]):
        if key not in fa:
            d.only_b.append(FunctionRow(key[0], key[1], b_calls=c, b_insns=n))
    both = []
    for key in fa.keys() & fb.keys():
        (ca, na), (cb, nb) = fa[key], fb[key]
        if ca != cb or na != nb:
            both.append(FunctionRow(key[0], key[1], ca, cb, na, nb))
    both.sort(key=lambda r: (-abs(r.a_insns - r.b_insns),
                             -abs(r.a_calls - r.b_calls), r.name))
    d.most = both[:top]
    _edges(d, a, b, relocate)
    return d


def _edges(d: CoverageDiff, a: Coverage, b: Coverage, relocate) -> None:
    """Edges only one run took, in the code both runs have the same
    build of (by address, or by module offset)."""
    same_b = _same_code(b.sym, relocate, d)
    same_a = _same_code(a.sym, None, None, relocate)
    af, at, ac = a.edges()
    bf, bt, bc = b.edges()
    tf, tt = relocate(bf), relocate(bt)
    ok_a = same_a(af) & same_a(at)
    ok_b = same_b(bf) & same_b(bt)
    in_b = pairs_in(af, at, tf[ok_b], tt[ok_b])
    in_a = pairs_in(tf, tt, af, at)
    for i in np.flatnonzero(ok_a & ~in_b).tolist():
        d.edges_a.append(EdgeRow("a", int(af[i]), int(at[i]), int(ac[i])))
    for i in np.flatnonzero(ok_b & ~in_a).tolist():
        d.edges_b.append(EdgeRow("b", int(bf[i]), int(bt[i]), int(bc[i])))


def _same_code(sym: SymTab, relocate, d, other=None):
    """A predicate on addresses of ``sym``'s process: in a module the two
    runs have the same build of (B's side: from ``relocate``'s notes)."""
    notes = (relocate or other).notes
    if relocate is not None:
        other_files = {n.b for n in notes if n.how == "symbol"}
        if d is not None:
            d.skipped = sorted({n.b for n in notes if n.how == "symbol"})
    else:
        other_files = {n.a for n in notes if n.how == "symbol"}
    bad = [(m.low, m.high) for m in sym.modules if m.file in other_files]

    def pred(addrs: np.ndarray) -> np.ndarray:
        ok = np.ones(len(addrs), bool)
        for lo, hi in bad:
            ok &= ~((addrs >= lo) & (addrs < hi))
        return ok
    return pred
