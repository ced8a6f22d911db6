"""Branch records as text or JSON lines, a chunk at a time (no I/O but
the ``write`` it is given).

Records come as numpy arrays of :func:`hwtrace.branches.records.dtype`
(unknown pid/tid/time -1, unknown depth INT32_MIN, an end in untraced code
0); lines are built a column at a time (:mod:`hwtrace.export.textcols`):

* jsonl: ``{"pid":..,"tid":..,"kind":..,"from":..,"to":..,"time":..,
  "depth":..,"from_sym":..,"to_sym":..}`` -- ``null`` for an unknown
  pid/tid/end, ``time``/``depth`` only where known, ``*_sym`` (function,
  ``+0xOFF`` inside it) only where an image names the address, and with
  ``lines`` ``from_line``/``to_line`` (``file:line``) where DWARF does;
* text: ``pid/tid depth kind from sym -> to sym`` (``?`` for an end in
  untraced code).
"""

from __future__ import annotations

import json

import numpy as np

from hwtrace._unique import unique
from hwtrace.branches.records import KINDS
from hwtrace.export.textcols import Lines

_NODEPTH = -(1 << 31)
_KIND_JSON = [json.dumps(k).encode() for k in KINDS]
_KIND_TEXT = [k.encode() for k in KINDS]


class Namer:
    """Addresses to ``func`` / ``func+0xOFF`` (and ``file:line``),
    vectorized over an :class:`hwtrace.analysis.symtable.AddrTable`."""

    def __init__(self, symbolizer, lines: bool = False):
        from hwtrace.analysis.slices import NameTable
        from hwtrace.analysis.symtable import AddrTable
        self.sym = symbolizer
        self.names = NameTable()
        self.table = AddrTable(symbolizer.lookup if symbolizer is not None else None,
                               self.names)
        self.lines = lines
        self._line_cache: dict[int, bytes] = {}
        self.sym_json: dict[int, str | None] = {}
        self.sym_index = None       # the compiled formatter's (SymIndex)

    def names_of(self, addr: np.ndarray, ok: np.ndarray):
        """(name id, offset, named) per address (``ok``: the address is
        known at all): a function and the offset in it, or inside an
        image but no function its ``FILE+0xLINK`` name (offset 0)."""
        if self.sym is None or not len(addr):
            z = np.zeros(len(addr), np.int64)
            return z, z, np.zeros(len(addr), bool)
        start, nid, known = self.table.resolve(addr)
        if not known.all():
            unk = np.flatnonzero(~known)
            known[unk] = self.table.in_image(addr[unk])
        known &= ok
        return nid.astype(np.int64), (addr - start).astype(np.int64), known

    def line_ids(self, addr: np.ndarray, ok: np.ndarray):
        """(table, ids) of ``file:line`` strings ('' where unknown)."""
        u, inv = np.unique(np.where(ok, addr, 0), return_inverse=True)
        table = []
        c = self._line_cache
        for a in u.tolist():
            s = c.get(a)
            if s is None:
                s = b""
                if a and self.sym is not None:
                    try:
                        r = self.sym.line(a)
                    except Exception:      # unreadable DWARF names no line
                        r = None
                    if r:
                        s = f"{r[0]}:{r[1]}".encode()
                if len(c) < 1 << 20:
                    c[a] = s
            table.append(s)
        return table, np.asarray(inv).reshape(-1)


class SpaceNamers:
    """A :class:`Namer` per address space, for records of a bundle whose
    processes run different programs at the same addresses: a record is
    named in the space its pid ran at its time (the last begun by then;
    with no time, the pid's latest) -- ``spaces``, the bundle's
    :class:`~hwtrace.flow.spaces.AddressSpaces`; ``lookup_of(space)``, a
    lookup over its files (:meth:`hwtrace.streams.TraceSet.space_lookup`);
    records of no known space get ``fallback``."""

    def __init__(self, spaces, lookup_of, fallback: Namer, lines: bool = False):
        self.fallback = fallback
        self.lines = lines
        self._lookup_of = lookup_of
        self._index = {id(sp): k for k, sp in enumerate(spaces.spaces)}
        self._spaces = spaces.spaces
        self._by_pid = {}
        for pid in {sp.pid for sp in spaces.spaces}:
            lst = sorted((sp for sp in spaces.spaces if sp.pid == pid), key=lambda sp: sp.time)
            self._by_pid[pid] = (np.array([sp.time for sp in lst], np.int64),
                                 np.array([self._index[id(sp)] for sp in lst], np.int64))
        self._namers: dict = {}

    def keys(self, a: np.ndarray) -> np.ndarray:
        """The space (an index, -1: none) of each record."""
        out = np.full(len(a), -1, np.int64)
        pid, tm = a["pid"], a["time"]
        for p in np.unique(pid).tolist():
            got = self._by_pid.get(p)
            if got is None:
                continue
            times, idx = got
            at = np.flatnonzero(pid == p)
            t = tm[at]
            j = np.searchsorted(times, t, side="right") - 1
            j = np.where(t < 0, len(times) - 1, np.maximum(j, 0))
            out[at] = idx[j]
        return out

    def namer(self, key: int) -> Namer:
        if key < 0:
            return self.fallback
        lookup = self._lookup_of(self._spaces[key])
        n = self._namers.get(id(lookup))
        if n is None:
            n = self._namers[id(lookup)] = (lookup, Namer(lookup.__self__, lines=self.lines))
        return n[1]


def format_spaced(a: np.ndarray, namers: SpaceNamers, fmt: str) -> bytes:
    """:func:`format_chunk` of each run of records in one space, with
    that space's namer."""
    if not len(a):
        return b""
    keys = namers.keys(a)
    cut = (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
    return b"".join(format_chunk(a[s:e], namers.namer(int(keys[s])), fmt)
                    for s, e in zip([0, *cut], [*cut, len(a)]))


def format_chunk(a: np.ndarray, namer: Namer, fmt: str,
                 impl: str | None = None) -> bytes:
    """The lines of a chunk of records (``impl``: "python" or "compiled"
    for the jsonl formatter, default the selector's choice)."""
    if fmt == "jsonl" and not namer.lines:
        return _jsonl_fast(a, namer, impl)
    return _format_cols(a, namer, fmt)


_KJ = [json.dumps(k) for k in KINDS]


def _jsonl_fast(a: np.ndarray, namer: Namer, impl: str | None = None) -> bytes:
    """jsonl by Python's %-formatting over the columns (as lists): for
    lines this wide, faster than assembling columns; each address's
    ``"from_sym"``/``"to_sym"`` text made once.  The compiled core
    (hwtrace.branches._c_format), where it loaded, writes the same bytes
    from the columns and a table of the chunk's addresses' texts."""
    n = len(a)
    if not n:
        return b""
    frm, to = a["from"], a["to"]
    from hwtrace.branches import _impl
    core = _impl.core_for(impl)
    if core is not None:
        return _jsonl_compiled(core, a, namer)
    fok, tok = frm != 0, to != 0
    cache = namer.sym_json
    addrs = unique(np.concatenate((frm[fok], to[tok])))
    new = addrs[[x not in cache for x in addrs.tolist()]] if cache else addrs
    if len(new):
        nid, off, known = namer.names_of(new, np.ones(len(new), bool))
        for ad, i, o, k in zip(new.tolist(), nid.tolist(), off.tolist(), known.tolist()):
            if k:
                name = namer.names.json_bytes(i).decode()[1:-1]
                cache[ad] = f"{name}+{o:#x}" if o else name
            else:
                cache[ad] = None
    out = []
    add = out.append
    KJ = _KJ
    get = cache.get
    for pid, tid, kind, f, t, tm, dp in zip(a["pid"].tolist(), a["tid"].tolist(),
                                            a["kind"].tolist(), frm.tolist(), to.tolist(),
                                            a["time"].tolist(), a["depth"].tolist()):
        line = '{"pid":%s,"tid":%s,"kind":%s,"from":%s,"to":%s' % (
            pid if pid >= 0 else "null", tid if tid >= 0 else "null", KJ[kind],
            f if f else "null", t if t else "null")
        if tm >= 0:
            line += ',"time":%d' % tm
        if dp != _NODEPTH:
            line += ',"depth":%d' % dp
        fs = get(f) if f else None
        if fs is not None:
            line += ',"from_sym":"%s"' % fs
        ts = get(t) if t else None
        if ts is not None:
            line += ',"to_sym":"%s"' % ts
        add(line)
    out.append("")
    return "}\n".join(out).encode()


def _jsonl_compiled(core, a: np.ndarray, namer: Namer) -> bytes:
    """jsonl by the compiled core: its index of addresses' symbol texts
    (kept on the namer, across chunks) gets the chunk's new addresses,
    named here as the twin names them."""
    idx = namer.sym_index
    if idx is None or not isinstance(idx, core.SymIndex):
        idx = namer.sym_index = core.SymIndex()
    frm, to = _col(a, "from", np.uint64), _col(a, "to", np.uint64)
    new = np.sort(np.frombuffer(idx.missing(frm, to), np.uint64))
    if len(new):
        nid, off, known = namer.names_of(new, np.ones(len(new), bool))
        texts = []
        for i, o, k in zip(nid.tolist(), off.tolist(), known.tolist()):
            if k:
                name = namer.names.json_bytes(i)[1:-1]
                texts.append(name + b"+%#x" % o if o else name)
            else:
                texts.append(None)
        idx.add(new, texts)
    return idx.jsonl(_col(a, "pid", np.int64), _col(a, "tid", np.int64),
                     _col(a, "kind", np.uint8), frm, to, _col(a, "time", np.int64),
                     _col(a, "depth", np.int32), _KJB)


def _col(a: np.ndarray, name: str, typ) -> np.ndarray:
    """A field of the records as the compiled core reads it: the field
    itself (strided: no copy) where it has the type, else a copy."""
    c = a[name]
    return c if c.dtype == typ and c.ndim == 1 else np.ascontiguousarray(c, typ)


_KJB = [k.encode() for k in _KJ]


def _format_cols(a: np.ndarray, namer: Namer, fmt: str) -> bytes:
    n = len(a)
    if not n:
        return b""
    t = Lines(n)
    frm, to = a["from"], a["to"]
    fok, tok = frm != 0, to != 0
    fn, fo, fk = namer.names_of(frm, fok)
    tn, to_, tk = namer.names_of(to, tok)
    u = unique(np.concatenate((fn[fk], tn[tk])))
    top = int(u.max()) + 1 if len(u) else 1
    names = namer.names
    if fmt == "jsonl":
        _jsonl(t, a, names, u, top, fok, tok, fn, fo, fk, tn, to_, tk, namer)
    else:
        _text(t, a, names, u, top, fok, tok, fn, fo, fk, tn, to_, tk, namer)
    return t.text()


def _sym(t: Lines, table, nid, off, known):
    """``name`` or ``name+0xOFF`` where known."""
    t.strs(table, np.where(known, nid, 0)).only(known)
    inside = known & (off != 0)
    t.when(inside, b"+0x")
    t.hex(off, b"").only(inside)


def _jsonl(t, a, names, u, top, fok, tok, fn, fo, fk, tn, to_, tk, namer):
    jtab = [b""] * top
    for i in u.tolist():
        jtab[i] = names.json_bytes(i)[1:-1]
    pid, tid = a["pid"], a["tid"]
    t.lit(b'{"pid":')
    t.int(pid).only(pid >= 0).when(pid < 0, b"null")
    t.lit(b',"tid":')
    t.int(tid).only(tid >= 0).when(tid < 0, b"null")
    t.lit(b',"kind":').strs(_KIND_JSON, a["kind"].astype(np.int64))
    t.lit(b',"from":')
    t.int(a["from"]).only(fok).when(~fok, b"null")
    t.lit(b',"to":')
    t.int(a["to"]).only(tok).when(~tok, b"null")
    tm = a["time"] >= 0
    t.when(tm, b',"time":').int(np.maximum(a["time"], 0)).only(tm)
    dp = a["depth"] != _NODEPTH
    t.when(dp, b',"depth":').int(np.where(dp, a["depth"], 0)).only(dp)
    t.when(fk, b',"from_sym":"')
    _sym(t, jtab, fn, fo, fk)
    t.when(fk, b'"')
    t.when(tk, b',"to_sym":"')
    _sym(t, jtab, tn, to_, tk)
    t.when(tk, b'"')
    if namer.lines:
        for key, addr, ok in ((b',"from_line":', a["from"], fok), (b',"to_line":', a["to"], tok)):
            tab, ids = namer.line_ids(addr, ok)
            jt = [json.dumps(s.decode()).encode() if s else b"" for s in tab]
            has = np.array([bool(s) for s in tab])[ids]
            t.when(has, key).strs(jt, ids).only(has)
    t.lit(b"}\n")


def _text(t, a, names, u, top, fok, tok, fn, fo, fk, tn, to_, tk, namer):
    ttab = [b""] * top
    for i in u.tolist():
        ttab[i] = names[i].encode("utf-8", "replace")
    pid, tid = a["pid"], a["tid"]
    # who: pid/tid, tid, or -  (right-aligned in 13)
    who = Lines(len(a))
    hp, ht = pid >= 0, tid >= 0
    who.int(pid).only(hp).when(hp, b"/").int(tid).only(ht)
    who.when(~hp & ~ht, b"-")
    t.spaces(13 - who.lengths())
    t.extend(who)
    t.lit(b" ")
    dp = a["depth"] != _NODEPTH
    t.int(np.where(dp, a["depth"], 0), 3).only(dp).when(dp, b" ")
    kinds = a["kind"].astype(np.int64)
    t.strs(_KIND_TEXT, kinds, 14)
    t.lit(b" ")
    _end(t, a["from"], fok, ttab, fn, fo, fk, namer)
    t.lit(b" -> ")
    _end(t, a["to"], tok, ttab, tn, to_, tk, namer)
    t.lit(b"\n")


def _end(t, addr, ok, tab, nid, off, known, namer):
    t.when(~ok, b"?")
    t.when(ok, b"0x")
    t.hex(addr, b"").only(ok)
    t.when(known, b" ")
    _sym(t, tab, nid, off, known)
    if namer.lines:
        ltab, ids = namer.line_ids(addr, ok)
        has = np.array([bool(s) for s in ltab])[ids]
        t.when(has & known, b" ").when(has & ~known, b" ")
        t.when(has, b"(").strs(ltab, ids).only(has).when(has, b")")
