"""Per-function totals from the builder's chunks (no I/O): calls,
inclusive and exclusive instructions and time, plus markers (lost data,
errors) -- summed a chunk of activations at a time (numpy).

Inclusive totals count only the outermost activation of a function on the
stack, so recursion is not counted twice (fib's inclusive time is the time
of the top-level fib call, not the sum over the whole recursion): the
activations of one function nest or follow each other, so one sort by
(function, begin) and a running maximum of the ends say which are
enclosed.

The program apart from its start-up: an activation inside ``main`` (main
itself and everything it calls) is the program's (part ``"program"``);
one outside it, in a thread that ran ``main``, is start-up or exit
(``"startup"``: the dynamic loader, libc's initialization, ``exit``
handlers) if it began before ``main`` was called or after it returned.
A function ``main`` tail-calls (node's ``main`` is one jump to
``node::Start``), and any it tail-calls in turn, is ``main`` going on.
Threads that never ran ``main`` (workers, or a trace that began inside
the program) are all program, and so is what a thread runs after its
``main`` was lost without returning: a CPU's stream that lost the
thread's stack (it ran on another CPU meanwhile) goes on with it afresh,
still inside ``main`` though no longer seen to be.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from hwtrace._unique import unique
from hwtrace.analysis import _runs_impl
from hwtrace.analysis.records import Flag, Marker
from hwtrace.analysis.slices import Cols, RecordChunker, _UNKNOWN, id_positions

_NOT_A_CALL = int(Flag.BEGIN_UNKNOWN | Flag.SWITCHED_IN)
_TRUNC = int(Flag.TRUNCATED)
_TAIL = int(Flag.TAIL_CALL)
#: a slice that ends without its function returning
_NOT_A_RETURN = int(Flag.SWITCHED_OUT | Flag.TRUNCATED | Flag.CLIPPED)
_PROGRAM = -(1 << 62)
_COLS = ("calls", "truncated", "excl_insns", "excl_time", "incl_insns", "incl_time")
#: the activations begun and not ended yet, as columns
_OPEN = (("id", "<i8"), ("eseq", "<i8"), ("key", "<i8"), ("main", "?"), ("tid", "<i8"))


def _no_open() -> Cols:
    return Cols({f: np.zeros(0, t) for f, t in _OPEN}, 0)


@dataclass
class FuncStats:
    name: str
    func: int | None = None
    calls: int = 0
    incl_insns: int = 0
    excl_insns: int = 0
    incl_time: float = 0.0
    excl_time: float = 0.0
    truncated: int = 0


@dataclass
class Profile:
    split: str | None = "main"
    markers: dict[str, int] = field(default_factory=dict)
    marker_samples: list = field(default_factory=list)
    insns: int = 0
    time: float = 0.0
    streams: int = 0
    units: set = field(default_factory=set)
    #: exclusive instructions by process (pid; -1 unknown), and the
    #: programs the streams say each ran (pid -> name)
    pid_insns: dict = field(default_factory=dict)
    programs: dict = field(default_factory=dict)

    def __post_init__(self):
        self._keys: dict[tuple, int] = {}          # (name, func, part) -> row
        self._key_list: list[tuple] = []
        self._acc = np.zeros((0, len(_COLS)), np.float64)
        self._open = _no_open()
        self._main_called: dict = {}               # thread keys that ran main -> the enter
                                                   # seq of its first call
        self._main_returned: dict = {}             # ... the exit seq of its return
        self._chain: dict = {}                     # ... [main's depth, tail calls go on]
        self._chain_entered: dict = {}             # ... its chain's last enter seq
        self._stream = 0
        self._hk_known = np.zeros(0, np.int64)     # _rows' keys seen (sorted)
        self._hk_rows = np.zeros(0, np.int64)      # ... and their rows
        self._hk_names = None                      # ... of this names table
        self._legacy: RecordChunker | None = None
        self._info = None

    # -- input ---------------------------------------------------------------------
    def begin_stream(self, info, unit=None) -> None:
        self._flush_legacy()
        self.streams += 1
        self._stream += 1
        self._info = info
        self.programs.update(getattr(info, "programs", ()) or ())
        self._open = _no_open()
        # (a new builder: its name ids and threads are its own)
        self._hk_known = np.zeros(0, np.int64)
        self._hk_rows = np.zeros(0, np.int64)
        if unit:
            self.units.add(unit)

    def add(self, rec) -> None:
        """A classic record (Enter/Activation/Marker)."""
        if self._legacy is None:
            self._legacy = RecordChunker()
        self._legacy.add(rec)

    def _flush_legacy(self) -> None:
        if self._legacy is not None:
            lg, self._legacy = self._legacy, None
            self.add_slices(lg.take(), lg)

    def add_slices(self, chunk, ctx) -> None:
        names = ctx.names
        E, X = chunk.enters, chunk.exits
        for _seq, m in chunk.markers:
            self.markers[m.kind] = self.markers.get(m.kind, 0) + 1
            if len(self.marker_samples) < 5:
                self.marker_samples.append(m)
        if not len(E) and not len(X):
            return
        thr = self._thread_keys
        main_id = names.get(self.split) if self.split else None
        if len(E):
            # (columns, not one record array: a chunk's are read as they are)
            o = Cols({"id": E["id"], "eseq": E["eseq"], "key": _hkey(E),
                      "main": E["name"] == main_id if main_id is not None
                      else np.zeros(len(E), bool),
                      "tid": E["tid"]}, len(E))
            if main_id is not None:
                self._main_chain(E, o)
            op = self._open
            self._open = o if not op.n else \
                Cols({f: np.concatenate((op.d[f], o.d[f])) for f in o.d}, op.n + o.n)
        if not len(X):
            return
        op = self._open
        # where each activation ends: this chunk, or later (+inf)
        jj, found = id_positions(op["id"], X["id"])
        xend = np.full(len(op), np.iinfo(np.int64).max, np.int64)
        xend[jj[found]] = X["xseq"][found]
        # inside main: within a main activation (itself included)
        inside = np.zeros(len(X), bool)
        if main_id is not None and op["main"].any():
            m = op["main"]
            me, mx = op["eseq"][m], np.maximum.accumulate(xend[m])
            k = np.searchsorted(me, X["eseq"], side="right") - 1
            inside = (k >= 0) & (mx[np.maximum(k, 0)] >= X["xseq"])
        # outermost: no activation of the same function around it
        outer = self._outermost(op, xend, X, jj, found)
        # parts and rows
        part = np.where(inside, _PROGRAM, X["tid"])
        if self._main_called:
            self._after_main(X, op["main"][jj] & found, inside, part)
        rows = self._rows(X, names, part)
        ins = (X["end_idx"] - X["begin_idx"]).astype(np.float64)
        dur = X["end"] - X["begin"]
        self_i = ins - X["child_insns"]
        self_t = dur - X["child_time"]
        nrow = len(self._acc)
        acc = self._acc
        acc[:, 0] += np.bincount(rows, (X["flags"] & _NOT_A_CALL) == 0, nrow)
        acc[:, 1] += np.bincount(rows, (X["flags"] & _TRUNC) != 0, nrow)
        acc[:, 2] += np.bincount(rows, self_i, nrow)
        acc[:, 3] += np.bincount(rows, self_t, nrow)
        acc[:, 4] += np.bincount(rows, np.where(outer, ins, 0), nrow)
        acc[:, 5] += np.bincount(rows, np.where(outer, dur, 0), nrow)
        self.insns += int(self_i.sum())
        self.time += float(self_t.sum())
        pids = X["pid"]
        if len(pids) and pids[0] == pids[-1] and (pids == pids[0]).all():
            p = int(pids[0])
            self.pid_insns[p] = self.pid_insns.get(p, 0) + int(self_i.sum())
        else:
            for p in unique(pids).tolist():
                self.pid_insns[p] = self.pid_insns.get(p, 0) + int(self_i[pids == p].sum())
        keep = np.ones(len(op), bool)
        keep[jj[found]] = False
        self._open = op[keep]

    def _main_chain(self, E, o) -> None:
        """Mark in ``o["main"]`` the enters that go on with ``main`` (its
        tail calls, at its depth, and theirs); note each thread's first
        call of ``main``: what ran there outside it is start-up or exit
        (a main begun before the trace says nothing about what came
        before it)."""
        thr = self._thread_keys
        called = o["main"] & ((E["flags"] & _NOT_A_CALL) == 0)
        # only enters at main's depth or above, in threads whose main may
        # go on by a tail call, can (a few per thread)
        live = [(k, c[0]) for k, c in self._chain.items() if c[1] and k[0] == self._stream]
        if called.any():
            live += [(thr(t), d) for t, d in zip(E["tid"][called].tolist(),
                                                 E["depth"][called].tolist())]
        if not live:
            return
        cand = called.copy()
        for (_s, t), d in live:
            cand |= (E["tid"] == t) & (E["depth"] <= d)
        at = np.flatnonzero(cand)
        main = o["main"]
        for i, t, d, f, q, c in zip(at.tolist(), E["tid"][at].tolist(),
                                    E["depth"][at].tolist(), E["flags"][at].tolist(),
                                    E["eseq"][at].tolist(), called[at].tolist()):
            key = thr(t)
            if c:
                self._main_called.setdefault(key, q)
                self._chain[key] = [d, True]
                self._chain_entered[key] = q
                continue
            ch = self._chain.get(key)
            if ch is None or d > ch[0]:
                continue
            if ch[1] and d == ch[0] and f & _TAIL:
                main[i] = True
                self._chain_entered[key] = q
            else:
                ch[1] = False

    def _after_main(self, X, xmain: np.ndarray, inside: np.ndarray,
                    part: np.ndarray) -> None:
        """Activations outside ``main`` in a thread that ran it, begun after
        it was called and not after it returned, are the program's (in
        ``part``): the thread lost its stack inside ``main``.  ``xmain``:
        the exits of ``main`` and of what it tail-called."""
        thr = self._thread_keys
        ret = xmain & ((X["flags"] & _NOT_A_RETURN) == 0)
        for t, q in zip(X["tid"][ret].tolist(), X["xseq"][ret].tolist()):
            key = thr(t)
            if key in self._main_called and q > self._chain_entered.get(key, q):
                self._main_returned[key] = q        # (not one it tail-called on from)
        out = ~inside
        if not out.any():
            return
        tids = X["tid"]
        for t in unique(tids[out]).tolist():
            called = self._main_called.get(thr(t))
            if called is None:
                continue
            sel = out & (tids == t) & (X["eseq"] > called)
            back = self._main_returned.get(thr(t))
            if back is not None:
                sel &= X["eseq"] < back
            part[sel] = _PROGRAM

    def _thread_keys(self, tid: int):
        return (self._stream, tid)

    @staticmethod
    def _outermost(op, xend, X, jj, found) -> np.ndarray:
        """For every ending activation: no activation of the same function
        (begun before it, ending after it) encloses it (the compiled
        core's ``outermost`` where it is in use, else the twin below)."""
        out = np.ones(len(X), bool)
        if not found.any():
            return out
        core = _runs_impl.CORE
        if core is None:
            return Profile._outermost_twin(op, xend, X, jj, found, out)
        xrow = np.full(len(op), -1, np.int64)
        xrow[jj[found]] = np.flatnonzero(found)
        core.outermost(np.ascontiguousarray(op["key"], np.int64),
                       np.ascontiguousarray(xend, np.int64), xrow,
                       np.ascontiguousarray(X["xseq"], np.int64), out.view(np.uint8))
        return out

    @staticmethod
    def _outermost_twin(op, xend, X, jj, found, out) -> np.ndarray:
        """The Python twin of the compiled ``outermost``: one sort by
        (function, begin) and a running maximum of the ends."""
        xkey = _hkey(X)
        # the ones ending here, and those still open of the same functions
        ending = np.zeros(len(op), bool)
        ending[jj[found]] = True
        rest = np.flatnonzero(~ending)
        rest = rest[np.isin(op["key"][rest], xkey)]
        cand = np.sort(np.concatenate((jj[found], rest)))
        key, x = op["key"][cand], xend[cand]
        # by (key, begin): op is in begin order, and so is cand -- a stable
        # sort by key alone
        order = np.argsort(key, kind="stable")
        key, x = key[order], x[order]
        sorted_idx = cand[order]
        inv = np.full(len(op), -1, np.int64)
        inv[sorted_idx] = np.arange(len(sorted_idx))
        grp = np.concatenate(([0], np.cumsum(key[1:] != key[:-1]))).astype(np.int64)
        big = np.int64(1) << 40
        run = np.maximum.accumulate(np.minimum(x, big - 1) + grp * big)
        prev = np.concatenate(([np.int64(-1)], run[:-1]))
        p = inv[jj[found]]
        ok = p >= 0
        pf = np.where(ok, p, 0)
        enclosed = ok & (prev[pf] > grp[pf] * big + X["xseq"][found])
        out[found] = ~enclosed
        return out

    def _rows(self, X, names, part) -> np.ndarray:
        """Accumulator row of every activation (new keys added)."""
        with np.errstate(over="ignore"):
            hk = (_hkey(X).view(np.uint64) * np.uint64(0x100000001B3)
                  + part.astype(np.uint64)).view(np.int64)
        # keys seen in this stream's earlier chunks (of the same names
        # table: the hash holds a name id): their rows at once, and only
        # the others sorted out (their first rows: the keys' order)
        if self._hk_names is not names:
            self._hk_names = names
            self._hk_known = self._hk_rows = np.zeros(0, np.int64)
        known, krow = self._hk_known, self._hk_rows
        if len(known):
            pos = np.minimum(np.searchsorted(known, hk), len(known) - 1)
            hit = known[pos] == hk
            res = krow[pos]
            if hit.all():
                return res
            miss = np.flatnonzero(~hit)
        else:
            res = np.empty(len(hk), np.int64)
            miss = np.arange(len(hk))
        u, first, inv = np.unique(hk[miss], return_index=True, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        first = miss[first]
        out = np.empty(len(u), np.int64)
        new = np.arange(len(u))
        nt = names.names
        for j, i in zip(new.tolist(), first[new].tolist()):
            func = int(X["func"][i])
            pi = int(part[i])
            key = (nt[int(X["name"][i])], None if func == _UNKNOWN else func,
                   "program" if pi == _PROGRAM else self._thread_keys(pi))
            r = self._keys.get(key)
            if r is None:
                r = self._keys[key] = len(self._key_list)
                self._key_list.append(key)
                if r >= len(self._acc):
                    grow = np.zeros((max(64, 2 * len(self._acc)), len(_COLS)))
                    grow[:len(self._acc)] = self._acc
                    self._acc = grow
            out[j] = r
        if len(new):
            k = np.concatenate((known, u[new]))
            o = np.argsort(k, kind="stable")
            self._hk_known = k[o]
            self._hk_rows = np.concatenate((krow, out[new]))[o]
        res[miss] = out[inv]
        return res

    def close(self) -> None:
        self._flush_legacy()

    # -- results -----------------------------------------------------------------------
    def _stats(self, which: str | None) -> dict[tuple, FuncStats]:
        self._flush_legacy()
        out: dict[tuple, FuncStats] = {}
        acc = self._acc
        for r, (name, func, part) in enumerate(self._key_list):
            if which is not None:
                start = part != "program" and part in self._main_called
                if (which == "startup") != start:
                    continue
            s = out.get((name, func))
            if s is None:
                s = out[(name, func)] = FuncStats(name, func)
            c, t, ei, et, ii, it = acc[r].tolist()
            s.calls += int(c)
            s.truncated += int(t)
            s.excl_insns += int(ei)
            s.excl_time += et
            s.incl_insns += int(ii)
            s.incl_time += it
        return out

    @property
    def funcs(self) -> dict[tuple, FuncStats]:
        """keyed by (name, function start): two functions of the same name
        (``_start`` of ld.so and of the program) stay apart."""
        return self._stats(None)

    def part(self, which: str) -> dict[tuple, FuncStats]:
        """``"program"`` or ``"startup"`` (see the module doc)."""
        return self._stats(which)

    @property
    def has_startup(self) -> bool:
        return bool(self._main_called)

    def display_names(self, funcs=None, label=None) -> dict[tuple, str]:
        """Names for display: the name, with ``@0xADDR`` where two functions
        share it -- or `` (FILE)`` where ``label(name, start)`` (the file
        holding each, or None) tells all of that name apart."""
        funcs = self.funcs if funcs is None else funcs
        count: dict[str, int] = {}
        for name, _f in funcs:
            count[name] = count.get(name, 0) + 1
        out = {(name, f): name for name, f in funcs if count[name] == 1 or f is None}
        files: dict[str, list] = {}
        for name, f in funcs:
            if (name, f) not in out:
                files.setdefault(name, []).append((f, label(name, f) if label else None))
        for name, got in files.items():
            labels = [lb for _f, lb in got]
            by_file = None not in labels and len(set(labels)) == len(labels)
            for f, lb in got:
                out[(name, f)] = f"{name} ({lb})" if by_file else f"{name}@{f:#x}"
        return out

    def same_functions(self, place) -> dict[tuple, tuple]:
        """(name, function start) -> the key of its function: the lowest
        start among the keys of that name whose ``place(name, start)``
        (a function's identity apart from where it was loaded: see
        TraceSet.function_places) is the same; itself where it has none."""
        group: dict = {}
        for name, f in self.funcs:
            p = place(name, f) if f is not None else None
            group.setdefault((name, f) if p is None else (name, p), []).append(f)
        out = {}
        for (name, _), fs in group.items():
            rep = (name, min(fs)) if len(fs) > 1 else (name, fs[0])
            for f in fs:
                out[(name, f)] = rep
        return out

    @staticmethod
    def merged(funcs: dict[tuple, FuncStats], same: dict[tuple, tuple]) -> dict[tuple, FuncStats]:
        """``funcs`` with the stats of one function (``same``, from
        :meth:`same_functions`) summed under its key (new objects)."""
        out: dict[tuple, FuncStats] = {}
        for k, s in funcs.items():
            rk = same.get(k, k)
            t = out.get(rk)
            if t is None:
                out[rk] = replace(s, func=rk[1])
                continue
            t.calls += s.calls
            t.truncated += s.truncated
            t.excl_insns += s.excl_insns
            t.excl_time += s.excl_time
            t.incl_insns += s.incl_insns
            t.incl_time += s.incl_time
        return out

    def top(self, key: str = "excl_insns", n: int = 15, funcs=None) -> list[FuncStats]:
        funcs = self.funcs if funcs is None else funcs
        return sorted(funcs.values(), key=lambda s: getattr(s, key),
                      reverse=True)[:n]


def _hkey(rows: np.ndarray) -> np.ndarray:
    """A number per (function, name id): the same for one builder's rows
    in every chunk (a 64-bit hash)."""
    with np.errstate(over="ignore"):
        h = rows["func"].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) \
            + rows["name"].astype(np.uint64)
    return h.view(np.int64)
