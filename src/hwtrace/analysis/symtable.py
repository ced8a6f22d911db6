"""Naming many addresses at once: the call-stack builder's symbol lookups
over numpy arrays.

:class:`AddrTable` answers, for an array of addresses, the function each
lies in -- ``(start, name id, known)`` arrays -- as
``lookup(addr) -> (start, name) | None`` would one by one; unknown code
is its own function, named ``FILE+0xLINK`` inside an image
(:func:`unnamed`: perf's name for a stripped
library's local function) or by its address (``0x401000``) outside every
image -- once per distinct address.

* Over a :class:`~hwtrace.analysis.symbols.Symbolizer` the images'
  symbol tables are merged once into one step function over the address
  space (the first image that covers an address claims it, as
  ``Symbolizer.lookup`` decides): a lookup is one ``searchsorted``.
* Over any other callback (a test's synthetic program) the distinct
  addresses are looked up one by one and cached.
"""

from __future__ import annotations

import numpy as np

from hwtrace._unique import unique
from hwtrace.analysis.slices import NameTable



_U8 = np.uint64


def unnamed(label: str, link: int) -> str:
    """The name of code at link-time address ``link`` (run-time address -
    load bias: what ``nm``, ``objdump -d`` and ``addr2line -e FILE`` take;
    for a shared library, linked at 0, its offset from the load base) of
    the file ``label`` (the mapped file's basename), where no symbol
    covers it: ``liblzma.so.5+0x1a2b``, as perf names it."""
    return f"{label}+0x{link:x}"


class AddrTable:
    def __init__(self, lookup, names: NameTable):
        self.names = names
        self.lookup = lookup
        self._cache: dict[int, tuple[int, int, bool]] = {}
        self._lo = self._hi = self._start = self._nid = None
        self._fstarts = None
        self._bits = None
        self._unk_keys = self._unk_ids = None   # _unknown_ids' cache
        self._named = None                      # fresh()'s cache
        self._table = None                      # table()'s arrays
        # the images' address ranges, the first image claiming an address
        # (as Symbolizer.image_for): (lo, hi) arrays, bias and label per range
        self._ilo = self._ihi = None
        self._ibias: list[int] = []
        self._ilabel: list[str] = []
        images = getattr(lookup, "images", None)
        if images is None:
            images = getattr(getattr(lookup, "__self__", None), "images", None)
        if lookup is not None and images is not None:
            self._merge(images)

    # -- the merged table --------------------------------------------------------
    def _merge(self, images) -> None:
        claimed: list[tuple[int, int]] = []
        los, his, starts, nids = [], [], [], []
        ilo, ihi = [], []
        for img in images:
            free = _subtract((img.low, img.high), claimed)
            claimed.append((img.low, img.high))
            for a, b in free:
                ilo.append(a)
                ihi.append(b)
                self._ibias.append(img.bias)
                self._ilabel.append(getattr(img, "label", None) or "?")
            if not free or not img._starts:
                continue
            bias = img.bias
            s = np.array([a + bias for a in img._starts], _U8)
            e = np.array([a + bias for a in img._ends], _U8)
            hi = np.minimum(e, np.append(s[1:], _U8(0xFFFFFFFFFFFFFFFF)))
            ids = self.names.ids(img._names)
            for a, b in free:
                keep = (s < _U8(b)) & (hi > _U8(a))
                if not keep.any():
                    continue
                los.append(np.maximum(s[keep], _U8(a)))
                his.append(np.minimum(hi[keep], _U8(b)))
                starts.append(s[keep])
                nids.append(ids[keep])
        order = np.argsort(np.array(ilo, _U8), kind="stable")
        self._ilo = np.array(ilo, _U8)[order]
        self._ihi = np.array(ihi, _U8)[order]
        self._ibias = [self._ibias[k] for k in order.tolist()]
        self._ilabel = [self._ilabel[k] for k in order.tolist()]
        if not los:
            self._lo = np.zeros(0, _U8)
            self._hi = self._start = self._lo
            self._nid = np.zeros(0, np.int32)
            self._fstarts = np.zeros(0, _U8)
            return
        lo = np.concatenate(los)
        order = np.argsort(lo, kind="stable")
        # a first segment that names nothing: every lookup lands somewhere
        self._lo = np.concatenate(([_U8(0)], lo[order]))
        self._hi = np.concatenate(([_U8(0)], np.concatenate(his)[order]))
        self._start = np.concatenate(([_U8(0)], np.concatenate(starts)[order]))
        self._nid = np.concatenate(([-1], np.concatenate(nids)[order])).astype(np.int32)
        whole = (self._lo == self._start) & (self._hi > self._lo)
        cold = self.names.cold()
        whole &= ~cold[np.maximum(self._nid, 0)]
        self._fstarts = unique(self._start[whole])

    # -- queries ---------------------------------------------------------------------
    def resolve(self, addrs: np.ndarray):
        """``(start u8, name id i4, known bool)`` for every address."""
        addrs = np.asarray(addrs, _U8)
        if self._lo is not None:
            if not len(self._lo):
                ok = np.zeros(len(addrs), bool)
                start = addrs.copy()
                nid = np.full(len(addrs), -1, np.int32)
            else:
                j = np.searchsorted(self._lo, addrs, side="right") - 1
                ok = addrs < self._hi[j]
                start = np.where(ok, self._start[j], addrs)
                nid = self._nid[j]
            if not ok.all():
                bad = np.flatnonzero(~ok)
                nid[bad] = self._unknown_ids(addrs[bad])
            return start, nid, ok
        if not len(addrs):
            return addrs.copy(), np.zeros(0, np.int32), np.zeros(0, bool)
        u, inv = np.unique(addrs, return_inverse=True)
        rows = [self.one(a) for a in u.tolist()]
        start = np.array([r[0] for r in rows], _U8)[inv]
        nid = np.array([r[1] for r in rows], np.int32)[inv]
        known = np.array([r[2] for r in rows], bool)[inv]
        return start, nid, known

    def table(self):
        """The merged table as ``(lo, hi, start, fstarts, nid, bits)``
        arrays (what :meth:`resolve`, :meth:`same_function` and
        :meth:`starts` search -- ``bits`` :meth:`starts`' bitmap of hashed
        starts, packed 8 to a byte; a compiled core asks them itself),
        or None over a callback."""
        if self._lo is None:
            return None
        if self._table is None:
            self._table = (np.ascontiguousarray(self._lo, _U8),
                           np.ascontiguousarray(self._hi, _U8),
                           np.ascontiguousarray(self._start, _U8),
                           np.ascontiguousarray(self._fstarts, _U8),
                           np.ascontiguousarray(self._nid, np.int32),
                           None if self._fstarts is None else
                           np.packbits(self._start_bits(), bitorder="little"))
        return self._table

    def _start_bits(self):
        """bool per hash (:func:`_hash`) of a function start: whether some
        start hashes there (None without a merged table)."""
        fs = self._fstarts
        if fs is None:
            return None
        if self._bits is None:
            self._bits = np.zeros(1 << _HBITS, bool)
            self._bits[_hash(fs)] = True
        return self._bits

    def register_unknown(self, addrs: np.ndarray) -> np.ndarray:
        """Name the addresses no symbol names, as :meth:`resolve` of them
        would (new names are registered in address order): their ids."""
        if not len(addrs):
            return np.zeros(0, np.int32)
        return self._unknown_ids(np.asarray(addrs, _U8))

    def fresh(self, addrs: np.ndarray) -> np.ndarray:
        """bool per address: looking it up might register a name (no
        symbol names it and it was not named before; over a callback,
        not looked up before -- or forgotten since).  Registers nothing."""
        addrs = np.asarray(addrs, _U8)
        if self._lo is None:
            c = self._cache
            return np.fromiter((a not in c for a in addrs.tolist()), bool, len(addrs))
        # over the merged table a name is for good (the table stays, names
        # are only added): addresses found named before are remembered in
        # a direct-mapped cache -- a call's target is asked again and again
        # (~15 M addresses on ``find``, a search each)
        named = self._named
        if named is None:
            named = self._named = np.full(1 << _NBITS, _NONE, _U8)
        h = _slot(addrs)
        miss = np.flatnonzero((named[h] != addrs) | (addrs == _NONE))
        if len(miss) < len(addrs):
            out = np.zeros(len(addrs), bool)
            if len(miss):
                out[miss] = f = self._fresh(addrs[miss])
                k = miss[~f]
                named[h[k]] = addrs[k]
            return out
        out = self._fresh(addrs)
        named[h[~out]] = addrs[~out]
        return out

    def _fresh(self, addrs: np.ndarray) -> np.ndarray:
        """:meth:`fresh` over the merged table, searched."""
        if len(self._lo):
            j = np.searchsorted(self._lo, addrs, side="right") - 1
            out = addrs >= self._hi[j]
        else:
            out = np.ones(len(addrs), bool)
        keys = self._unk_keys
        if keys is not None and len(keys) and out.any():
            pos = np.minimum(np.searchsorted(keys, addrs), len(keys) - 1)
            out &= keys[pos] != addrs
        return out

    def image_index(self, addrs: np.ndarray) -> np.ndarray:
        """Per address, the index of the image range holding it (-1 in
        none, and always -1 over a callback)."""
        addrs = np.asarray(addrs, _U8)
        if self._ilo is None or not len(self._ilo):
            return np.full(len(addrs), -1, np.intp)
        j = np.searchsorted(self._ilo, addrs, side="right") - 1
        ok = (j >= 0) & (addrs < self._ihi[np.maximum(j, 0)])
        return np.where(ok, j, -1)

    def in_image(self, addrs: np.ndarray) -> np.ndarray:
        """bool per address: inside some image (named even where no
        symbol covers it, :meth:`_unknown_ids`)."""
        return self.image_index(addrs) >= 0

    def _unknown_name(self, addr: int, k: int) -> str:
        """The name of unknown code at ``addr`` in image range ``k``."""
        if k < 0:
            return f"0x{addr:x}"
        return unnamed(self._ilabel[k], addr - self._ibias[k])

    def _unknown_ids(self, addrs: np.ndarray) -> np.ndarray:
        """The name ids of addresses no symbol names (``libz.so.1+0x2a0``
        in an image, ``0x401000`` outside every one): those seen before
        from sorted arrays at once, new ones registered in address order
        (as ever: the name ids are the same)."""
        keys = self._unk_keys
        if keys is None:
            keys = self._unk_keys = np.zeros(0, _U8)
            self._unk_ids = np.zeros(0, np.int32)
        addrs = np.asarray(addrs, _U8)
        if len(keys):
            pos = np.searchsorted(keys, addrs)
            hit = keys[np.minimum(pos, len(keys) - 1)] == addrs
            if hit.all():
                return self._unk_ids[pos]
            new = unique(addrs[~hit])
        else:
            new = unique(addrs)
        if not len(new):
            return np.zeros(0, np.int32)
        name = self._unknown_name
        ids = np.fromiter((self.names.id(name(a, k)) for a, k in
                           zip(new.tolist(), self.image_index(new).tolist())),
                          np.int32, len(new))
        keys = np.concatenate((keys, new))
        order = np.argsort(keys, kind="stable")
        self._unk_keys = keys[order]
        self._unk_ids = np.concatenate((self._unk_ids, ids))[order]
        return self._unk_ids[np.searchsorted(self._unk_keys, addrs)]

    def one(self, addr: int) -> tuple[int, int, bool]:
        """``(start, name id, known)`` of one address (cached)."""
        c = self._cache.get(addr)
        if c is not None:
            return c
        if self._lo is not None:
            s, n, k = self.resolve(np.array([addr], _U8))
            c = (int(s[0]), int(n[0]), bool(k[0]))
        else:
            r = self.lookup(addr) if self.lookup is not None else None
            if r:
                c = (r[0], self.names.id(r[1]), True)
            else:
                c = (addr, self.names.id(f"0x{addr:x}"), False)
        if len(self._cache) > 1 << 20:
            self._cache.clear()
        self._cache[addr] = c
        return c

    def same_function(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """bool per pair: both addresses inside one known function."""
        if self._lo is not None:
            if not len(self._lo):
                return np.zeros(len(a), bool)
            ja = np.searchsorted(self._lo, a, side="right") - 1
            jb = np.searchsorted(self._lo, b, side="right") - 1
            same = (ja == jb) & (a < self._hi[ja]) & (b < self._hi[jb])
            # two segments of one function (cut where images overlap)
            diff = np.flatnonzero(~same & (a < self._hi[ja]) & (b < self._hi[jb]))
            if len(diff):
                same[diff] = self._start[ja[diff]] == self._start[jb[diff]]
            return same
        sa, _na, ka = self.resolve(a)
        sb, _nb, kb = self.resolve(b)
        return ka & kb & (sa == sb)

    def starts(self, addrs: np.ndarray) -> np.ndarray:
        """bool per address: a known function starts exactly there, and
        it is not a ``.cold`` part (a jump there may be a tail call)."""
        fs = self._fstarts
        if fs is not None:
            if not len(fs):
                return np.zeros(len(addrs), bool)
            # a bitmap of hashed starts first: most addresses are no start
            out = self._start_bits()[_hash(addrs)]
            maybe = np.flatnonzero(out)
            if len(maybe):
                a = addrs[maybe]
                j = np.minimum(np.searchsorted(fs, a), len(fs) - 1)
                out[maybe] = fs[j] == a
            return out
        start, nid, known = self.resolve(addrs)
        cold = self.names.cold()
        return known & (start == addrs) & ~cold[nid]


_HBITS = 22
_NBITS = 16
_NONE = _U8(0xFFFFFFFFFFFFFFFF)     # an empty slot of fresh()'s cache


def _slot(a: np.ndarray) -> np.ndarray:
    """fresh()'s cache slot of each address (a multiplicative hash)."""
    return ((a * _U8(0x9E3779B97F4A7C15)) >> _U8(64 - _NBITS)).astype(np.intp)


def _hash(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, _U8)
    return ((a ^ (a >> _U8(_HBITS))) & _U8((1 << _HBITS) - 1)).astype(np.intp)


def _subtract(iv: tuple[int, int], taken: list) -> list:
    """``iv`` minus the intervals ``taken`` (a short list)."""
    out = [iv]
    for a, b in taken:
        nxt = []
        for lo, hi in out:
            if b <= lo or a >= hi:
                nxt.append((lo, hi))
                continue
            if lo < a:
                nxt.append((lo, a))
            if b < hi:
                nxt.append((b, hi))
        out = nxt
    return [(lo, hi) for lo, hi in out if lo < hi]
