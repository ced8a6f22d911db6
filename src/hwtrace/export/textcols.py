"""Text lines (and binary records) built a column at a time, for the
views' output.

A view that writes a line per activation (``calls``, Chrome JSON,
Perfetto packets) would spend most of its time formatting them one by
one.  :class:`Lines` takes a whole chunk of rows at once, a column at a
time (a literal, strings from a table, integers, exact binary fractions,
varints), recorded as ops.  The compiled core (``_c_textcols.rows``)
formats each row's columns straight from the values; the Python twin
makes each column a byte matrix of one row per line, aligned left or
right, with each row's length, and the line is the columns side by side
(``mat[mask]`` squeezes out what is not there).

    t = Lines(len(rows))
    t.lit(b'{"ts":'); t.frac(ts_k, 10); t.lit(b"}\\n")
    out.write(t.render())
"""

from __future__ import annotations

import numpy as np

from hwtrace._unique import unique

_QUAD = np.array([list(b"%04d" % i) for i in range(10000)], np.uint8)
_POW10 = np.array([10 ** k for k in range(19)], np.uint64)
_SPACE = 32


def _ndigits(v: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers (0 has one)."""
    return (np.searchsorted(_POW10, v.astype(np.uint64), side="right")
            .astype(np.int64)).clip(1, None)


def _digits(v: np.ndarray, width: int) -> np.ndarray:
    """(n, width) ASCII digits of non-negative integers, right-aligned,
    zero-padded (the low ``width`` digits of a value with more): the
    twin's columns."""
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
    """Columns are recorded as ops (:data:`_OP` codes, with what each
    needs: literal bytes, a table and ids, values) and turned into bytes
    at :meth:`render` / :meth:`text` / :meth:`lengths`: by the compiled
    core a row at a time (``rows``), or by the Python twin, which makes
    each op a column (matrix, align, lengths): ``align`` "L"/"R" (the
    row's bytes at the left or right of its matrix row), lengths per row
    (None: every row has the full width).  An op's ``cond`` (None or
    bools) empties it where false."""

    def __init__(self, n: int):
        self.n = n
        self._ops: list[list] = []

    def _add(self, code: int, cond, *args) -> "Lines":
        self._ops.append([code, cond, *args])
        return self

    # -- columns ----------------------------------------------------------------
    def lit(self, b: bytes) -> "Lines":
        if b:
            self._add(_LIT, None, bytes(b))
        return self

    def when(self, cond: np.ndarray, b: bytes) -> "Lines":
        """``b`` on the lines where ``cond`` holds."""
        if b and self.n:
            self._add(_LIT, _bools(cond, self.n), bytes(b))
        return self

    def strs(self, table: list[bytes], ids: np.ndarray, width: int = 0,
             right: bool = False) -> "Lines":
        """``table[ids[i]]``, padded with spaces to ``width`` (left- or
        right-aligned; longer strings are not cut)."""
        if not self.n:
            return self
        ids = np.ascontiguousarray(ids, np.int64)
        if not width and not any(table):
            return self                 # no column (the twin's: width 0)
        return self._add(_STRS, None, table, ids, int(width), bool(right))

    def int(self, v: np.ndarray, width: int = 0, commas: bool = False) -> "Lines":
        """Integers (negative ones with a ``-``), right-aligned in at
        least ``width`` characters; ``commas``: thousands separated."""
        if not self.n:
            return self
        v = np.asarray(v)
        if v.dtype.kind == "i":
            v, signed = np.ascontiguousarray(v, np.int64), True
        else:
            v, signed = np.ascontiguousarray(v.astype(np.uint64)), False
        return self._add(_INT, None, v, signed, int(width), bool(commas))

    def hex(self, v: np.ndarray, prefix: bytes = b"0x") -> "Lines":
        """Lower-case hexadecimal, no padding."""
        if not self.n:
            return self
        a = np.ascontiguousarray(np.asarray(v).astype(np.uint64))
        self.lit(prefix)
        return self._add(_HEX, None, a)

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
        return self._add(_FRAC, None, np.ascontiguousarray(fp.astype(np.uint64)),
                         int(bits))

    def varint(self, v: np.ndarray) -> "Lines":
        """Protobuf base-128 varints of non-negative integers."""
        if not self.n:
            return self
        return self._add(_VARINT, None,
                         np.ascontiguousarray(np.asarray(v).astype(np.uint64)))

    def zeros(self, v: np.ndarray, width: int) -> "Lines":
        """The low ``width`` decimal digits of non-negative integers,
        zero-padded (``7`` in 2: ``07``)."""
        if self.n and width > 0:
            self._add(_ZEROS, None,
                      np.ascontiguousarray(np.asarray(v).astype(np.uint64)), int(width))
        return self

    def only(self, cond: np.ndarray) -> "Lines":
        """The column just added shows only where ``cond`` holds."""
        if self.n and self._ops:
            # the column just added: an op that makes no column (the
            # twin's: strings or spaces all of width 0) is not one
            k = len(self._ops) - 1
            while k >= 0 and _empty_op(self._ops[k]):
                k -= 1
            if k < 0:
                return self
            op = self._ops[k]
            c = _bools(cond, self.n)
            # a new op: another Lines may share this one (extend)
            self._ops[k] = [op[0], c if op[1] is None else op[1] & c, *op[2:]]
        return self

    def spaces(self, count: np.ndarray) -> "Lines":
        """``count`` spaces per line (0 or more)."""
        if self.n:
            c = np.ascontiguousarray(np.maximum(np.asarray(count, np.int64), 0))
            if c.size:
                self._add(_SPACES, None, np.broadcast_to(c, (self.n,)).copy()
                          if c.shape != (self.n,) else c)
        return self

    def extend(self, other: "Lines") -> "Lines":
        self._ops.extend(other._ops)
        return self

    def lengths(self, impl: str | None = None) -> np.ndarray:
        """Bytes per line so far."""
        from hwtrace.export import _textcols_impl
        core = _textcols_impl.core_for(impl)
        if core is not None:
            if not self.n:
                return np.zeros(0, np.int64)
            return np.frombuffer(core.lengths(self.n, self._core_ops()), np.int64)
        out = np.zeros(self.n, np.int64)
        fixed = 0
        for m, _al, ln in self._columns():
            if ln is None:
                fixed += m.shape[-1]
            else:
                out += ln
        return out + fixed

    def _core_ops(self) -> list:
        return [tuple(op) for op in self._ops]

    # -- the twin's columns ------------------------------------------------------------
    def _columns(self) -> list:
        """(matrix, align, lengths) of every op that makes a column."""
        cols = []
        for op in self._ops:
            col = _TWIN[op[0]](self.n, *op[2:])
            if col is None:
                continue
            m, al, ln = col
            if op[1] is not None:
                full = ln if ln is not None else np.full(self.n, m.shape[-1], np.int64)
                ln = np.where(op[1], full, 0)
            cols.append((m, al, ln))
        return cols

    # -- output --------------------------------------------------------------------
    def text(self, impl: str | None = None) -> bytes:
        """The lines, for text (no NUL byte in any column): the twin
        copies each column into place with what is not there set to NUL,
        the NULs then squeezed out by ``bytes.replace`` (much faster than
        masked indexing).  The compiled core, where it loaded, formats
        each row's columns into place (and squeezes out NULs too, should
        any be there)."""
        n = self.n
        if not n or not self._ops:
            return b""
        from hwtrace.export import _textcols_impl
        core = _textcols_impl.core_for(impl)
        if core is not None:
            out = core.rows(n, self._core_ops())
            return out.replace(b"\0", b"") if b"\0" in out else out
        cols = self._columns()
        if not cols:
            return b""
        widths = [c[0].shape[-1] for c in cols]
        W = sum(widths)
        mat = np.empty((n, W), np.uint8)
        c = 0
        for (m, al, ln), w in zip(cols, widths):
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
        if not n or not self._ops:
            return b""
        from hwtrace.export import _textcols_impl
        core = _textcols_impl.core_for(impl)
        if core is not None:
            return core.rows(n, self._core_ops())
        cols = self._columns()
        if not cols:
            return b""
        widths = [c[0].shape[-1] for c in cols]
        W = sum(widths)
        mat = np.empty((n, W), np.uint8)
        mask = np.empty((n, W), bool)
        c = 0
        for (m, al, ln), w in zip(cols, widths):
            mat[:, c:c + w] = m
            if ln is None:
                mask[:, c:c + w] = True
            elif al == "L":
                np.less(np.arange(w), ln[:, None], out=mask[:, c:c + w])
            else:
                np.greater_equal(np.arange(w), (w - ln)[:, None], out=mask[:, c:c + w])
            c += w
        return mat[mask].tobytes()


def _bools(cond, n: int) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(np.asarray(cond, bool), (n,)))


def _empty_op(op) -> bool:
    """Does this op make no column in the twin (strings or spaces of
    width 0 on every line)?"""
    if op[0] == _STRS:
        table, ids, width = op[2], op[3], op[4]
        if width:
            return False
        return not any(len(table[i]) for i in unique(ids).tolist())
    if op[0] == _SPACES:
        return not int(op[2].max(initial=0))
    return False


# -- the twin: an op's column (matrix, align, lengths), or None (no column) ----------
_LIT, _STRS, _INT, _HEX, _FRAC, _VARINT, _SPACES, _ZEROS = range(8)


def _col_lit(n, b):
    return np.frombuffer(b, np.uint8), "L", None


def _col_strs(n, table, ids, width, right):
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
        return None
    tab = np.full((len(sub), w), _SPACE, np.uint8)
    for j, s in enumerate(sub):
        if s and len(s) <= w:
            if right:
                tab[j, w - len(s):] = np.frombuffer(s, np.uint8)
            else:
                tab[j, :len(s)] = np.frombuffer(s, np.uint8)
    return tab[inv], "R" if right else "L", np.maximum(rl, width)


def _col_int(n, v, signed, width, commas):
    neg = v < 0 if signed else np.zeros(n, bool)
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
    return mat, "R", np.maximum(ln, width)


def _col_hex(n, a):
    mat = np.empty((n, 16), np.uint8)
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    x = a.copy()
    for k in range(15, -1, -1):
        mat[:, k] = digits[(x & np.uint64(15)).astype(np.int64)]
        x >>= np.uint64(4)
    nd = np.ones(n, np.int64)
    for k in range(1, 16):
        nd += (a >> np.uint64(4 * k)) != 0
    return mat, "R", nd


def _col_frac(n, fp, bits):
    fd = _digits(fp, bits)
    # strip trailing zeros, keep one digit
    nz = fd != ord("0")
    last = np.where(nz.any(1), bits - 1 - np.argmax(nz[:, ::-1], 1), 0)
    return fd, "L", last + 1


def _col_varint(n, a):
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
    return mat, "L", ln


def _col_spaces(n, c):
    w = int(c.max(initial=0))
    if not w:
        return None
    return np.full(w, _SPACE, np.uint8), "L", c


def _col_zeros(n, a, width):
    return _digits(a, width), "L", None


_TWIN = {_LIT: _col_lit, _STRS: _col_strs, _INT: _col_int, _HEX: _col_hex,
         _FRAC: _col_frac, _VARINT: _col_varint, _SPACES: _col_spaces,
         _ZEROS: _col_zeros}
