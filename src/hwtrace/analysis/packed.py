"""Chunks of activations packed small while they wait (no I/O).

A view over several CPUs' streams holds every later stream's chunks
(:class:`~.slices.Slices`) until the streams before it have ended --
spooled to a file past a memory limit (``hwtrace.cli._spool``).  On a
system-call-dense recording that is most of a stream's rows (yes: ~770 MB
for one CPU), and writing them to the file and reading them back cost
more than the views' own work on them.  Many of those bytes say little:

* a column of one value (an enter's end fields, unset; the pid and tid
  of a one-thread stream; the call paths where no writer wants them) is
  kept as that value (its bits: -0.0 stays -0.0);
* an int64 column whose values lie within 2**31 of each other
  (activation ids, sequence numbers, instruction indices) is kept as
  int32 offsets from its least value.

:func:`pack` and :func:`unpack` give back exactly the rows they took,
bit for bit, as contiguous writable columns.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.slices import Cols, Slices

_I8 = np.dtype(np.int64)
_I4_SPAN = 1 << 31


class _Same:
    """A column of ``n`` copies of one value (``one``: a 1-row array)."""

    __slots__ = ("one", "n")

    def __init__(self, one: np.ndarray, n: int):
        self.one, self.n = one, n

    def __reduce__(self):
        return (_Same, (self.one, self.n))

    def array(self) -> np.ndarray:
        out = np.empty(self.n, self.one.dtype)
        out[...] = self.one[0]
        return out


class _Offsets:
    """An int64 column as int32 offsets from ``base``."""

    __slots__ = ("base", "off")

    def __init__(self, base: int, off: np.ndarray):
        self.base, self.off = base, off

    def __reduce__(self):
        return (_Offsets, (self.base, self.off))

    def array(self) -> np.ndarray:
        return np.add(self.off, np.int64(self.base), dtype=np.int64)


def _pack_column(a: np.ndarray):
    n = len(a)
    if n < 2:
        return a
    a = np.ascontiguousarray(a)
    w = a.dtype.itemsize
    bits = a.view(f"u{w}") if w in (1, 2, 4, 8) else None
    if bits is not None and bits[0] == bits[-1] and (bits == bits[0]).all():
        return _Same(a[:1].copy(), n)
    if a.dtype == _I8:
        lo, hi = int(a.min()), int(a.max())
        if hi - lo < _I4_SPAN:
            off = np.empty(n, np.int32)
            np.subtract(a, np.int64(lo), out=off, casting="unsafe")
            return _Offsets(lo, off)
    return a


def _unpack_column(c) -> np.ndarray:
    return c if isinstance(c, np.ndarray) else c.array()


def _pack_cols(c: Cols) -> tuple:
    return (c.n, {f: _pack_column(a) for f, a in c.d.items()})


def _unpack_cols(p: tuple) -> Cols:
    n, d = p
    return Cols({f: _unpack_column(a) for f, a in d.items()}, n)


def pack(chunk: Slices) -> tuple:
    """``chunk`` packed (for :func:`unpack`; picklable)."""
    return (_pack_cols(chunk.enters), _pack_cols(chunk.exits), chunk.markers)


def unpack(p: tuple) -> Slices:
    """The chunk :func:`pack` took, bit for bit."""
    e, x, markers = p
    return Slices(_unpack_cols(e), _unpack_cols(x), markers)
