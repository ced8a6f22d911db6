"""Text lines built a column at a time (numpy), for the views' output.

A view that writes a line per activation (``calls``, Chrome JSON) would
spend most of its time formatting them one by one.  :class:`Lines`
formats a whole chunk of rows at once: each column (a literal, strings
from a table, integers, exact binary fractions) becomes a byte matrix of
one row per line and a mask of the bytes that are there; the line is the
columns side by side, and ``mat[mask]`` squeezes out what is not there.

    t = Lines(len(rows))
    t.lit(b'{"ts":'); t.frac(ts_k, 10); t.lit(b"}\\n")
    out.write(t.render())
"""

from __future__ import annotations

import numpy as np

_QUAD = np.array([list(b"%04d" % i) for i in range(10000)], np.uint8)
_POW10 = np.array([10 ** k for k in range(19)], np.uint64)
_SPACE = 32


def _ndigits(v: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers (0 has one)."""
    return (np.searchsorted(_POW10, v.astype(np.uint64), side="right")
            .astype(np.int64)).clip(1, None)


def _digits(v: np.ndarray, width: int) -> np.ndarray:
    """(n, width) ASCII digits of non-negative integers, right-aligned,
    zero-padded."""
    n = len(v)
    mat = np.empty((n, width), np.uint8)
    x = v.astype(np.uint64)
    k = width
    while k > 0:
        q = x // np.uint64(10000)
        r = (x - q * np.uint64(10000)).astype(np.int64)
        lo = max(k - 4, 0)
        mat[:, lo:k] = _QUAD[r][:, 4 - (k - lo):]
        x = q
        k = lo
    return mat


class Lines:
    def __init__(self, n: int):
        self.n = n
        self._cols: list[tuple[np.ndarray, np.ndarray | None]] = []

    # -- columns ----------------------------------------------------------------
    def lit(self, b: bytes) -> "Lines":
        if b:
            self._cols.append((np.frombuffer(b, np.uint8), None))
        return self

    def strs(self, table: list[bytes], ids: np.ndarray, width: int = 0,
             right: bool = False) -> "Lines":
        """``table[ids[i]]``, padded with spaces to ``width`` (left- or
        right-aligned; longer strings are not cut)."""
        n = self.n
        if not n:
            return self
        u, inv = np.unique(ids, return_inverse=True)
        sub = [table[i] for i in u.tolist()]
        lens = np.array([len(s) for s in sub], np.int64)
        w = int(max(lens.max(initial=0), width))
        tab = np.full((len(sub), w), _SPACE, np.uint8)
        for j, s in enumerate(sub):
            if s:
                if right:
                    tab[j, w - len(s):] = np.frombuffer(s, np.uint8)
                else:
                    tab[j, :len(s)] = np.frombuffer(s, np.uint8)
        shown = np.maximum(lens, width)[inv]
        mat = tab[inv]
        pos = np.arange(w)
        mask = pos >= (w - shown)[:, None] if right else pos < shown[:, None]
        self._cols.append((mat, mask))
        return self

    def int(self, v: np.ndarray, width: int = 0, commas: bool = False) -> "Lines":
        """Integers (negative ones with a ``-``), right-aligned in at
        least ``width`` characters; ``commas``: thousands separated."""
        n = self.n
        if not n:
            return self
        v = np.asarray(v)
        neg = v < 0 if v.dtype.kind == "i" else np.zeros(n, bool)
        a = np.where(neg, -v, v).astype(np.uint64) if neg.any() else v.astype(np.uint64)
        nd = _ndigits(a)
        D = int(nd.max())
        dig = _digits(a, D)
        if commas:
            W = D + (D - 1) // 3
            p = np.arange(W)[::-1]              # position from the right
            is_comma = p % 4 == 3
            q = p - p // 4                      # digit number from the right
            src = np.where(is_comma, 0, D - 1 - q)
            body = dig[:, src]
            body[:, is_comma] = ord(",")
            ln = nd + (nd - 1) // 3
        else:
            W = D
            body = dig
            ln = nd
        ln = ln + neg
        full = int(max(ln.max(), width))
        mat = np.full((n, full), _SPACE, np.uint8)
        mat[:, full - W:] = body
        pos = np.arange(full)
        mat[pos < (full - ln)[:, None]] = _SPACE
        if neg.any():
            rows = np.flatnonzero(neg)
            mat[rows, full - ln[rows]] = ord("-")
        shown = np.maximum(ln, width)
        mask = pos >= (full - shown)[:, None]
        self._cols.append((mat, mask))
        return self

    def hex(self, v: np.ndarray, prefix: bytes = b"0x") -> "Lines":
        """Lower-case hexadecimal, no padding."""
        n = self.n
        if not n:
            return self
        a = np.asarray(v).astype(np.uint64)
        mat = np.empty((n, 16), np.uint8)
        digits = np.frombuffer(b"0123456789abcdef", np.uint8)
        x = a.copy()
        for k in range(15, -1, -1):
            mat[:, k] = digits[(x & np.uint64(15)).astype(np.int64)]
            x >>= np.uint64(4)
        nd = np.ones(n, np.int64)
        for k in range(1, 16):
            nd += (a >> np.uint64(4 * k)) != 0
        mask = np.arange(16) >= (16 - nd)[:, None]
        self.lit(prefix)
        self._cols.append((mat, mask))
        return self

    def frac(self, k: np.ndarray, bits: int = 10) -> "Lines":
        """``k / 2**bits`` exactly, as a JSON number with at least one
        decimal (``1.5``, ``0.0009765625``, ``-2.0``)."""
        n = self.n
        if not n:
            return self
        k = np.asarray(k, np.int64)
        neg = k < 0
        a = np.abs(k)
        ip = a >> bits
        fp = (a & ((1 << bits) - 1)) * (5 ** bits)       # / 10**bits
        self_cols = self._cols
        # sign
        sign = np.full((n, 1), ord("-"), np.uint8)
        self_cols.append((sign, neg[:, None]))
        self.int(ip)
        self.lit(b".")
        fd = _digits(fp, bits)
        # strip trailing zeros, keep one digit
        nz = fd != ord("0")
        last = np.where(nz.any(1), bits - 1 - np.argmax(nz[:, ::-1], 1), 0)
        mask = np.arange(bits) <= last[:, None]
        self_cols.append((fd, mask))
        return self

    def varint(self, v: np.ndarray) -> "Lines":
        """Protobuf base-128 varints of non-negative integers."""
        n = self.n
        if not n:
            return self
        a = np.asarray(v).astype(np.uint64)
        mat = np.empty((n, 10), np.uint8)
        x = a.copy()
        ln = np.ones(n, np.int64)
        for k in range(10):
            mat[:, k] = (x & np.uint64(0x7F)).astype(np.uint8)
            x >>= np.uint64(7)
            more = x != 0
            if k < 9:
                mat[more, k] |= 0x80
                ln += more
            if not more.any():
                mat = mat[:, :k + 1]
                break
        w = mat.shape[1]
        self._cols.append((mat, np.arange(w) < ln[:, None]))
        return self

    def when(self, cond: np.ndarray, b: bytes) -> "Lines":
        """``b`` on the lines where ``cond`` holds."""
        if b and self.n:
            self._cols.append((np.frombuffer(b, np.uint8),
                               np.broadcast_to(np.asarray(cond, bool)[:, None],
                                               (self.n, len(b)))))
        return self

    def only(self, cond: np.ndarray) -> "Lines":
        """The column just added shows only where ``cond`` holds."""
        if self.n and self._cols:
            m, k = self._cols[-1]
            c = np.asarray(cond, bool)[:, None]
            w = m.shape[-1]
            k = np.broadcast_to(c, (self.n, w)) if k is None else (k & c)
            self._cols[-1] = (m, k)
        return self

    def spaces(self, count: np.ndarray) -> "Lines":
        """``count`` spaces per line (0 or more)."""
        if self.n:
            c = np.maximum(np.asarray(count, np.int64), 0)
            w = int(c.max(initial=0))
            if w:
                self._cols.append((np.full(w, _SPACE, np.uint8),
                                   np.arange(w) < c[:, None]))
        return self

    def extend(self, other: "Lines") -> "Lines":
        self._cols.extend(other._cols)
        return self

    def lengths(self) -> np.ndarray:
        """Bytes per line so far."""
        out = np.zeros(self.n, np.int64)
        for m, k in self._cols:
            out += m.shape[-1] if k is None else k.sum(1)
        return out

    # -- output --------------------------------------------------------------------
    def render(self) -> bytes:
        n = self.n
        if not n or not self._cols:
            return b""
        widths = [c[0].shape[-1] for c in self._cols]
        W = sum(widths)
        mat = np.empty((n, W), np.uint8)
        mask = np.empty((n, W), bool)
        c = 0
        for (m, k), w in zip(self._cols, widths):
            mat[:, c:c + w] = m
            mask[:, c:c + w] = True if k is None else k
            c += w
        return mat[mask].tobytes()
