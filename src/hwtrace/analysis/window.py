"""Views narrowed to the question (no I/O): a function, a depth, a
minimum duration, a window of instructions or time.

:class:`ViewFilter` sits between a stream's call-stack builder and the
writers, on its chunks (:class:`~.slices.Slices`):

* ``function``: only activations of that function and what they call
  (recursion: from the outermost one); depths count from it (0);
* ``max_depth``: only activations at most that deep;
* ``min_duration``: only activations at least that long.  A begin is
  held back until the activation has run that long (then it certainly
  qualifies) or has ended (then it is dropped); a caller runs at least as
  long as its callee, so begins still come out in time order;
* ``insns=(A, B)`` / ``time=(A, B)``: only what ran between instruction A
  and B of the stream (or between times A and B after the start of the
  first stream): activations overlapping the window, cut at its edges
  (flagged ``CLIPPED``), counted inside it only.  The cut happens in the
  builder's output stage (:class:`WindowClip`, before callees'
  instructions are summed), so exclusive and inclusive counts are those
  of the window.  Where only one of an edge's instruction index and time
  is known, the other is interpolated linearly over the activation.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.records import Flag
from hwtrace.analysis.slices import Cols, Slices

_CLIPPED = int(Flag.CLIPPED)
_TRUNC = int(Flag.TRUNCATED)
_INF = float("inf")


class WindowError(ValueError):
    """The window cannot apply to this trace (one line, for the user)."""


def _at(rows, side_idx, side_t, lo_idx, lo_t, v, by_idx):
    """Interpolate the other coordinate of ``v`` inside each row's span."""
    i0, i1 = rows["begin_idx"].astype(np.float64), rows["end_idx"].astype(np.float64)
    t0, t1 = rows["begin"], rows["end"]
    if by_idx:
        span = np.where(i1 > i0, i1 - i0, 1.0)
        return t0 + (v - i0) / span * (t1 - t0)
    span = np.where(t1 > t0, t1 - t0, 1.0)
    return np.round(i0 + (v - t0) / span * (i1 - i0)).astype(np.int64)


class WindowClip:
    """The window, applied in the builder's output stage
    (:class:`hwtrace.analysis.rows.Pending` calls :meth:`apply` on every
    flush, once times are known, before summing callees)."""

    def __init__(self, by: str, lo, hi, origin: dict):
        self.by_idx = by == "insns"
        self.lo, self.hi = lo, hi           # idx, or time from the origin
        self.origin = origin                # shared by the streams: {"t": time}
        self.crossed = lo is None
        self.held = Cols.zeros()
        self.done = False                   # past the window's end

    def _bounds(self, E, X, marks):
        if self.by_idx:
            return (self.lo if self.lo is not None else -1,
                    self.hi if self.hi is not None else np.iinfo(np.int64).max)
        if "t" not in self.origin:
            firsts = [a["begin"].min() for a in (E, X) if len(a)]
            firsts += [m[-1] for m in marks]
            if not firsts:
                return None
            self.origin["t"] = float(min(firsts))
        o = self.origin["t"]
        return (o + self.lo if self.lo is not None else -_INF,
                o + self.hi if self.hi is not None else _INF)

    def apply(self, E, X, marks):
        b = self._bounds(E, X, marks)
        if b is None:
            return E, X, marks
        lo, hi = b
        cb, ce = ("begin_idx", "end_idx") if self.by_idx else ("begin", "end")
        # ends: drop what ended before the window (began before it: one
        # of no instruction right at its start is in it, as its begin is)
        # or began after it
        gone = (X[ce] <= lo) & (X[cb] < lo)
        gone_ids = X["id"][gone] if gone.any() else None
        if gone_ids is not None and len(self.held):
            self.held = self.held[~np.isin(self.held["id"], gone_ids)]
        X = X[~gone & (X[cb] < hi)]
        # begins before the window wait for it (not those that ended
        # before it in this same chunk: nothing would end them)
        if not self.crossed:
            early = E[cb] < lo
            if early.any():
                H = E[early]
                if gone_ids is not None:
                    H = H[~np.isin(H["id"], gone_ids)]
                self.held = Cols.concat([self.held, H])
                E = E[~early]
            now = [a[c].max() for a, c in ((E, cb), (X, ce)) if len(a)]
            if now and max(now) >= lo:
                self.crossed = True
                H = self.held
                self.held = Cols.zeros()
                if len(H):
                    ref = E[:1] if len(E) else X[-1:]
                    H = H.copy()
                    if self.by_idx:
                        ri, rt = float(ref["begin_idx"][0]), float(ref["begin"][0])
                        span = np.where(ri > H["begin_idx"], ri - H["begin_idx"], 1)
                        H["begin"] = H["begin"] + (lo - H["begin_idx"]) / span * (rt - H["begin"])
                        H["begin_idx"] = lo
                    else:
                        ri, rt = float(ref["begin_idx"][0]), float(ref["begin"][0])
                        span = np.where(rt > H["begin"], rt - H["begin"], 1)
                        H["begin_idx"] = np.round(H["begin_idx"] + (lo - H["begin"]) / span
                                                  * (ri - H["begin_idx"])).astype(np.int64)
                        H["begin"] = lo
                    H["flags"] |= _CLIPPED
                    E = Cols.concat([H, E])
        E = E[E[cb] < hi]
        # cut what overlaps the edges
        if len(X):
            X = X.copy()
            cut = X[cb] < lo
            if cut.any():
                other = _at(X[cut], None, None, None, None, lo, self.by_idx)
                if self.by_idx:
                    X["begin"][cut] = other
                    X["begin_idx"][cut] = lo
                else:
                    X["begin_idx"][cut] = other
                    X["begin"][cut] = lo
                X["flags"][cut] |= _CLIPPED
            cut = X[ce] > hi
            if cut.any():
                other = _at(X[cut], None, None, None, None, hi, self.by_idx)
                if self.by_idx:
                    X["end"][cut] = other
                    X["end_idx"][cut] = hi
                else:
                    X["end_idx"][cut] = other
                    X["end"][cut] = hi
                X["flags"][cut] = (X["flags"][cut] | np.uint32(_CLIPPED)) & ~np.uint32(_TRUNC)
        marks = [m for m in marks
                 if lo <= (m[1] if self.by_idx else m[-1]) < hi]
        return E, X, marks

    def past(self, n: int, t: float | None) -> bool:
        """Is the stream past the window's end (decoding can stop)?"""
        if self.hi is None:
            return False
        if self.by_idx:
            return n >= self.hi
        return t is not None and "t" in self.origin and t >= self.origin["t"] + self.hi


class ViewFilter:
    def __init__(self, builder, *, function=None, max_depth=None,
                 min_duration=None, insns=None, time=None, origin=None, found=None):
        self.function = function
        #: shared by a view's filters: gets True once an activation of
        #: ``function`` began (a name that never ran is said, not a blank)
        self.found = found if found is not None else []
        self.max_depth = max_depth
        self.clip = None
        unit = None
        if insns is not None or time is not None:
            if insns is not None:
                lo, hi = insns
                self.clip = WindowClip("insns", lo, hi, origin if origin is not None else {})
            else:
                (lo, hi) = (time[0], time[1])
                self.clip = ("time", lo, hi, origin if origin is not None else {})
            builder.pending.clip = self
        self._min = min_duration           # (value, unit) or None
        self._mind = None
        self._held = Cols.zeros()          # begins waiting for min_duration
        self._roots = np.zeros(0, [("id", "<i8"), ("eseq", "<i8"), ("depth", "<i4")])
        self._unit = unit
        self._b = builder

    # -- the window, in the builder's output stage --------------------------------
    def apply(self, E, X, marks):
        c = self.clip
        if isinstance(c, tuple):
            c = self.clip = self._time_clip(*c)
        return c.apply(E, X, marks)

    def _time_clip(self, _by, lo, hi, origin):
        unit = self._b.time.unit

        def conv(v):
            if v is None:
                return None
            val, u = v
            if u is None or unit == "ns":
                return val
            if unit == "insns":
                raise WindowError("--time: this trace has no timing (its clock "
                                  "counts instructions): use --insns, or a bare number")
            raise WindowError("--time: the TSC frequency of this trace is unknown: "
                              "give TSC ticks (a bare number) or --tsc-hz")
        return WindowClip("time", conv(lo), conv(hi), origin)

    def past(self) -> bool:
        c = self.clip
        if c is None or isinstance(c, tuple):
            return False
        last = self._b.time.last
        return c.past(self._b.n, last[1] if last else None)

    # -- function, depth, duration --------------------------------------------------------
    def filter(self, chunks, builder) -> list:
        out = []
        for ch in chunks:
            E, X, M = ch.enters, ch.exits, ch.markers
            if self.function is not None:
                E, X, M = self._function(E, X, M, builder)
            if self.max_depth is not None:
                E = E[E["depth"] <= self.max_depth]
                X = X[X["depth"] <= self.max_depth]
            if self._min is not None:
                E, X = self._duration(E, X, builder)
            s = Slices(E, X, M)
            if s:
                out.append(s)
        return out

    def _function(self, E, X, M, builder):
        nid = builder.names.get(self.function)
        roots = self._roots
        if nid is not None:
            new = E[E["name"] == nid]
            if len(new):
                if not self.found:
                    self.found.append(True)
                r = np.zeros(len(new), roots.dtype)
                r["id"], r["eseq"], r["depth"] = new["id"], new["eseq"], new["depth"]
                roots = np.concatenate((roots, r))
        if not len(roots):
            self._roots = roots
            return E[:0], X[:0], []
        # a root's interval ends at its end (in this chunk) or later
        end = np.full(len(roots), np.iinfo(np.int64).max, np.int64)
        if len(X):
            ex = np.isin(roots["id"], X["id"])
            if ex.any():
                order = np.argsort(X["id"])
                j = np.searchsorted(X["id"][order], roots["id"][ex])
                end[ex] = X["xseq"][order][j]
        # the outermost root around each row (roots nest or follow each other)
        outer = np.ones(len(roots), bool)
        run = np.maximum.accumulate(end)
        outer[1:] = run[:-1] < roots["eseq"][1:]
        o_e, o_x, o_d = roots["eseq"][outer], end[outer], roots["depth"][outer]

        def inside(seq):
            k = np.searchsorted(o_e, seq, side="right") - 1
            ok = k >= 0
            kk = np.maximum(k, 0)
            return ok & (o_x[kk] >= seq), o_d[kk]

        ie, de = inside(E["eseq"])
        ix, dx = inside(X["eseq"])
        E, X = E[ie].copy(), X[ix].copy()
        E["depth"] -= de[ie]
        X["depth"] -= dx[ix]
        if M:
            im, _d = inside(np.array([s for s, _m in M], np.int64))
            M = [m for m, keep in zip(M, im.tolist()) if keep]
        # roots that ended are done with
        self._roots = roots[end == np.iinfo(np.int64).max]
        return E, X, M

    def _duration(self, E, X, builder):
        if self._mind is None:
            val, u = self._min
            unit = builder.time.unit
            if u == "insns" or unit == "insns":
                self._mind = ("insns", val)
            elif u == "ns" and unit != "ns":
                raise WindowError("--min-duration: the TSC frequency of this trace "
                                  "is unknown: give TSC ticks (a bare number), an "
                                  "instruction count (5000insns) or --tsc-hz")
            else:
                self._mind = ("time", val)
        kind, d = self._mind
        if kind == "insns":
            xd = X["end_idx"] - X["begin_idx"]
            now = builder.n
            el = lambda H: now - H["begin_idx"]         # noqa: E731
        else:
            xd = X["end"] - X["begin"]
            times = [a[c].max() for a, c in ((E, "begin"), (X, "end")) if len(a)]
            now = max(times) if times else None
            el = lambda H: (now - H["begin"]) if now is not None \
                else np.zeros(len(H))                     # noqa: E731
        H = Cols.concat([self._held, E])
        keepx = xd >= d
        # begins: out once long enough, or when their activation qualified
        ready = (el(H) >= d) | np.isin(H["id"], X["id"][keepx])
        ended = np.isin(H["id"], X["id"][~keepx])
        out = H[ready & ~ended]
        self._held = H[~ready & ~ended]
        return out, X[keepx]
