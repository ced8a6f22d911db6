"""Batches to listing text: instructions from the line cache, joined in
bulk; events, errors and statuses at their places between records.

:class:`Walker` takes a format (:class:`~.text.TextFormat`,
:class:`~.jsonl.JsonFormat`) and a ``write(bytes)`` callable and turns a
stream's batches (:mod:`hwtrace.flow.batches`) into output:

* the instructions of consecutive plain records (no per-record
  decoration) are ``b"".join(lines[ids])`` over the line cache
  (:mod:`.cache`): no Python object is made per instruction;
* a decorated record (speculative, truncated, or every record with
  ``--offset`` / ``--block:show-blocks``) goes through the format's
  ``record()``: one call per record, still none per instruction;
* items are formatted one by one (they are rare) at their index;
* a :class:`~hwtrace.flow.batches.SpaceItem` switches the address space:
  from there on lines come from that space's cache (its code, its
  symbols).

Counts (instructions, blocks, events, errors) are kept for ``--stat``.
With ``timed`` every piece goes to ``write(bytes, time)`` with the time
it was decoded at (per record; events at their own time stamp), never
running back: what ``--merge-time`` sorts by.
"""

from __future__ import annotations

import bisect

import numpy as np

from hwtrace.flow.batches import SPECULATIVE, TRUNCATED

#: instructions joined per write (keeps the joined bytes in cache)
CHUNK = 8192


class Walker:
    """``cache_for(space) -> LineCache``: the line cache for an address
    space (None: a stream without a plan).  ``block``: the records
    are the block decoder's (they count as blocks)."""

    def __init__(self, fmt, write, cache_for, *, block: bool,
                 timed: bool = False):
        self.fmt = fmt
        self.write = write
        self.cache_for = cache_for
        self.block = block
        self.timed = timed
        self.insns = self.blocks = self.events = self.errors = 0
        self.time = 0
        self.space = None
        self.cache = None

    # -- output --------------------------------------------------------------
    def _out(self, data: bytes) -> None:
        if self.timed:
            self.write(data, self.time)
        else:
            self.write(data)

    def _tick(self, tsc: int) -> None:
        if tsc > self.time:
            self.time = tsc

    # -- batches --------------------------------------------------------------------
    def batch(self, b) -> None:
        recs = b.blocks
        n = len(recs)
        fmt = self.fmt
        if n:
            self.insns += int(recs["ninsn"].sum(dtype=np.int64))
        if not fmt.lines:
            # counts only (--quiet): records are not printed, items are
            for _i, offset, item in b.items:
                self._item(offset, item)
            if self.block:
                self.blocks += n
            return
        ninsn = recs["ninsn"]
        cum = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(ninsn, out=cum[1:])
        self._b = b
        self._cum = cum
        self._span = None
        deco = fmt.decorated(recs, self.block)
        if self.timed or deco is True:
            self._deco = None               # every record
        else:
            self._deco = np.flatnonzero(deco).tolist()
        r = 0
        for idx, offset, item in b.items:
            if idx > r:
                self._records(r, idx)
                r = idx
            self._item(offset, item)
        if n > r:
            self._records(r, n)
        self._b = self._cum = self._span = None

    def _item(self, offset: int, item) -> None:
        t = item.type
        if t == "space":
            self.space = item.space
            self.cache = None
            self._span = None
        elif t == "error":
            self.errors += 1
        elif t != "status":
            self.events += 1
            if self.timed and item.has_tsc:
                self._tick(item.tsc)
        text = self.fmt.item(offset, item)
        if text:
            self._out(text)

    def _lines(self, a: int, b: int):
        """(lines, heads, base): the cache's texts for the instructions of
        records [a, ...) up to the next address-space switch."""
        sp = self._span
        if sp is not None and sp[0] <= a and b <= sp[1]:
            return sp[2], sp[3], sp[4]
        batch, cum = self._b, self._cum
        end = len(batch.blocks)
        for idx, _off, item in batch.items:
            if idx >= b and item.type == "space":
                end = idx
                break
        if self.cache is None:
            self.cache = self.cache_for(self.space)
        recs = batch.blocks[a:end]
        lo, hi = int(cum[a]), int(cum[end])
        ins = batch.insns[lo:hi]
        modes = recs["mode"]
        if len(modes) and (modes == modes[0]).all():
            m = int(modes[0])
        else:
            m = np.repeat(modes, recs["ninsn"])
        cache = self.cache
        ids = cache.ids(ins["ip"], ins["size"], ins["iclass"], m)
        lines = cache.columns[0][ids].tolist()
        heads = cache.columns[-1][ids].tolist() if cache.ncols > 1 else lines
        self._span = (a, end, lines, heads, lo)
        return lines, heads, lo

    def _records(self, a: int, b: int) -> None:
        lines, heads, base = self._lines(a, b)
        cum = self._cum
        deco = self._deco
        if deco is not None:
            # plain stretches joined whole, decorated records one by one
            i = bisect.bisect_left(deco, a)
            r = a
            while r < b:
                nxt = deco[i] if i < len(deco) and deco[i] < b else b
                if nxt > r:
                    self._plain(lines, int(cum[r]) - base,
                                int(cum[nxt]) - base)
                    if self.block:
                        self.blocks += nxt - r
                    r = nxt
                if r < b:
                    self._decorated(r, lines, heads, base)
                    r += 1
                    i += 1
            return
        for r in range(a, b):
            self._decorated(r, lines, heads, base)

    def _plain(self, lines, lo: int, hi: int) -> None:
        for s in range(lo, hi, CHUNK):
            self._out(b"".join(lines[s:min(hi, s + CHUNK)]))

    def _decorated(self, r: int, lines, heads, base: int) -> None:
        rec = self._b.blocks[r]
        cum = self._cum
        lo, hi = int(cum[r]) - base, int(cum[r + 1]) - base
        if self.block:
            self.blocks += 1
        if self.timed:
            self._tick(int(rec["tsc"]))
        text = self.fmt.record(int(rec["offset"]), int(rec["flags"]),
                               lines[lo:hi], heads[lo:hi],
                               self.blocks if self.block else None)
        if text:
            self._out(text)


def flags_of(recs) -> np.ndarray:
    return recs["flags"] & (SPECULATIVE | TRUNCATED)
