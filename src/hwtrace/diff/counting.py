"""Exact counts of (from, to) address pairs at numpy speed.

Sorting every pair a trace produces (hundreds of millions) would cost more
than decoding it, but the distinct pairs (the edges of the code run) are
few.  :class:`PairCounter` is an open hash table held in numpy arrays:
each pair hashes to a bucket, the first pair to land in a bucket owns it,
and a batch of pairs is counted with one ``bincount`` over the buckets
whose owner it is.  The rare pair that finds its bucket owned by another
(a collision) is counted exactly on the side, in a dict.  Buffered input
is counted a million pairs at a time; the table doubles when it gets a
quarter full.
"""

from __future__ import annotations

import numpy as np

_MUL = np.uint64(0x9E3779B97F4A7C15)
_MUL2 = np.uint64(0xC2B2AE3D27D4EB4F)
_BATCH = 1 << 20


class PairCounter:
    def __init__(self, bits: int = 16):
        self._alloc(bits)
        self.spill: dict = {}                   # (a, b) -> count
        self._buf_a: list = []
        self._buf_b: list = []
        self._nbuf = 0

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        n = 1 << bits
        self.ra = np.zeros(n, np.uint64)
        self.rb = np.zeros(n, np.uint64)
        self.used = np.zeros(n, bool)
        self.counts = np.zeros(n, np.int64)
        self.nused = 0

    def _bucket(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            h = (a * _MUL) ^ (b * _MUL2)
            h ^= h >> np.uint64(29)
            h *= _MUL
        return (h >> np.uint64(64 - self.bits)).astype(np.intp)

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        if not len(a):
            return
        self._buf_a.append(np.asarray(a, np.uint64))
        self._buf_b.append(np.asarray(b, np.uint64))
        self._nbuf += len(a)
        if self._nbuf >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._nbuf:
            return
        a = np.concatenate(self._buf_a)
        b = np.concatenate(self._buf_b)
        self._buf_a, self._buf_b, self._nbuf = [], [], 0
        self._count(a, b, None)

    def _count(self, a, b, w) -> None:
        h = self._bucket(a, b)
        new = ~self.used[h]
        if new.any():
            hn = h[new]
            self.ra[hn] = a[new]
            self.rb[hn] = b[new]
            self.used[hn] = True
            self.nused = int(np.count_nonzero(self.used))
        mine = (self.ra[h] == a) & (self.rb[h] == b)
        self.counts += np.bincount(h[mine], weights=None if w is None else w[mine],
                                   minlength=len(self.counts)).astype(np.int64)
        if not mine.all():
            other = ~mine
            oa, ob = a[other].tolist(), b[other].tolist()
            ow = [1] * len(oa) if w is None else w[other].tolist()
            sp = self.spill
            for x, y, c in zip(oa, ob, ow):
                sp[(x, y)] = sp.get((x, y), 0) + c
        if self.nused * 4 > len(self.used):
            self._grow()

    def _grow(self) -> None:
        live = np.flatnonzero(self.used)
        a, b, c = self.ra[live], self.rb[live], self.counts[live]
        self._alloc(self.bits + 2)
        self._count(a, b, c)

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(from, to, count) of every pair counted, sorted by (from, to)."""
        self.flush()
        live = np.flatnonzero(self.used & (self.counts > 0))
        a, b, c = self.ra[live], self.rb[live], self.counts[live]
        if self.spill:
            ka = np.array([k[0] for k in self.spill], np.uint64)
            kb = np.array([k[1] for k in self.spill], np.uint64)
            kc = np.array(list(self.spill.values()), np.int64)
            a, b, c = np.concatenate([a, ka]), np.concatenate([b, kb]), \
                np.concatenate([c, kc])
            order = np.lexsort((b, a))
            a, b, c = a[order], b[order], c[order]
            new = np.ones(len(a), bool)
            new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
            idx = np.flatnonzero(new)
            return a[idx], b[idx], np.add.reduceat(c, idx)
        order = np.lexsort((b, a))
        return a[order], b[order], c[order]

    def merge(self, other: "PairCounter") -> None:
        a, b, c = other.items()
        self.flush()
        if len(a):
            self._count(a, b, c)


def pairs_in(xa: np.ndarray, xb: np.ndarray, ya: np.ndarray,
             yb: np.ndarray) -> np.ndarray:
    """For each pair of x, is it among the pairs of y?"""
    if not len(xa) or not len(ya):
        return np.zeros(len(xa), bool)
    t = PairCounter(max(8, int(len(ya)).bit_length() + 2))
    t._count(np.asarray(ya, np.uint64), np.asarray(yb, np.uint64), None)
    h = t._bucket(xa, xb)
    hit = t.used[h] & (t.ra[h] == xa) & (t.rb[h] == xb)
    if t.spill:
        rest = np.flatnonzero(~hit)
        for i in rest.tolist():
            if (int(xa[i]), int(xb[i])) in t.spill:
                hit[i] = True
    return hit
