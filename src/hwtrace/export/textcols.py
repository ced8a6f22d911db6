"""Text lines (and binary records) built a column at a time (numpy), for
the views' output.

A view that writes a line per activation (``calls``, Chrome JSON,
Perfetto packets) would spend most of its time formatting them one by
one.  :class:`Lines` formats a whole chunk of rows at once: each column (a
literal, strings from a table, integers, exact binary fractions, varints)
becomes a byte matrix of one row per line, aligned left or right, with
each row's length; the line is the columns side by side, and
``mat[mask]`` squeezes out what is not there.

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


def _digits(v: np.ndarray, width: int, impl: str | None = None) -> np.ndarray:
    """(n, width) ASCII digits of non-negative integers, right-aligned,
    zero-padded (the compiled core's, or the twin's below)."""
    from hwtrace.export import _textcols_impl
    core = _textcols_impl.core_for(impl)
    if core is not None:
        x = np.ascontiguousarray(v, np.uint64)
        return np.frombuffer(core.digits(x, width), np.uint8).reshape(len(x), width)
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


def small_ids(ids: np.ndarray, size: int | None = None):
    """(distinct values, index of each) for small non-negative integers,
    without sorting."""
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return ids, ids
    top = int(ids.max()) + 1 if size is None else size
    seen = np.bincount(ids, minlength=top) != 0
    u = np.flatnonzero(seen)
    lut = np.zeros(top, np.int64)
    lut[u] = np.arange(len(u))
    return u, lut[ids]


class Lines:
    """Columns are (matrix, align, lengths): ``align`` "L"/"R" (the row's
    bytes at the left or right of its matrix row), lengths per row (None:
    every row has the full width)."""

    def __init__(self, n: int):
        self.n = n
        self._cols: list[tuple[np.ndarray, str, np.ndarray | None]] = []

    # -- columns ----------------------------------------------------------------
    def lit(self, b: bytes) -> "Lines":
        if b:
            self._cols.append((np.frombuffer(b, np.uint8), "L", None))
        return self

    def when(self, cond: np.ndarray, b: bytes) -> "Lines":
        """``b`` on the lines where ``cond`` holds."""
        if b and self.n:
            c = np.asarray(cond, bool)
            self._cols.append((np.frombuffer(b, np.uint8), "L",
                               np.where(c, len(b), 0)))
        return self

    def strs(self, table: list[bytes], ids: np.ndarray, width: int = 0,
             right: bool = False) -> "Lines":
        """``table[ids[i]]``, padded with spaces to ``width`` (left- or
        right-aligned; longer strings are not cut)."""
        n = self.n
        if not n:
            return self
        ids = np.asarray(ids, np.int64)
        if len(table) <= 4096:
            sub, inv = table, ids
        else:
            u, inv = np.unique(ids, return_inverse=True)
            inv = np.asarray(inv).reshape(-1)
            sub = [table[i] for i in u.tolist()]
        lens = np.fromiter((len(s) for s in sub), np.int64, len(sub))
        rl = lens[inv]
        w = int(max(rl.max(initial=0), width))
        if not w:
            return self
        tab = np.full((len(sub), w), _SPACE, np.uint8)
        for j, s in enumerate(sub):
            if s and len(s) <= w:
                if right:
                    tab[j, w - len(s):] = np.frombuffer(s, np.uint8)
                else:
                    tab[j, :len(s)] = np.frombuffer(s, np.uint8)
        self._cols.append((tab[inv], "R" if right else "L", np.maximum(rl, width)))
        return self

    def int(self, v: np.ndarray, width: int = 0, commas: bool = False) -> "Lines":
        """Integers (negative ones with a ``-``), right-aligned in at
        least ``width`` characters; ``commas``: thousands separated."""
        n = self.n
        if not n:
            return self
        v = np.asarray(v)
        neg = v < 0 if v.dtype.kind == "i" else np.zeros(n, bool)
        anyneg = bool(neg.any())
        a = np.where(neg, -v, v).astype(np.uint64) if anyneg else v.astype(np.uint64)
        nd = _ndigits(a)
        D = int(nd.max())
        dig = _digits(a, D)
        if commas and D > 3:
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
        if anyneg:
            ln = ln + neg
        full = int(max(int(ln.max()), width))
        if full > W:
            mat = np.full((n, full), _SPACE, np.uint8)
            mat[:, full - W:] = body
        else:
            mat = body
        if width or anyneg:
            pos = np.arange(full)
            mat[pos < (full - ln)[:, None]] = _SPACE
            if anyneg:
                rows = np.flatnonzero(neg)
                mat[rows, full - ln[rows]] = ord("-")
        self._cols.append((mat, "R", np.maximum(ln, width)))
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
        self.lit(prefix)
        self._cols.append((mat, "R", nd))
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
        self.when(neg, b"-")
        self.int(ip)
        self.lit(b".")
        fd = _digits(fp, bits)
        # strip trailing zeros, keep one digit
        nz = fd != ord("0")
        last = np.where(nz.any(1), bits - 1 - np.argmax(nz[:, ::-1], 1), 0)
        self._cols.append((fd, "L", last + 1))
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
            if not more.any():
                mat = mat[:, :k + 1]
                break
            if k < 9:
                mat[:, k] |= more.astype(np.uint8) << 7
                ln += more
        self._cols.append((mat, "L", ln))
        return self

    def only(self, cond: np.ndarray) -> "Lines":
        """The column just added shows only where ``cond`` holds."""
        if self.n and self._cols:
            m, al, ln = self._cols[-1]
            c = np.asarray(cond, bool)
            full = ln if ln is not None else np.full(self.n, m.shape[-1], np.int64)
            self._cols[-1] = (m, al, np.where(c, full, 0))
        return self

    def spaces(self, count: np.ndarray) -> "Lines":
        """``count`` spaces per line (0 or more)."""
        if self.n:
            c = np.maximum(np.asarray(count, np.int64), 0)
            w = int(c.max(initial=0))
            if w:
                self._cols.append((np.full(w, _SPACE, np.uint8), "L", c))
        return self

    def extend(self, other: "Lines") -> "Lines":
        self._cols.extend(other._cols)
        return self

    def lengths(self) -> np.ndarray:
        """Bytes per line so far."""
        out = np.zeros(self.n, np.int64)
        fixed = 0
        for m, _al, ln in self._cols:
            if ln is None:
                fixed += m.shape[-1]
            else:
                out += ln
        return out + fixed

    # -- output --------------------------------------------------------------------
    def _compiled(self, impl: str | None):
        """The lines by the compiled core (each row's bytes of each column
        copied into place), or None where the twin runs."""
        from hwtrace.export import _textcols_impl
        core = _textcols_impl.core_for(impl)
        if core is None:
            return None
        n = self.n
        cols = []
        for m, al, ln in self._cols:
            m = np.asarray(m)
            if m.ndim == 2 and m.shape[0] == 1:
                m = m[0]
            if m.ndim == 2 and m.shape[0] != n or m.ndim > 2:
                return None
            cols.append((np.ascontiguousarray(m, np.uint8), m.ndim == 2, al != "L",
                         None if ln is None else
                         np.ascontiguousarray(np.broadcast_to(ln, (n,)), np.int64)))
        return core.assemble(n, cols)

    def text(self, impl: str | None = None) -> bytes:
        """The lines, for text (no NUL byte in any column): each column
        copied into place with what is not there set to NUL, the NULs
        then squeezed out by ``bytes.replace`` (much faster than masked
        indexing).  The compiled core, where it loaded, copies each row's
        bytes into place (and squeezes out NULs too, should any be there)."""
        n = self.n
        if not n or not self._cols:
            return b""
        out = self._compiled(impl)
        if out is not None:
            return out.replace(b"\0", b"") if b"\0" in out else out
        widths = [c[0].shape[-1] for c in self._cols]
        W = sum(widths)
        mat = np.empty((n, W), np.uint8)
        c = 0
        for (m, al, ln), w in zip(self._cols, widths):
            dst = mat[:, c:c + w]
            if ln is None:
                dst[...] = m
            else:
                pos = np.arange(w)
                keep = pos < ln[:, None] if al == "L" else pos >= (w - ln)[:, None]
                np.multiply(m, keep, out=dst, casting="unsafe")
            c += w
        return mat.tobytes().replace(b"\0", b"")

    def render(self, impl: str | None = None) -> bytes:
        n = self.n
        if not n or not self._cols:
            return b""
        out = self._compiled(impl)
        if out is not None:
            return out
        widths = [c[0].shape[-1] for c in self._cols]
        W = sum(widths)
        mat = np.empty((n, W), np.uint8)
        mask = np.empty((n, W), bool)
        c = 0
        for (m, al, ln), w in zip(self._cols, widths):
            mat[:, c:c + w] = m
            if ln is None:
                mask[:, c:c + w] = True
            elif al == "L":
                np.less(np.arange(w), ln[:, None], out=mask[:, c:c + w])
            else:
                np.greater_equal(np.arange(w), (w - ln)[:, None], out=mask[:, c:c + w])
            c += w
        return mat[mask].tobytes()
