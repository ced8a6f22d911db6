"""The call stack of a step stream, kept up to date a chunk at a time.

``hwtrace diff`` needs the call stack wherever two runs part, and that
can be anywhere in hundreds of millions of instructions, so the stack is
maintained over every step -- at numpy speed, not step by step in
Python.  (:mod:`hwtrace.analysis.callstack` reconstructs complete
activations with times and flags, instruction by instruction; here only
the open frames matter.)

The stack is the list of the call sites (addresses of the call
instructions) of the open frames, outermost first.  A chunk of steps
changes it in one move: its returns pop ``-min(running depth)`` frames
that were open before the chunk, and the calls it makes that are still
open at its end -- a call at running depth ``r`` that the rest of the
chunk never drops below -- are pushed.  A return with nothing left to pop
(the trace began inside the function returning) pops nothing: the stack
starts wherever the trace did.  An exec empties it.

Frame ``k``'s function is the one holding call site ``k + 1`` (the top
frame's, the one holding the current instruction).
"""

from __future__ import annotations

import numpy as np


class ShadowStack:
    """Open frames' call sites (own addresses: ``rend`` of the call steps)."""

    def __init__(self):
        self.sites: list[int] = []
        self.calls = 0          # calls made so far
        self.lost = 0           # returns that found the stack empty

    def advance(self, steps: np.ndarray) -> None:
        """Apply ``steps`` (consecutive, in order).  A step beginning a
        program its process exec'd (``exec``) starts from an empty stack:
        the old program's frames never return."""
        if not len(steps):
            return
        execs = np.flatnonzero(steps["exec"])
        if len(execs):
            cuts = [0, *execs.tolist(), len(steps)]
            for i, j in zip(cuts, cuts[1:]):
                if i < j:
                    if steps["exec"][i]:
                        self.sites.clear()
                    self._apply(steps[i:j])
            return
        self._apply(steps)

    def _apply(self, steps: np.ndarray) -> None:
        d = steps["delta"].astype(np.int64)
        r = np.cumsum(d)                        # depth after each step
        low = int(r.min())
        if low < 0:
            pop = -low
            have = len(self.sites)
            if pop > have:
                self.lost += pop - have
                pop = have
            if pop:
                del self.sites[have - pop:]
        calls = d > 0
        ncalls = int(np.count_nonzero(calls))
        if not ncalls:
            return
        self.calls += ncalls
        suffix_min = np.minimum.accumulate(r[::-1])[::-1]
        keep = calls & (suffix_min >= r)
        if keep.any():
            self.sites.extend(steps["rend"][keep].tolist())

    def snapshot(self) -> list[int]:
        return list(self.sites)
