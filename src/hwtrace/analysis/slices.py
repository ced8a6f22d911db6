"""Activations in columns: what the call-stack builder hands every view.

The builder (:mod:`.callstack`) reconstructs millions of activations from
a long trace; none of them becomes a Python object.  It hands views
:class:`Slices` chunks instead, each a pair of numpy record arrays of
dtype :data:`SLICE` and a short list of markers:

* ``enters``: activations that *began* (in the order they began: ``eseq``);
  only the begin fields are meaningful;
* ``exits``: activations that *ended* (in the order they ended: ``xseq``),
  every field set.

``eseq``/``xseq`` are the builder's event sequence numbers: every begin,
end, marker and clock anchor gets the next one in execution order, so
merging enters, exits and markers by them gives the timeline exactly as
the builder lived it (ties do not exist).  A child's interval
``[eseq, xseq]`` lies strictly inside its parent's.  Times are in the
stream's clock unit (:class:`hwtrace.analysis.clock.Clock`); ``name`` is
an id in the builder's :class:`NameTable`; ``path`` identifies the call
path (the names from the stack's bottom to this activation) by a hash the
builder registers in its :class:`PathTable`.

:func:`to_records` turns a chunk back into the classic record objects
(:class:`~.records.Enter`, :class:`~.records.Activation`,
:class:`~.records.Marker`) for small inputs and tests.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from hwtrace.analysis.records import Activation, Enter, Flag, Marker

SLICE = np.dtype([
    ("id", "<i8"),            # activation id, increasing in begin order
    ("parent", "<i8"),        # the caller's activation id, -1 at the bottom
    ("func", "<u8"),          # function start address (see UNKNOWN_FUNC)
    ("name", "<i4"),          # NameTable id
    ("depth", "<i4"),         # 0 = bottom of the reconstructed stack
    ("flags", "<u4"),         # records.Flag
    ("pid", "<i8"),           # process (-1 unknown)
    ("tid", "<i8"),           # thread (-1 unknown)
    ("begin_idx", "<i8"),     # instruction index of its first instruction
    ("end_idx", "<i8"),       # ... one past its last (exits)
    ("eseq", "<i8"),          # builder sequence number of its begin
    ("xseq", "<i8"),          # ... of its end (exits)
    ("path", "<u8"),          # call-path hash (PathTable)
    ("begin", "<f8"),         # time of begin_idx
    ("end", "<f8"),           # time of end_idx (exits)
    ("child_insns", "<i8"),   # instructions in callees (exits)
    ("child_time", "<f8"),    # time in callees (exits)
])

#: ``func`` of an activation whose code is unknown (``[untraced]`` & co.)
UNKNOWN_FUNC = np.uint64(0xFFFFFFFFFFFFFFFF)
_UNKNOWN = int(UNKNOWN_FUNC)

#: multiplier of the call-path hash: path = parent_path * PATH_MUL + name + 1
PATH_MUL = np.uint64(0x100000001B3)
PATH_ROOT = np.uint64(0)


_FIELDS = SLICE.names
_TYPES = [SLICE.fields[f][0] for f in _FIELDS]


class Cols:
    """Rows of :data:`SLICE` kept as one contiguous array per field (what
    the views read a field at a time, much faster than a structured
    array's strided fields).  ``c["field"]`` is a column, ``c[mask]`` /
    ``c[i:j]`` / ``c[index_array]`` the selected rows."""

    __slots__ = ("d", "n")
    dtype = SLICE

    def __init__(self, d: dict, n: int):
        self.d = d
        self.n = n

    @classmethod
    def zeros(cls, n: int = 0) -> "Cols":
        return cls({f: np.zeros(n, t) for f, t in zip(_FIELDS, _TYPES)}, n)

    @classmethod
    def from_records(cls, a: np.ndarray) -> "Cols":
        return cls({f: np.ascontiguousarray(a[f]) for f in _FIELDS}, len(a))

    @classmethod
    def from_rows(cls, rows: list) -> "Cols":
        return cls.from_records(np.array(rows, SLICE))

    @staticmethod
    def concat(parts: list) -> "Cols":
        parts = [p for p in parts if p.n]
        if not parts:
            return Cols.zeros()
        if len(parts) == 1:
            return parts[0]
        return Cols({f: np.concatenate([p.d[f] for p in parts]) for f in _FIELDS},
                    sum(p.n for p in parts))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):
        if isinstance(k, str):
            return self.d[k]
        d = {f: a[k] for f, a in self.d.items()}
        return Cols(d, len(next(iter(d.values()))))

    def __setitem__(self, k, v) -> None:
        self.d[k][...] = v

    def copy(self) -> "Cols":
        return Cols({f: a.copy() for f, a in self.d.items()}, self.n)

    def tolist(self) -> list[tuple]:
        cols = [self.d[f].tolist() for f in _FIELDS]
        return list(zip(*cols))


def empty(n: int = 0) -> Cols:
    return Cols.zeros(n)


class NameTable:
    """Function names by small integer id (one table per builder, shared
    by all its chunks)."""

    def __init__(self):
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self._cold: list[bool] = []
        self._json: list[bytes | None] = []
        self._cold_arr = np.zeros(0, bool)

    def __len__(self) -> int:
        return len(self.names)

    def id(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
            self._cold.append(".cold" in name)
            self._json.append(None)
        return i

    def ids(self, names) -> np.ndarray:
        return np.fromiter((self.id(n) for n in names), np.int32)

    def get(self, name: str) -> int | None:
        return self._ids.get(name)

    def __getitem__(self, i: int) -> str:
        return self.names[i]

    def cold(self) -> np.ndarray:
        """bool per id: the name is a ``.cold`` part (never a call target)."""
        if len(self._cold_arr) != len(self._cold):
            self._cold_arr = np.array(self._cold, bool)
        return self._cold_arr

    def json_bytes(self, i: int) -> bytes:
        """The name as a JSON string literal (cached)."""
        b = self._json[i]
        if b is None:
            b = self._json[i] = json.dumps(self.names[i]).encode()
        return b


class KeyIndex:
    """Distinct uint64 keys numbered 0, 1, ... in the order first added,
    by the compiled core's hash table (``keys_index`` / ``keys_find`` of
    :mod:`hwtrace.analysis._c_runs`) over arrays held here and grown here
    (slots at most half full).  One pass per added row, where the sorted
    tables (:class:`PathTable`'s and the folded writer's twins) sort every
    row they meet.  ``sums``: a float64 sum per key, added to in the
    order of the rows."""

    def __init__(self, core, sums: bool = False):
        self._core = core
        self._slots = np.full(1 << 12, -1, np.int64)
        self.keys = np.empty(1 << 11, np.uint64)
        self.sums = np.zeros(1 << 11, np.float64) if sums else None
        self.n = 0

    def _room(self, m: int) -> None:
        need = self.n + m
        if need > len(self.keys):
            cap = max(need, 2 * len(self.keys))
            keys = np.empty(cap, np.uint64)
            keys[:self.n] = self.keys[:self.n]
            self.keys = keys
            if self.sums is not None:
                sums = np.zeros(cap, np.float64)
                sums[:self.n] = self.sums[:self.n]
                self.sums = sums
        if 2 * need > len(self._slots):
            cap = len(self._slots)
            while cap < 2 * need:
                cap *= 2
            self._slots = np.full(cap, -1, np.int64)
            self._core.keys_index(self._slots, self.keys, 0, self.keys[:self.n].copy(),
                                  None, None, None, None)

    def add(self, keys: np.ndarray, w: np.ndarray | None = None,
            idx: bool = False, firsts: bool = False):
        """Add ``keys`` (and ``w`` to their sums): (each key's number or
        None, where each new key first came or None)."""
        keys = np.ascontiguousarray(keys, np.uint64)
        m = len(keys)
        self._room(m)
        out = np.empty(m, np.int64) if idx else None
        f = np.empty(m, np.int64) if firsts else None
        if w is not None:
            w = np.ascontiguousarray(w, np.float64)
        n0 = self.n
        self.n = self._core.keys_index(self._slots, self.keys, n0, keys, out, f,
                                       self.sums if w is not None else None, w)
        return out, (f[:self.n - n0] if firsts else None)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The number of every key (-1: not in the table)."""
        keys = np.ascontiguousarray(keys, np.uint64)
        out = np.empty(len(keys), np.int64)
        self._core.keys_find(self._slots, self.keys, keys, out)
        return out


class PathTable:
    """Call paths by hash: ``hash -> (parent hash, name id)``, registered
    by the builder as paths first appear (a hash met again keeps what it
    was first registered with).

    Compiled (``impl``, as :mod:`._runs_impl` selects): a :class:`KeyIndex`
    numbers the hashes as they come, their parents and names in arrays by
    number.  The twin keeps sorted numpy arrays (a few dozen bytes a path:
    a Python run's hundreds of thousands of deep paths would take hundreds
    of MB as dict entries); new ones wait in a buffer until :meth:`lookup`
    or the buffer's size merges them in.  The buffer may grow as large as
    the table (at least ``_MERGE``): a merge sorts and copies the whole
    table, so merging every fixed number of paths made the cost quadratic
    (91 merges of up to millions of paths on a Python run); a buffer in
    step with the table keeps it O(n log n) and the memory within twice
    the table's.  Both answer the same."""

    _MERGE = 1 << 16

    def __init__(self, impl: str | None = None):
        from hwtrace.analysis import _runs_impl
        core = _runs_impl.core_for(impl)
        self._ix = KeyIndex(core) if core is not None else None
        self._pn: list = []             # compiled: (parents, names) by number
        self._h = np.zeros(0, np.uint64)
        self._p = np.zeros(0, np.uint64)
        self._n = np.zeros(0, np.int32)
        self._buf: list = []            # (paths, parents, names) arrays
        self._row: list = []            # (path, parent, name) one by one
        self._pending = 0

    def __len__(self) -> int:
        self._merge()
        return self._ix.n if self._ix is not None else len(self._h)

    def add(self, path: int, parent: int, name: int) -> None:
        self._row.append((path, parent, name))
        self._pending += 1
        if self._pending >= self._MERGE and (self._ix is not None
                                             or self._pending >= len(self._h)):
            self._merge()

    def add_many(self, paths: np.ndarray, parents: np.ndarray,
                 names: np.ndarray) -> None:
        if not len(paths):
            return
        if self._ix is not None:
            self._merge()               # the rows before first, in order
            self._add_compiled(paths, parents, names)
            return
        if self._row:                   # the rows before, in order
            self._buf.append(self._rows())
            self._row = []
        self._buf.append((paths, parents, names))
        self._pending += len(paths)
        if self._pending >= self._MERGE and self._pending >= len(self._h):
            self._merge()

    def _add_compiled(self, paths, parents, names) -> None:
        _idx, f = self._ix.add(paths, firsts=True)
        if len(f):
            self._pn.append((np.asarray(parents, np.uint64)[f],
                             np.asarray(names, np.int32)[f]))

    def _merge(self) -> None:
        if not self._pending:
            return
        if self._ix is not None:
            rows = self._rows()
            self._row, self._pending = [], 0
            self._add_compiled(*rows)
            return
        if self._row:
            self._buf.append(self._rows())
        hs, ps, ns = [self._h], [self._p], [self._n]
        for h, p, n in self._buf:
            hs.append(np.asarray(h, np.uint64))
            ps.append(np.asarray(p, np.uint64))
            ns.append(np.asarray(n, np.int32))
        h = np.concatenate(hs)
        u, first = np.unique(h, return_index=True)
        self._h = u
        self._p = np.concatenate(ps)[first]
        self._n = np.concatenate(ns)[first]
        self._buf, self._row, self._pending = [], [], 0

    @property
    def numbered(self) -> bool:
        """Whether paths have :meth:`numbers` (the compiled table)."""
        return self._ix is not None

    def numbers(self, paths: np.ndarray) -> np.ndarray:
        """Each known path's number, 0 to len(self) - 1 (compiled table)."""
        self._merge()
        j = self._ix.find(paths)
        if len(j) and j.min() < 0:
            raise KeyError("PathTable.numbers: a path never registered")
        return j

    def _rows(self):
        """The rows added one by one, as (paths, parents, names) arrays."""
        r = np.array(self._row, dtype=object)
        return (r[:, 0].astype(np.uint64), r[:, 1].astype(np.uint64),
                r[:, 2].astype(np.int32))

    def lookup(self, paths: np.ndarray):
        """(parent hashes, name ids) of known paths."""
        self._merge()
        if self._ix is not None:
            j = self._ix.find(paths)
            if len(j) and j.min() < 0:
                raise KeyError("PathTable.lookup: a path never registered")
            if len(self._pn) != 1:
                self._pn = [(np.concatenate([p for p, _n in self._pn] or
                                            [np.zeros(0, np.uint64)]),
                             np.concatenate([n for _p, n in self._pn] or
                                            [np.zeros(0, np.int32)]))]
            par, nid = self._pn[0]
            return par[j], nid[j]
        j = np.searchsorted(self._h, np.asarray(paths, np.uint64))
        return self._p[j], self._n[j]

    def names(self, path: int) -> list[int]:
        """Name ids from the bottom of the stack to ``path``."""
        out = []
        while path != 0:
            p, n = self.lookup(np.array([path], np.uint64))
            out.append(int(n[0]))
            path = int(p[0])
        out.reverse()
        return out


def path_of(parent: int, name: int) -> int:
    """The hash of the path ``parent`` + ``name`` (as the builder makes it)."""
    return (parent * int(PATH_MUL) + name + 1) & 0xFFFFFFFFFFFFFFFF


class Slices(NamedTuple):
    """One chunk of the builder's output (see the module doc)."""

    enters: "Cols"
    exits: "Cols"
    markers: list           # [(seq, Marker)] in order

    def __bool__(self) -> bool:
        return bool(len(self.enters) or len(self.exits) or self.markers)


def _tid(v: int):
    return None if v < 0 else v


def to_records(chunk: Slices, names: NameTable) -> list:
    """Enter/Activation/Marker objects of a chunk, in execution order."""
    ev = []
    for r in chunk.enters.tolist():
        ev.append((r[10], 0, r))
    for r in chunk.exits.tolist():
        ev.append((r[11], 1, r))
    for seq, m in chunk.markers:
        ev.append((seq, 2, m))
    ev.sort(key=lambda e: e[0])
    out = []
    for _seq, kind, r in ev:
        if kind == 2:
            out.append(r)
            continue
        (_id, _parent, func, name, depth, flags, _pid, tid, begin_idx,
         end_idx, _eseq, _xseq, _path, begin, end, child_insns,
         child_time) = r
        f = None if func == _UNKNOWN else func
        if kind == 0:
            out.append(Enter(f, names[name], depth, begin, begin_idx,
                             Flag(flags), _tid(tid)))
        else:
            out.append(Activation(f, names[name], depth, begin, end,
                                  begin_idx, end_idx, child_insns,
                                  child_time, Flag(flags), _tid(tid)))
    return out


class RecordChunker:
    """The other way round: classic records (Enter/Activation/Marker, as
    a test or an old caller feeds them one by one to a writer's ``add``)
    into :class:`Slices`.  An Activation is matched with the open Enter of
    the same depth (they nest like parentheses)."""

    def __init__(self, names: NameTable | None = None):
        self.names = names or NameTable()
        self.paths = PathTable()
        self._seq = 0
        self._next_id = 0
        self._open: list[tuple[int, int, int]] = []   # (id, eseq, path)
        self._enters: list = []
        self._exits: list = []
        self._markers: list = []

    def add(self, rec) -> None:
        self._seq += 1
        t = type(rec)
        if t is Enter:
            parent, ppath = (self._open[rec.depth - 1][0], self._open[rec.depth - 1][2]) \
                if 0 < rec.depth <= len(self._open) else (-1, 0)
            del self._open[rec.depth:]
            nid = self.names.id(rec.name)
            path = path_of(ppath, nid)
            self.paths.add(path, ppath, nid)
            i = self._next_id
            self._next_id += 1
            self._open.append((i, self._seq, path))
            self._enters.append(self._row(rec, i, parent, nid, path, self._seq, -1))
        elif t is Activation:
            if rec.depth < len(self._open):
                i, eseq, path = self._open[rec.depth]
                del self._open[rec.depth:]
            else:
                i, eseq, path = self._next_id, self._seq, 0
                self._next_id += 1
            parent = self._open[rec.depth - 1][0] \
                if 0 < rec.depth <= len(self._open) else -1
            self._exits.append(self._row(rec, i, parent, self.names.id(rec.name),
                                         path, eseq, self._seq))
        elif t is Marker:
            self._markers.append((self._seq, rec))

    @staticmethod
    def _row(rec, i, parent, nid, path, eseq, xseq):
        func = _UNKNOWN if rec.func is None else rec.func
        tid = -1 if rec.tid is None else rec.tid
        if type(rec) is Enter:
            return (i, parent, func, nid, rec.depth, int(rec.flags), -1, tid,
                    rec.begin_idx, -1, eseq, -1, path, rec.begin, 0.0, 0, 0.0)
        return (i, parent, func, nid, rec.depth, int(rec.flags), -1, tid,
                rec.begin_idx, rec.end_idx, eseq, xseq, path, rec.begin,
                rec.end, rec.child_insns, rec.child_time)

    def take(self) -> Slices:
        s = Slices(Cols.from_rows(self._enters), Cols.from_rows(self._exits),
                   self._markers)
        self._enters, self._exits, self._markers = [], [], []
        return s


def id_positions(ids: np.ndarray, x: np.ndarray) -> tuple:
    """(position, found) of each of ``x`` among the ascending ``ids``
    (positions where found; elsewhere any): first where ids handed out
    one after another up to the last put it, then by a binary search
    for the rest."""
    n = len(ids)
    if not n:
        return np.zeros(len(x), np.int64), np.zeros(len(x), bool)
    ids = np.ascontiguousarray(ids)
    jj = np.clip(x - (ids[-1] - (n - 1)), 0, n - 1)
    found = ids[jj] == x
    if not found.all():
        rest = np.flatnonzero(~found)
        j = np.minimum(np.searchsorted(ids, x[rest]), n - 1)
        jj[rest] = j
        found[rest] = ids[j] == x[rest]
    return jj, found
