"""Giving instruction indices a time, streaming, in bounded memory.

Intel PT timing (TSC, and MTC/CYC refining it) reaches the flow decoder as
events carrying ``tsc``: *anchors* (instruction index, time).  Decoders
repeat the last known value on every event until a new timing packet
arrives, so only a changed value makes an anchor.  Between two
anchors the time of an instruction is interpolated linearly by its index
(as magic-trace does), so every item that needs a time waits in a queue
until the next anchor comes.  The queue is bounded (``max_pending``); when
it fills, the pending items are timed by extrapolating the last known rate
(time per instruction) and the result becomes a synthetic anchor.  At a
trace gap the builder calls :meth:`Clock.seal`, so that what ended before
the gap is not stretched over the lost time.

Modes: ``"insns"`` (time = instruction index, nothing waits), ``"tsc"``,
and ``"auto"`` (tsc once an anchor is seen; instruction counts if
``max_pending`` items pile up before any anchor).  Units of the resulting
times (:attr:`Clock.unit`): ``"ns"`` (TSC with a known frequency),
``"tsc"`` (TSC ticks, frequency unknown) or ``"insns"``.

Items are opaque to the clock: ``push(item, idx)`` and later
``emit(item, time)`` in the same order (FIFO).
"""

from __future__ import annotations

from collections import deque
from typing import Callable


class Clock:
    def __init__(self, emit: Callable[[object, float], None], mode: str = "auto",
                 tsc_hz: float | None = None, max_pending: int = 1 << 16):
        if mode not in ("auto", "tsc", "insns"):
            raise ValueError(f"bad clock mode {mode!r}")
        self._emit = emit
        self.mode = mode
        self._scale = (1e9 / tsc_hz) if tsc_hz else None
        self._max = max(1, max_pending)
        self._q: deque = deque()
        self._prev: tuple[int, float] | None = None   # last anchor
        self._rate: float | None = None               # time per instruction
        self._last_idx = 0
        self._last_tsc = None

    @property
    def unit(self) -> str | None:
        if self.mode == "insns":
            return "insns"
        if self.mode == "tsc":
            return "ns" if self._scale else "tsc"
        return None

    @property
    def pending(self) -> int:
        return len(self._q)

    # -- input -----------------------------------------------------------

    def push(self, item, idx: int) -> None:
        self._last_idx = idx
        if self.mode == "insns":
            self._emit(item, idx)
            return
        self._q.append((item, idx))
        if len(self._q) > self._max:
            if self.mode == "auto":
                self._become_insns()
            else:
                self.seal(idx)

    def anchor(self, idx: int, tsc: int) -> None:
        """An instruction index whose time is known (``tsc`` in ticks)."""
        if self.mode == "insns":
            return
        self.mode = "tsc"
        if tsc == self._last_tsc:
            # the decoder repeats the last timing value on every event until
            # a new timing packet comes: only a new value says when *now* is
            return
        self._last_tsc = tsc
        t = tsc * self._scale if self._scale else tsc
        prev = self._prev
        if prev is not None:
            i0, t0 = prev
            if t < t0:          # never let time run backwards
                t = t0
            if idx > i0:
                self._rate = (t - t0) / (idx - i0)
        self._resolve_upto(idx, t)
        self._prev = (idx, t)

    def seal(self, idx: int) -> None:
        """Time everything pending up to ``idx`` now, by extrapolation."""
        if self.mode == "insns" or not self._q:
            return
        if self._prev is None:
            if self.mode == "auto":
                self._become_insns()
            else:           # tsc mode without an anchor yet: zero-based
                self._prev = (idx, 0.0)
                self._resolve_upto(idx, 0.0)
            return
        i0, t0 = self._prev
        t = t0 + (idx - i0) * self._rate if (self._rate and idx > i0) else t0
        self._resolve_upto(idx, t)
        self._prev = (idx, t)

    def finish(self) -> None:
        if self._q:
            last = self._q[-1][1]
            self.seal(max(last, self._last_idx))

    # -- internals ---------------------------------------------------------

    def _become_insns(self) -> None:
        self.mode = "insns"
        q, self._q = self._q, deque()
        for item, idx in q:
            self._emit(item, idx)

    def _resolve_upto(self, i1: int, t1: float) -> None:
        q = self._q
        emit = self._emit
        prev = self._prev
        if prev is None:
            while q and q[0][1] <= i1:
                item, _ = q.popleft()
                emit(item, t1)
            return
        i0, t0 = prev
        span = i1 - i0
        slope = (t1 - t0) / span if span > 0 else 0.0
        while q and q[0][1] <= i1:
            item, i = q.popleft()
            emit(item, t0 + (i - i0) * slope if i > i0 else t0)
