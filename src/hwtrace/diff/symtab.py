"""The code one process of one run mapped, for whole arrays of addresses.

:class:`Module` is one mapped file (its symbols come from
:class:`hwtrace.analysis.symbols.Image`), :class:`SymTab` all of a
process's modules with every function in sorted numpy arrays, so that
naming a chunk of steps is one ``searchsorted``.  Function ids index
:attr:`SymTab.names`; code outside every function gets the id of its
module's "[unknown]" bucket (``-1`` outside every module).

No I/O beyond what ``Image`` reads from the ELF files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hwtrace.analysis.symtable import unnamed


@dataclass
class Module:
    """One file mapped into a process."""

    path: str               # the file read (a bundle's copy, or the recorded path)
    file: str               # the name the recording gave it
    build_id: str | None
    low: int
    high: int
    image: object           # hwtrace.analysis.symbols.Image (or None)
    main: bool = False      # the process's executable

    @property
    def bias(self) -> int:
        return self.image.bias if self.image is not None else self.low

    @property
    def base(self) -> str:
        return os.path.basename(self.file or self.path)


class SymTab:
    """Functions of a list of :class:`Module` s."""

    def __init__(self, modules: list[Module]):
        self.modules = sorted(modules, key=lambda m: m.low)
        starts, ends, fids = [], [], []
        self.names: list[str] = []          # function id -> name
        self.module_of: list[int] = []      # function id -> module index
        self.func_start: list[int] = []     # function id -> start (0: bucket)
        self._unknown: list[int] = []       # module index -> its bucket's id
        for mi, m in enumerate(self.modules):
            funcs = []
            if m.image is not None:
                seen = set()
                for s, size, name in m.image.functions():
                    if s in seen:
                        continue
                    seen.add(s)
                    funcs.append((s, s + max(size, 1), name))
            funcs.sort()
            for k, (s, e, name) in enumerate(funcs):
                if k + 1 < len(funcs):
                    e = min(e, funcs[k + 1][0])     # overlapping symbols: clip
                starts.append(s)
                ends.append(e)
                fids.append(len(self.names))
                self.names.append(name)
                self.module_of.append(mi)
                self.func_start.append(s)
            self._unknown.append(len(self.names))
            self.names.append(f"[{m.base}]")
            self.module_of.append(mi)
            self.func_start.append(0)
        order = np.argsort(np.array(starts, np.uint64), kind="stable")
        self.starts = np.array(starts, np.uint64)[order]
        self.ends = np.array(ends, np.uint64)[order]
        self.fids = np.array(fids, np.int64)[order]
        self.mod_lo = np.array([m.low for m in self.modules], np.uint64)
        self.mod_hi = np.array([m.high for m in self.modules], np.uint64)
        self.unknown_ids = np.array(self._unknown, np.int64)
        self._by_name: dict | None = None
        # lookup's answer only changes at a function's or a module's start
        # or end: its answer at each such boundary holds up to the next, so
        # one searchsorted over the boundaries names any address
        self._bounds = np.unique(np.concatenate(
            [self.starts, self.ends, self.mod_lo, self.mod_hi]))
        self._ids = self._lookup_each(self._bounds)

    # -- arrays ------------------------------------------------------------------

    def lookup(self, addrs: np.ndarray) -> np.ndarray:
        """Function id of each address (its module's bucket outside every
        function, -1 outside every module)."""
        addrs = np.asarray(addrs, np.uint64)
        if not len(self._bounds):
            return np.full(len(addrs), -1, np.int64)
        i = np.searchsorted(self._bounds, addrs, side="right") - 1
        out = self._ids[i]              # i == -1: below every boundary ...
        out[i < 0] = -1                 # ... outside every module
        return out

    def _lookup_each(self, addrs: np.ndarray) -> np.ndarray:
        """:meth:`lookup` the long way: the function whose start is the
        last at or before each address, if the address is before its end,
        else the module's bucket (what :meth:`lookup`'s table holds)."""
        addrs = np.asarray(addrs, np.uint64)
        out = np.full(len(addrs), -1, np.int64)
        if len(self.starts):
            k = np.searchsorted(self.starts, addrs, side="right") - 1
            kk = np.maximum(k, 0)
            hit = (k >= 0) & (addrs < self.ends[kk])
            out[hit] = self.fids[kk[hit]]
        else:
            hit = np.zeros(len(addrs), bool)
        if len(self.mod_lo):
            rest = ~hit
            m = np.searchsorted(self.mod_lo, addrs[rest], side="right") - 1
            mm = np.maximum(m, 0)
            inmod = (m >= 0) & (addrs[rest] < self.mod_hi[mm])
            ids = np.where(inmod, self.unknown_ids[mm], -1)
            out[rest] = ids
        return out

    # -- one address -----------------------------------------------------------------

    def func(self, addr: int) -> int:
        return int(self.lookup(np.array([addr], np.uint64))[0])

    def module(self, addr: int) -> Module | None:
        for m in self.modules:
            if m.low <= addr < m.high:
                return m
        return None

    def name(self, fid: int) -> str:
        return self.names[fid] if fid >= 0 else "[unknown]"

    def describe(self, addr: int) -> str:
        """``function+0xoff`` (or the bare address outside every function)."""
        fid = self.func(addr)
        if fid < 0 or self.func_start[fid] == 0:
            m = self.module(addr)
            if m is not None:
                return unnamed(m.base, addr - m.bias)
            return f"0x{addr:x}"
        off = addr - self.func_start[fid]
        return self.names[fid] if off == 0 else f"{self.names[fid]}+0x{off:x}"

    def line(self, addr: int) -> str | None:
        """``file:line`` from the debug info, where there is some."""
        m = self.module(addr)
        if m is None or m.image is None:
            return None
        try:
            r = m.image.line(addr)
        except Exception:           # noqa: BLE001 - DWARF of any quality
            return None
        if r is None:
            return None
        return f"{r[0]}:{r[1]}"

    def key(self, fid: int) -> tuple[str, str]:
        """A function's identity across runs: (module name, function name)."""
        return (self.modules[self.module_of[fid]].base, self.names[fid]) \
            if fid >= 0 else ("", "[unknown]")

    def by_name(self, module: int) -> dict:
        """{name: (start, end)} of one module's functions."""
        if self._by_name is None:
            d: dict = {}
            for s, e, fid in zip(self.starts.tolist(), self.ends.tolist(),
                                 self.fids.tolist()):
                d.setdefault(self.module_of[fid], {}).setdefault(
                    self.names[fid], (s, e))
            self._by_name = d
        return self._by_name.get(module, {})


def process_symtab(traceset, pid: int | None) -> SymTab:
    """The modules process ``pid`` of ``traceset`` (a
    :class:`hwtrace.streams.TraceSet`) mapped, all of its exec epochs
    (later ones win where they overlap); every module the trace set knows
    when the pid is unknown."""
    sym = traceset.symbolizer
    spaces = traceset.spaces
    maps = []
    exe = None
    if spaces is not None and pid is not None:
        for sp in spaces.spaces:
            if sp.pid == pid:
                maps.extend(sp.mappings)
                exe = sp.exe or exe
    modules: dict = {}
    images = list(sym.images)
    if maps:
        for mf in maps:
            img = next((i for i in images if i.path == mf.path
                        and i.contains(mf.start)), None)
            if img is not None:
                key = (img.path, img.low)
                modules[key] = Module(img.path, mf.file, img.build_id, img.low,
                                      img.high, img,
                                      main=bool(exe) and mf.file == exe)
            else:
                key = (mf.path, mf.start)
                modules.setdefault(key, Module(mf.path, mf.file, None,
                                               mf.start, mf.start + mf.size,
                                               None))
    else:
        for img in images:
            modules[(img.path, img.low)] = Module(img.path, img.path,
                                                  img.build_id, img.low,
                                                  img.high, img)
    # overlapping modules (an exec reused the addresses): the later wins
    out: list[Module] = []
    for m in modules.values():
        out = [o for o in out if o.high <= m.low or o.low >= m.high]
        out.append(m)
    return SymTab(out)
