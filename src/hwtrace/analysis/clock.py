"""Giving instruction indices a time, streaming, in bounded memory.

Intel PT timing (TSC, and MTC/CYC refining it) reaches the views as a
time per decoded record (``Batch.blocks["tsc"]``) and on events
(``tsc``): *anchors* (instruction index, time).  Decoders repeat the last
known value until a new timing packet arrives, so only a changed value
makes an anchor.  Between two anchors the time of an instruction is
interpolated linearly by its index (as magic-trace does), so everything
that needs a time waits until the next anchor comes.

Everything the call-stack builder times -- an activation's begin, its
end, a marker -- is a *row* with a sequence number (the builder numbers
rows and anchors in execution order) and an instruction index.  A row is
timed between the last anchor before it and the first anchor after it
(in sequence order): rows wait in a FIFO until an anchor follows them,
and being pushed before or after an anchor at the same index decides
which time a row gets (what ended at a disable keeps the disable's time,
what begins after the enable gets the enable's).  Before the first anchor
rows take the first anchor's time.

The FIFO is bounded (``max_pending``): when it fills, the pending rows
are timed by extrapolating the last known rate (time per instruction)
and the result becomes a synthetic anchor.  At a trace gap the builder
calls :meth:`TimeBase.seal`, so that what ended before the gap is not
stretched over the lost time.

Modes: ``"insns"`` (time = instruction index, nothing waits), ``"tsc"``,
and ``"auto"`` (tsc once an anchor is seen; instruction counts if
``max_pending`` rows pile up before any anchor, or none ever comes).
Units of the resulting times (:attr:`TimeBase.unit`): ``"ns"`` (TSC with
a known frequency), ``"tsc"`` (TSC ticks, frequency unknown) or
``"insns"``.

:class:`TimeBase` works on numpy arrays (anchors and rows by the
thousand); :class:`Clock` is the same clock for one item at a time
(``push(item, idx)`` and later ``emit(item, time)`` in push order).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hwtrace.analysis import _runs_impl


class TimeBase:
    """The anchors of one stream and the rule that times rows by them.

    Rows are not stored here: the caller keeps its pending rows in
    sequence order and asks :meth:`times` for the longest prefix that can
    be timed now."""

    def __init__(self, mode: str = "auto", tsc_hz: float | None = None,
                 max_pending: int = 1 << 16):
        if mode not in ("auto", "tsc", "insns"):
            raise ValueError(f"bad clock mode {mode!r}")
        self.mode = mode
        self._scale = (1e9 / tsc_hz) if tsc_hz else None
        self.max_pending = max(1, max_pending)
        # anchors since the one before the oldest pending row
        self._a_seq = np.zeros(0, np.int64)
        self._a_idx = np.zeros(0, np.int64)
        self._a_t = np.zeros(0, np.float64)
        self._rate: float | None = None      # time per instruction
        self._last_tsc: int | None = None    # last raw value (stale filter)
        self._last_real: tuple[int, float] | None = None   # (idx, t) of last real anchor

    @property
    def unit(self) -> str | None:
        if self.mode == "insns":
            return "insns"
        if self.mode == "tsc":
            return "ns" if self._scale else "tsc"
        return None

    @property
    def last_seq(self) -> int:
        """Sequence number of the last anchor (-1: none)."""
        return int(self._a_seq[-1]) if len(self._a_seq) else -1

    @property
    def last(self) -> tuple[int, float] | None:
        """(index, time) of the last anchor."""
        if not len(self._a_seq):
            return None
        return int(self._a_idx[-1]), float(self._a_t[-1])

    # -- anchors -----------------------------------------------------------------
    def anchors(self, seq: np.ndarray, idx: np.ndarray, tsc: np.ndarray,
                zero: bool = False) -> None:
        """Anchors in sequence order (``tsc`` raw ticks; a repeated value is
        no anchor, nor is 0 -- a record's "no time" -- unless ``zero``)."""
        if self.mode == "insns" or not len(tsc):
            return
        tsc = np.asarray(tsc, np.uint64)
        keep = tsc != 0
        if not zero and not keep.all():
            seq, idx, tsc = seq[keep], idx[keep], tsc[keep]
            if not len(tsc):
                return
        prev = np.empty(len(tsc), np.uint64)
        prev[1:] = tsc[:-1]
        prev[0] = self._last_tsc if self._last_tsc is not None else 0
        new = tsc != prev
        if self._last_tsc is None:
            new[0] = True
        if not new.any():
            return
        seq, idx, tsc = seq[new], np.asarray(idx, np.int64)[new], tsc[new]
        self.mode = "tsc"
        self._last_tsc = int(tsc[-1])
        t = tsc.astype(np.float64)
        if self._scale:
            t *= self._scale
        last = self.last
        if last is not None:
            t = np.maximum(t, last[1])          # never let time run backwards
        t = np.maximum.accumulate(t)
        # the rate: the last pair of anchors with increasing index
        ai = np.concatenate(([last[0]], idx)) if last else idx
        at = np.concatenate(([last[1]], t)) if last else t
        step = np.flatnonzero(ai[1:] > ai[:-1])
        if len(step):
            k = step[-1]
            self._rate = (at[k + 1] - at[k]) / (ai[k + 1] - ai[k])
        self._a_seq = np.concatenate((self._a_seq, np.asarray(seq, np.int64)))
        self._a_idx = np.concatenate((self._a_idx, idx))
        self._a_t = np.concatenate((self._a_t, t))
        self._last_real = (int(idx[-1]), float(t[-1]))

    def anchors_every(self, seq0: int, step: int, idx: np.ndarray,
                      tsc: np.ndarray) -> None:
        """:meth:`anchors` of rows numbered ``seq0``, ``seq0 + step``, ...
        (a run's records, one per transfer): given only the rows where
        the TSC changes -- the others repeat the value before them, which
        :meth:`anchors` drops (a row after a 0 repeating the value before
        the 0 is a change here, and dropped there as ever).  A run's
        records mostly repeat the last TSC (~260,000 a batch on ``find``,
        a few thousand of them a new one)."""
        if self.mode == "insns" or not len(tsc):
            return
        tsc = np.asarray(tsc, np.uint64)
        c = np.flatnonzero(tsc[1:] != tsc[:-1])
        c += 1
        c = np.concatenate((np.zeros(1, c.dtype), c))
        self.anchors(seq0 + step * c.astype(np.int64), np.asarray(idx)[c], tsc[c])

    def anchor(self, seq: int, idx: int, tsc: int) -> None:
        """One anchor (an event's time: 0 is a time): :meth:`anchors` of
        one row, in scalars (the same float operations; thousands of
        events' times a run, each a dozen numpy calls on 1-element arrays
        that way)."""
        if self.mode == "insns":
            return
        tsc = int(tsc)
        if self._last_tsc is not None and tsc == self._last_tsc:
            return
        self.mode = "tsc"
        self._last_tsc = tsc
        t = float(tsc)
        if self._scale:
            t *= self._scale
        last = self.last
        if last is not None:
            t = max(t, last[1])                 # never let time run backwards
            if idx > last[0]:
                self._rate = (t - last[1]) / (idx - last[0])
        self._a_seq = np.append(self._a_seq, np.int64(seq))
        self._a_idx = np.append(self._a_idx, np.int64(idx))
        self._a_t = np.append(self._a_t, t)
        self._last_real = (int(idx), t)

    def seal(self, seq: int, idx: int) -> bool:
        """A synthetic anchor at (``seq``, ``idx``): the last rate carried
        on from the last anchor (what a gap or a full FIFO does).  Without
        any anchor: "auto" becomes "insns" (returns False), "tsc" starts
        at 0."""
        if self.mode == "insns":
            return True
        last = self.last
        if last is None:
            if self.mode == "auto":
                self.mode = "insns"
                return False
            t = 0.0
        else:
            i0, t0 = last
            t = t0 + (idx - i0) * self._rate if (self._rate and idx > i0) else t0
        self._a_seq = np.append(self._a_seq, seq)
        self._a_idx = np.append(self._a_idx, idx)
        self._a_t = np.append(self._a_t, t)
        return True

    # -- timing rows ---------------------------------------------------------------
    def ready(self, seq: np.ndarray) -> int:
        """How many of these pending rows (in sequence order) can be timed
        now: those an anchor follows."""
        if self.mode == "insns":
            return len(seq)
        return int(np.searchsorted(seq, self.last_seq, side="left")) \
            if len(self._a_seq) else 0

    def times(self, seq: np.ndarray, idx: np.ndarray, out=None) -> np.ndarray:
        """Times of rows that are :meth:`ready` (the compiled core's
        ``times`` where it is in use, else :meth:`_times`: the same
        numbers); ``out``: a contiguous float64 column to write them in
        (returned)."""
        if self.mode == "insns" or _runs_impl.CORE is None:
            t = np.asarray(idx, np.float64) if self.mode == "insns" else \
                self._times(seq, idx)
            if out is None:
                return t
            out[...] = t
            return out
        core = _runs_impl.CORE
        if out is None:
            out = np.empty(len(seq), np.float64)
        elif not out.flags.c_contiguous or out.dtype != np.float64:
            out[...] = self.times(seq, idx)
            return out
        core.times(np.ascontiguousarray(self._a_seq, np.int64),
                   np.ascontiguousarray(self._a_idx, np.int64),
                   np.ascontiguousarray(self._a_t, np.float64),
                   np.ascontiguousarray(seq, np.int64),
                   np.ascontiguousarray(idx, np.int64), out)
        return out

    def _times(self, seq: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The Python twin of the compiled ``times``."""
        a_seq, a_idx, a_t = self._a_seq, self._a_idx, self._a_t
        k = np.searchsorted(a_seq, seq, side="left")
        p = k - 1
        pc = np.maximum(p, 0)
        i0, t0 = a_idx[pc], a_t[pc]
        i1, t1 = a_idx[k], a_t[k]
        span = i1 - i0
        slope = np.where(span > 0, (t1 - t0) / np.where(span > 0, span, 1), 0.0)
        d = np.asarray(idx, np.int64) - i0
        t = np.where(d > 0, t0 + d * slope, t0)
        return np.where(p < 0, t1, t)

    def forget_before(self, seq: int | None) -> None:
        """No row older than ``seq`` (None: no row at all) will be asked
        about any more: drop the anchors it no longer needs (all but the
        last one before it)."""
        if len(self._a_seq) < 2:
            return
        if seq is None:
            self._a_seq = self._a_seq[-1:]
            self._a_idx = self._a_idx[-1:]
            self._a_t = self._a_t[-1:]
            return
        k = int(np.searchsorted(self._a_seq, seq, side="left")) - 1
        if k > 0:
            self._a_seq = self._a_seq[k:]
            self._a_idx = self._a_idx[k:]
            self._a_t = self._a_t[k:]


class Clock:
    """The clock for one item at a time: ``push(item, idx)``, and the
    ``emit(item, time)`` callback is called for each item, in push order,
    as soon as its time is known."""

    def __init__(self, emit: Callable[[object, float], None], mode: str = "auto",
                 tsc_hz: float | None = None, max_pending: int = 1 << 16):
        self._emit = emit
        self.base = TimeBase(mode, tsc_hz, max_pending)
        self._max = self.base.max_pending
        self._seq = 0
        self._items: list = []
        self._seqs: list[int] = []
        self._idxs: list[int] = []
        self._last_idx = 0

    @property
    def mode(self) -> str:
        return self.base.mode

    @property
    def unit(self) -> str | None:
        return self.base.unit

    @property
    def pending(self) -> int:
        return len(self._items)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def push(self, item, idx: int) -> None:
        self._last_idx = idx
        if self.base.mode == "insns":
            self._emit(item, idx)
            return
        self._items.append(item)
        self._seqs.append(self._next())
        self._idxs.append(idx)
        if len(self._items) > self._max:
            if self.base.mode == "auto":
                self.base.seal(self._next(), idx)
                self._flush()
            else:
                self.seal(idx)

    def anchor(self, idx: int, tsc: int) -> None:
        self.base.anchor(self._next(), idx, tsc)
        self._flush()

    def seal(self, idx: int) -> None:
        if self._items:
            self.base.seal(self._next(), idx)
            self._flush()

    def finish(self) -> None:
        if self._items:
            self.seal(max(self._idxs[-1], self._last_idx))

    def _flush(self) -> None:
        seq = np.array(self._seqs, np.int64)
        n = self.base.ready(seq)
        if not n:
            return
        t = self.base.times(seq[:n], np.array(self._idxs[:n], np.int64))
        items = self._items[:n]
        del self._items[:n], self._seqs[:n], self._idxs[:n]
        if self._seqs:
            self.base.forget_before(self._seqs[0])
        for item, ti in zip(items, t.tolist()):
            self._emit(item, ti)
