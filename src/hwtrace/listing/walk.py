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
        self.switches = 0
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
            self.switches += 1
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

    def _ids(self, a: int, b: int):
        """(cache, ids, base): cache ids of the instructions of records
        [a, ...) up to the next address-space switch (``base``: the
        batch index of the first)."""
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
        self._span = (a, end, cache, ids, lo)
        return cache, ids, lo

    def _records(self, a: int, b: int) -> None:
        """Records [a, b): in chunks of about CHUNK instructions, plain
        stretches joined whole, decorated records one by one."""
        cache, ids, base = self._ids(a, b)
        lines_of = cache.columns[0]
        heads_of = cache.columns[-1]
        cum = self._cum
        deco = self._deco
        r = a
        while r < b:
            lo = int(cum[r])
            e = int(np.searchsorted(cum, lo + CHUNK, side="right")) - 1
            e = min(max(e, r + 1), b)
            hi = int(cum[e])
            sel = ids[lo - base:hi - base]
            lines = lines_of[sel].tolist()
            if deco is None:
                first = 0
            else:
                first = bisect.bisect_left(deco, r)
                if first == len(deco) or deco[first] >= e:
                    self._out(b"".join(lines))       # all plain
                    if self.block:
                        self.blocks += e - r
                    r = e
                    continue
            heads = lines if heads_of is lines_of else heads_of[sel].tolist()
            self._chunk(r, e, lo, lines, heads, first)
            r = e

    def _chunk(self, r: int, e: int, lo: int, lines, heads, i: int) -> None:
        """Records [r, e) whose instructions' texts are ``lines``/``heads``
        (from instruction ``lo``); ``i``: the index in the decorated list
        of the first at or after r (every record is, without a list)."""
        cum = self._cum
        deco = self._deco
        if deco is None and not self.fmt.per_record(self.block):
            self._groups(r, e, lo, lines, heads)
            return
        while r < e:
            if deco is None:
                nxt = r
            else:
                nxt = deco[i] if i < len(deco) and deco[i] < e else e
            if nxt > r:
                self._out(b"".join(lines[int(cum[r]) - lo:int(cum[nxt]) - lo]))
                if self.block:
                    self.blocks += nxt - r
                r = nxt
            if r < e:
                a, b = int(cum[r]) - lo, int(cum[r + 1]) - lo
                self._decorated(r, lines[a:b], heads[a:b])
                r += 1
                i += 1

    def _groups(self, r: int, e: int, lo: int, lines, heads) -> None:
        """Every record of [r, e) decorated (--offset, --merge-time):
        consecutive records alike in what decorates them (offset,
        speculative, time) go to record() as one, a truncated one last
        (its last instruction is the truncated one)."""
        recs = self._b.blocks[r:e]
        offs, fl = recs["offset"], recs["flags"]
        brk = (offs[1:] != offs[:-1]) | \
            (((fl[1:] ^ fl[:-1]) & SPECULATIVE) != 0) | \
            ((fl[:-1] & TRUNCATED) != 0)
        if self.timed:
            tsc = recs["tsc"]
            brk |= tsc[1:] != tsc[:-1]
        starts = [0] + (np.flatnonzero(brk) + 1).tolist()
        ends = starts[1:] + [e - r]
        cum = (self._cum[r:e + 1] - lo).tolist()
        offs, fl = offs.tolist(), fl.tolist()
        tscs = recs["tsc"].tolist() if self.timed else None
        record = self.fmt.record
        for g0, g1 in zip(starts, ends):
            if self.timed:
                self._tick(tscs[g0])
            flags = (fl[g0] & SPECULATIVE) | (fl[g1 - 1] & TRUNCATED)
            a, b = cum[g0], cum[g1]
            text = record(offs[g0], flags, lines[a:b], heads[a:b], None)
            if text:
                self._out(text)
        if self.block:
            self.blocks += e - r

    def _decorated(self, r: int, lines, heads) -> None:
        rec = self._b.blocks[r]
        if self.block:
            self.blocks += 1
        if self.timed:
            self._tick(int(rec["tsc"]))
        text = self.fmt.record(int(rec["offset"]), int(rec["flags"]),
                               lines, heads,
                               self.blocks if self.block else None)
        if text:
            self._out(text)
