"""The call-stack builder's output side: rows waiting for their time.

The builder appends begin rows, end rows (both :data:`~.slices.SLICE`)
and markers as it goes -- numpy arrays from a vectorized run, tuples from
the one-at-a-time paths -- each with its sequence number, in order.
:meth:`Pending.flush` hands out, as :class:`~.slices.Slices`, every row
an anchor of the clock (:class:`~.clock.TimeBase`) follows, timed:

* a begin row gets the time of its begin index;
* an end row the time of its end index, its begin time (from its begin
  row: in the same flush, or remembered from an earlier one while the
  activation was open), and its callees' instructions and time (summed
  from the end rows whose parent it is: in the same flush, or carried
  over from earlier ones).

Memory: pending rows wait for at most ``max_pending`` rows (then the
clock is sealed: extrapolated), remembered begin times and callee sums
only for activations still open.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis import _runs_impl
from hwtrace.analysis.clock import TimeBase
from hwtrace.analysis.slices import _FIELDS, _TYPES, Cols, Slices, empty


#: where a row tuple (the builder's ``_row``) holds its thread
_TID_AT = _FIELDS.index("tid")


class _Parts:
    """Rows in order (``col``: the sequence-number field they are ordered
    by): one column array per field, filled from ``w`` on and handed out
    from ``r`` on, and a tuple buffer of one-at-a-time rows.

    The compiled commit writes its rows straight into the columns
    (:meth:`place`) and :meth:`take` hands out views of them: the rows
    are copied nowhere on the way (concatenating each flush's parts, 17
    columns of some 14 M rows on a Python run, was ~3% of every view).
    When the columns are full, fresh ones take over (with the rows not
    handed out yet); the views given out keep the old ones alive."""

    _CAP = 1 << 16

    def __init__(self, col: str):
        self.col = col
        self.cols: dict | None = None
        self.r = self.w = 0
        self.py: list[tuple] = []
        self.n = 0

    def _room(self, k: int) -> None:
        cap = 0 if self.cols is None else len(self.cols[self.col])
        if self.w + k <= cap:
            return
        live = self.w - self.r
        size = max(self._CAP, 2 * (live + k))
        cols = {f: np.empty(size, t) for f, t in zip(_FIELDS, _TYPES)}
        if live:
            for f, a in self.cols.items():
                cols[f][:live] = a[self.r:self.w]
        self.cols, self.r, self.w = cols, 0, live

    def place(self, k: int) -> Cols:
        """Room for ``k`` rows that come next: views to write them in."""
        self._close()
        if not k:
            return empty()
        self._room(k)
        w = self.w
        d = {f: a[w:w + k] for f, a in self.cols.items()}
        self.w += k
        self.n += k
        return Cols(d, k)

    def add_array(self, a: Cols) -> None:
        if len(a):
            dst = self.place(len(a))
            for f, v in dst.d.items():
                v[...] = a.d[f]

    def add_row(self, row: tuple) -> None:
        self.py.append(row)
        self.n += 1

    def _close(self) -> None:
        if self.py:
            rows, self.py = self.py, []
            self.n -= len(rows)
            self.add_array(Cols.from_rows(rows))

    def release(self) -> None:
        """Drop the columns if every row is handed out (a finished
        stream's builder, which a writer may keep, then holds no empty
        room; rows placed later get new columns)."""
        if self.w == self.r and not self.py:
            self.cols, self.r, self.w = None, 0, 0

    def first_seq(self) -> int | None:
        if self.w > self.r:
            return int(self.cols[self.col][self.r])
        if self.py:
            return self.py[0][10 if self.col == "eseq" else 11]
        return None

    def take(self, ready) -> Cols:
        """The leading rows ``ready(seqs)`` says can go (a count of the
        rows in order), as views; the rest stays."""
        self._close()
        r, w = self.r, self.w
        if w == r:
            return empty()
        k = ready(self.cols[self.col][r:w])
        if not k:
            return empty()
        self.r += k
        self.n -= k
        return Cols({f: a[r:r + k] for f, a in self.cols.items()}, k)


class Pending:
    def __init__(self, clock: TimeBase):
        self.clock = clock
        self.enters = _Parts("eseq")
        self.exits = _Parts("xseq")
        self.markers: list = []           # (seq, idx, kind, offset, detail, tid)
        self._begin: dict[int, float] = {}      # open activation id -> begin time
        self._child: dict[int, list] = {}       # id -> [callee insns, callee time]
        #: a window to cut to (``apply(E, X, marks)``; see analysis.window)
        self.clip = None

    @property
    def count(self) -> int:
        return self.enters.n + self.exits.n + len(self.markers)

    def holds(self, tid: int) -> bool:
        """Whether rows (or markers) of thread ``tid`` wait here for an
        anchor to time them."""
        for parts in (self.enters, self.exits):
            if any(row[_TID_AT] == tid for row in parts.py):
                return True
            if parts.cols is not None and parts.w > parts.r and \
                    bool((parts.cols["tid"][parts.r:parts.w] == tid).any()):
                return True
        return any(m[5] == tid for m in self.markers)

    def oldest_seq(self) -> int | None:
        seqs = [s for s in (self.enters.first_seq(), self.exits.first_seq())
                if s is not None]
        if self.markers:
            seqs.append(self.markers[0][0])
        return min(seqs) if seqs else None

    def flush(self) -> tuple[Slices, list]:
        """The rows an anchor follows now, timed.  Returns the chunk and
        the raw markers (seq, idx, kind, offset, detail, tid, time)."""
        clock = self.clock
        E = self.enters.take(clock.ready)
        X = self.exits.take(clock.ready)
        # (the times written in the columns themselves: contiguous views)
        if len(E):
            clock.times(E["eseq"], E["begin_idx"], out=E["begin"])
        if len(X):
            clock.times(X["xseq"], X["end_idx"], out=X["end"])
            ended = self._begins(E, X)
            np.maximum(X["end"], X["begin"], out=X["end"])
        else:
            ended = None
        if len(E):
            self._remember(E, ended)
        marks = []
        if self.markers:
            mseq = np.array([m[0] for m in self.markers], np.int64)
            nm = clock.ready(mseq)
            if nm:
                t = clock.times(mseq[:nm], np.array([m[1] for m in self.markers[:nm]],
                                                    np.int64))
                marks = [m + (ti,) for m, ti in zip(self.markers[:nm], t.tolist())]
                del self.markers[:nm]
        if self.clip is not None:
            E, X, marks = self.clip.apply(E, X, marks)
        if len(X):
            self._children(X)
        clock.forget_before(self.oldest_seq())
        return Slices(E, X, []), marks

    # -- begin times and callee sums -------------------------------------------------
    def _begins(self, E, X) -> np.ndarray | None:
        """Begin times of the ending rows; returns which begin rows (E)
        ended here."""
        begin = X["begin"]
        found = np.zeros(len(X), bool)
        ended = None
        core = _runs_impl.CORE
        if len(E) and core is not None:
            ended = np.zeros(len(E), bool)
            core.begins(_c(E["id"], np.int64), _c(E["begin"], np.float64),
                        _c(X["id"], np.int64), begin, found.view(np.uint8),
                        ended.view(np.uint8))
        elif len(E):
            eid = E["id"]
            j = np.searchsorted(eid, X["id"])
            jj = np.minimum(j, len(eid) - 1)
            found = eid[jj] == X["id"]
            begin[found] = E["begin"][jj[found]]
            ended = np.zeros(len(E), bool)
            ended[jj[found]] = True
        if not found.all():
            rem = self._begin
            for i in np.flatnonzero(~found).tolist():
                t = rem.pop(int(X["id"][i]), None)
                begin[i] = X["end"][i] if t is None else t
        return ended

    def _remember(self, E, ended) -> None:
        """Begin times of the activations begun here that did not end here."""
        still = ~ended if ended is not None else np.ones(len(E), bool)
        if still.any():
            rem = self._begin
            for i, t in zip(E["id"][still].tolist(), E["begin"][still].tolist()):
                rem[i] = t

    def _children(self, X: np.ndarray) -> None:
        """Callee sums of the ending rows (the compiled core's
        ``children`` where it is in use, else :meth:`_children_twin`)."""
        core = _runs_impl.CORE
        if core is None:
            self._children_twin(X)
            return
        acc = self._child
        nc = len(acc)
        keys = np.fromiter(acc.keys(), np.int64, nc)
        c_insns = np.fromiter((a[0] for a in acc.values()), np.int64, nc)
        c_time = np.fromiter((a[1] for a in acc.values()), np.float64, nc)
        used = np.zeros(nc, np.uint8)
        # (the sums written in the columns themselves where they can be)
        ci, ct = X["child_insns"], X["child_time"]
        ci = ci if ci.flags.c_contiguous else np.empty(len(X), np.int64)
        ct = ct if ct.flags.c_contiguous else np.empty(len(X), np.float64)
        u, si, st = core.children(
            _c(X["id"], np.int64), _c(X["parent"], np.int64),
            _c(X["begin_idx"], np.int64), _c(X["end_idx"], np.int64),
            _c(X["begin"], np.float64), _c(X["end"], np.float64), ci, ct,
            keys, c_insns, c_time, used)
        for key in keys[used.view(bool)].tolist():
            del acc[key]
        if ci is not X["child_insns"]:
            X["child_insns"] = ci
        if ct is not X["child_time"]:
            X["child_time"] = ct
        self._carry(np.frombuffer(u, np.int64), np.frombuffer(si, np.int64),
                    np.frombuffer(st, np.float64))

    def _carry(self, u, si, st) -> None:
        """Callee sums for parents still open, carried to a later chunk."""
        acc = self._child
        for pid, a, b in zip(u.tolist(), si.tolist(), st.tolist()):
            cur = acc.get(pid)
            if cur is None:
                acc[pid] = [int(a), b]
            else:
                cur[0] += int(a)
                cur[1] += b

    def _children_twin(self, X: np.ndarray) -> None:
        """The Python twin of the compiled ``children``."""
        insns = X["end_idx"] - X["begin_idx"]
        dur = X["end"] - X["begin"]
        ids = X["id"]
        order = np.argsort(ids, kind="stable")
        sid = ids[order]
        par = X["parent"]
        j = np.searchsorted(sid, par)
        jj = np.minimum(j, len(sid) - 1)
        here = (par >= 0) & (sid[jj] == par)
        tgt = order[jj[here]]
        ci = np.bincount(tgt, insns[here], len(X)).astype(np.int64)
        ct = np.bincount(tgt, dur[here], len(X))
        acc = self._child
        if acc:
            # callee sums carried from earlier flushes (a few open
            # activations: each looked up among the sorted ids)
            keys = np.fromiter(acc.keys(), np.int64, len(acc))
            k = np.minimum(np.searchsorted(sid, keys), len(sid) - 1)
            hit = sid[k] == keys
            for key, i in zip(keys[hit].tolist(), order[k[hit]].tolist()):
                a = acc.pop(key)
                ci[i] += a[0]
                ct[i] += a[1]
        X["child_insns"] = ci
        X["child_time"] = ct
        away = (par >= 0) & ~here
        if away.any():
            p = par[away]
            u, inv = np.unique(p, return_inverse=True)
            si = np.bincount(inv, insns[away], len(u))
            st = np.bincount(inv, dur[away], len(u))
            self._carry(u, si, st)


def _c(a: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(a, dtype)
