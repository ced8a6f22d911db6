"""Run B's code addresses in run A's terms, so equal code compares equal.

Two recordings of one program need not run it at the same addresses: the
loader, the libraries and a PIE executable move with ASLR (the native
engines), and a different build moves everything.  :func:`relocation`
pairs the modules of one process of each run and returns a
:class:`Relocation` that maps any array of B's addresses to A's:

* a file with the same build-id in both runs (the same bytes) is compared
  by its offset in the module: B's addresses move by the difference of
  the two load biases (nothing moves when they are loaded alike);
* the same file name (or the process's executable) with a different
  build-id is a different build: its code is compared by symbol+offset,
  each of B's functions moves onto A's function of that name; code of B
  that A has no function for (or past the end of A's function) matches
  nothing;
* a module only B has matches nothing.

"Matches nothing" is B's address with bit 63 flipped: a value no
user-space or kernel code address of A can have.  Addresses outside
every module of B (JIT code, an unnamed mapping) stay as they are.

:attr:`Relocation.notes` says, for the report, how each module pair was
compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .symtab import SymTab

#: flipped into an address of B that has no counterpart in A
FOREIGN = np.uint64(1 << 63)


@dataclass
class Note:
    """How one module of B was compared with A's."""

    how: str                    # "address" | "module" | "symbol" | "none"
    a: str | None               # A's file
    b: str                      # B's file
    a_build: str | None = None
    b_build: str | None = None
    moved: int = 0              # module: A's bias - B's bias
    matched: int = 0            # symbol: functions found by name in both
    unmatched: int = 0          # symbol: B's functions A has not
    low: int = 0                # B's module
    high: int = 0


@dataclass
class Relocation:
    """B address -> A address, piecewise by ranges of B's addresses."""

    lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    hi: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    delta: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    foreign: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    notes: list = field(default_factory=list)

    @property
    def identity(self) -> bool:
        return len(self.lo) == 0

    @property
    def by(self) -> str:
        """The strongest rule any module needed: "symbol+offset",
        "module+offset" or "address"."""
        hows = {n.how for n in self.notes}
        if "symbol" in hows:
            return "symbol+offset"
        if "module" in hows:
            return "module+offset"
        return "address"

    def __call__(self, addrs: np.ndarray) -> np.ndarray:
        if self.identity:
            return addrs
        addrs = np.asarray(addrs, np.uint64)
        k = np.searchsorted(self.lo, addrs, side="right") - 1
        kk = np.maximum(k, 0)
        inr = (k >= 0) & (addrs < self.hi[kk])
        out = addrs.copy()
        moved = inr & ~self.foreign[kk]
        out[moved] = addrs[moved] + self.delta[kk[moved]]
        gone = inr & self.foreign[kk]
        out[gone] = addrs[gone] ^ FOREIGN
        return out

    def one(self, addr: int) -> int:
        return int(self(np.array([addr], np.uint64))[0])

    def how_at(self, addr: int) -> str | None:
        """How B's code at ``addr`` is compared ("address", "module",
        "symbol", "none"; None outside every module)."""
        for n in self.notes:
            if n.low <= addr < n.high:
                return n.how
        return None

    def module_names(self) -> dict:
        """{B's module name: A's} for the modules paired."""
        import os
        return {os.path.basename(n.b): os.path.basename(n.a)
                for n in self.notes if n.a is not None}


def relocation(a: SymTab, b: SymTab) -> Relocation:
    """How to read B's addresses as A's (see the module doc)."""
    ranges: list[tuple[int, int, int, bool]] = []
    notes: list[Note] = []
    used: set[int] = set()
    by_build: dict[str, list[int]] = {}
    for i, m in enumerate(a.modules):
        if m.build_id:
            by_build.setdefault(m.build_id, []).append(i)
    for bi, mb in enumerate(b.modules):
        ai = _same_file(a, by_build.get(mb.build_id, ()), mb, used) if mb.build_id else None
        if ai is not None:
            ma = a.modules[ai]
            used.add(ai)
            if ma.bias == mb.bias and ma.low == mb.low:
                notes.append(Note("address", ma.file, mb.file, ma.build_id,
                                  mb.build_id, low=mb.low, high=mb.high))
            else:
                d = ma.bias - mb.bias
                ranges.append((mb.low, mb.high, d, False))
                notes.append(Note("module", ma.file, mb.file, ma.build_id,
                                  mb.build_id, moved=d, low=mb.low,
                                  high=mb.high))
            continue
        ai = _counterpart(a, mb, used)
        if ai is None:
            ranges.append((mb.low, mb.high, 0, True))
            notes.append(Note("none", None, mb.file, None, mb.build_id,
                              low=mb.low, high=mb.high))
            continue
        used.add(ai)
        ma = a.modules[ai]
        if ma.build_id == mb.build_id and ma.low == mb.low and \
                ma.bias == mb.bias:
            # no build-ids to tell (files without a note): same name, same place
            notes.append(Note("address", ma.file, mb.file, low=mb.low,
                              high=mb.high))
            continue
        note = Note("symbol", ma.file, mb.file, ma.build_id, mb.build_id,
                    low=mb.low, high=mb.high)
        ranges.extend(_by_symbol(a, ai, b, bi, note))
        notes.append(note)
    ranges.sort()
    rel = Relocation(notes=notes)
    if ranges:
        rel.lo = np.array([r[0] for r in ranges], np.uint64)
        rel.hi = np.array([r[1] for r in ranges], np.uint64)
        rel.delta = np.array([r[2] & 0xFFFFFFFFFFFFFFFF for r in ranges],
                             np.uint64)
        rel.foreign = np.array([r[3] for r in ranges], bool)
    return rel


def _same_file(a: SymTab, candidates, mb, used) -> int | None:
    """Which of A's modules with ``mb``'s build-id (``candidates``) is
    its counterpart: the one at the same place, else the first not paired
    yet, else the first.  A process that exec'd maps the loader and libc
    once per program, at other places: each pairs with its like."""
    for i in candidates:
        ma = a.modules[i]
        if ma.low == mb.low and ma.bias == mb.bias:
            return i
    for i in candidates:
        if i not in used:
            return i
    return candidates[0] if candidates else None


def _counterpart(a: SymTab, mb, used) -> int | None:
    """A's module B's ``mb`` is another build of: the executable for the
    executable, else the same file name."""
    for i, ma in enumerate(a.modules):
        if i not in used and ma.main and mb.main:
            return i
    for i, ma in enumerate(a.modules):
        if i not in used and ma.base == mb.base:
            return i
    return None


def _by_symbol(a: SymTab, ai: int, b: SymTab, bi: int, note: Note) -> list:
    """Ranges moving each function of B's module ``bi`` onto A's function
    of that name in module ``ai``; the rest of the module is foreign."""
    mb = b.modules[bi]
    fa = a.by_name(ai)
    fb = sorted((s, e, name) for name, (s, e) in b.by_name(bi).items())
    out = []
    pos = mb.low
    for s, e, name in fb:
        if s > pos:
            out.append((pos, s, 0, True))
        hit = fa.get(name)
        if hit is None:
            note.unmatched += 1
            out.append((s, e, 0, True))
        else:
            note.matched += 1
            sa, ea = hit
            keep = min(e - s, ea - sa)
            out.append((s, s + keep, sa - s, False))
            if s + keep < e:
                out.append((s + keep, e, 0, True))
        pos = max(pos, e)
    if pos < mb.high:
        out.append((pos, mb.high, 0, True))
    return out
