"""Text per instruction address, looked up for whole arrays of addresses.

A listing prints the same few thousand instructions millions of times,
so each address is formatted once and every later occurrence is an index
into the cache: :meth:`LineCache.ids` maps a numpy array of addresses to
cache indices with a vectorized open-addressing hash table (a handful of
numpy operations per batch, nothing per instruction in Python), and the
caller gathers ``lines[ids]`` and joins them.

The key is the address and the execution mode (the same bytes
disassemble differently in 32-bit code): ``ip ^ ((3 - mode) << 56)``,
which leaves 64-bit addresses as they are and puts the others where no
canonical 64-bit address is (their addresses are below 2**32).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

_MULT_INT = 0x9E3779B97F4A7C15              # Fibonacci hashing
_MULT = np.uint64(_MULT_INT)
_U64 = (1 << 64) - 1


def mode_tag(mode: int) -> np.uint64:
    """What a key of ``mode`` (batches.MODE_NUMBER) is XORed with."""
    return np.uint64(((3 - mode) & 3) << 56)


class LineCache:
    """``make(ips, sizes, iclasses, mode) -> [text]`` formats instructions
    the cache has not seen (one call per batch with every new address,
    plain Python ints); :attr:`lines` holds the results by id (a numpy
    object array, so ``lines[ids]`` gathers in C).  With ``columns`` > 1,
    ``make`` returns that many lists and :attr:`columns` holds one array
    per list (e.g. whole JSON lines and their heads)."""

    def __init__(self, make: Callable, columns: int = 1, bits: int = 12):
        self.make = make
        self.ncols = columns
        self.n = 0
        self.columns = [np.empty(1024, dtype=object) for _ in range(columns)]
        self._alloc(bits)

    @property
    def lines(self) -> np.ndarray:
        return self.columns[0]

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.mask = (1 << bits) - 1
        self.shift = np.uint64(64 - bits)
        self.keys = np.zeros(1 << bits, dtype=np.uint64)
        self.vals = np.full(1 << bits, -1, dtype=np.int32)

    def _slot(self, key: int) -> int:
        """Where ``key`` is, or the empty slot where it goes."""
        h = ((key * _MULT_INT) & _U64) >> (64 - self.bits)
        keys, vals, mask = self.keys, self.vals, self.mask
        while vals[h] >= 0 and int(keys[h]) != key:
            h = (h + 1) & mask
        return h

    def _insert(self, keys, ids) -> None:
        if 2 * (self.n + len(keys)) > (1 << self.bits):
            old_k = self.keys[self.vals >= 0]
            old_v = self.vals[self.vals >= 0]
            bits = self.bits + 1
            while (1 << bits) < 2 * (self.n + len(keys)):
                bits += 1
            self._alloc(bits)
            self._insert_all(old_k.tolist(), old_v.tolist())
        self._insert_all(keys, ids)

    def _insert_all(self, keys, ids) -> None:
        for k, i in zip(keys, ids):
            h = self._slot(k)
            self.keys[h] = k
            self.vals[h] = i

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Ids of ``keys`` (-1 where absent)."""
        mask = self.mask
        h = keys * _MULT
        h >>= self.shift
        h = h.view(np.int64)            # indices (no copy)
        ids = self.vals[h]
        # a slot holding another key: probe on (rare at load <= 1/2)
        todo = np.flatnonzero((ids >= 0) & (self.keys[h] != keys))
        while todo.size:
            hb = (h[todo] + 1) & mask
            h[todo] = hb
            v = self.vals[hb]
            ids[todo] = v
            todo = todo[(v >= 0) & (self.keys[hb] != keys[todo])]
        return ids

    def ids(self, ips: np.ndarray, sizes: np.ndarray, iclasses: np.ndarray,
            modes) -> np.ndarray:
        """Cache ids of the instructions (``modes``: one mode number for
        all, or an array per instruction)."""
        if np.isscalar(modes):
            tag = mode_tag(int(modes))
            keys = ips ^ tag if tag else ips
        else:
            keys = ips ^ (((3 - modes.astype(np.uint64)) & np.uint64(3))
                          << np.uint64(56))
        ids = self._find(keys)
        miss = np.flatnonzero(ids < 0)
        if miss.size:
            new, first = np.unique(keys[miss], return_index=True)
            at = miss[first]
            self._add(new, at, ips, sizes, iclasses, modes)
            ids[miss] = self._find(keys[miss])
        return ids

    def _add(self, new, at, ips, sizes, iclasses, modes) -> None:
        n0 = self.n
        cnt = len(new)
        while self.n + cnt > len(self.columns[0]):
            self.columns = [np.concatenate([c, np.empty(len(c), dtype=object)])
                            for c in self.columns]
        if np.isscalar(modes):
            groups = [(int(modes), np.arange(cnt))]
        else:
            m = modes[at]
            groups = [(int(v), np.flatnonzero(m == v)) for v in np.unique(m)]
        for mode, sel in groups:
            a = at[sel]
            made = self.make(ips[a].tolist(), sizes[a].tolist(),
                             iclasses[a].tolist(), mode)
            if self.ncols == 1:
                made = (made,)
            for col, vals in zip(self.columns, made):
                col[n0 + sel] = vals
        self.n += cnt
        self._insert(new.tolist(), range(n0, n0 + cnt))
