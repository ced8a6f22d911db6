"""Basic-block coverage from the instruction flow (no I/O).

A block is a run of consecutive instructions that starts where control
arrived (a branch target, the first instruction after a gap) and ends with
a control-flow instruction (any ``iclass`` but ``other``/``ptwrite``) or
where the next instruction is not the fall-through.  Blocks are counted by
(start, size): memory grows with the code executed, not with the trace
length.

Batches (:meth:`CoverageCollector.add_batch`, records ending at every
branch) are merged into blocks with numpy: a record goes on the block
before it when that one ended with a plain instruction right before it
and no event that cuts a block (a decode error, tracing disabled or
enabled -- not a PSB+ restating the state) lies between them.  Flow items
one at a time (:meth:`CoverageCollector.feed`) follow the same rule.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.flowitems import INSN, ObjectItem, enum_name, kind_of

_PLAIN = frozenset({"other", "ptwrite", "unknown", None})
_CUTS = frozenset({"overflow", "disabled", "async_disabled", "enabled",
                   "async_branch", "tsx", "resynced", "resync_stalled"})
#: IClass values of plain instructions (unknown, other, ptwrite)
_PLAIN_IC = np.zeros(256, bool)
_PLAIN_IC[[0, 1, 9]] = True

_KEY = np.dtype([("start", "<u8"), ("size", "<u8")])


class CoverageCollector:
    def __init__(self):
        self._blocks: dict[tuple[int, int], int] = {}
        self.insns = 0
        self._start: int | None = None
        self._next = 0
        self._keys: list[np.ndarray] = []      # pending (start, size) per block
        self._pending = 0
        self._table = np.zeros(0, _KEY)
        self._counts = np.zeros(0, np.int64)

    # -- flow items one at a time ----------------------------------------------------
    def _close(self) -> None:
        s = self._start
        if s is not None:
            key = (s, self._next - s)
            self._blocks[key] = self._blocks.get(key, 0) + 1
            self._start = None

    def insn(self, ip: int, size: int, iclass) -> None:
        if self._start is not None and ip != self._next:
            self._close()
        if self._start is None:
            self._start = ip
        self._next = ip + size
        self.insns += 1
        if type(iclass) is not str:
            iclass = enum_name(iclass)
        if iclass not in _PLAIN:
            self._close()

    def feed(self, item) -> None:
        m = item if isinstance(item, dict) else ObjectItem(item)
        k = kind_of(m)
        if k == INSN:
            self.insn(m.get("ip"), m.get("size") or 0, m.get("iclass"))
        elif m.get("status_update") and m.get("error") is None:
            return          # a PSB+ restating the state: the block goes on
        else:
            name = m.get("event") or m.get("error") or m.get("status")
            if m.get("error") is not None or name in _CUTS:
                self.gap()

    def gap(self) -> None:
        self._close()

    # -- streams fed side by side (hwtrace.export.interleave) ------------------------------
    def twin(self) -> "CoverageCollector":
        """An empty collector of the same kind, for one stream of several
        fed a piece of one, then of another: each its own, then
        :meth:`absorb` ed -- as if the streams had come one after another."""
        return CoverageCollector()

    def absorb(self, other: "CoverageCollector") -> None:
        """Add what ``other`` (a :meth:`twin`, its stream ended) counted."""
        for k, c in other.finish().items():
            self._blocks[k] = self._blocks.get(k, 0) + c
        self.insns += other.insns

    # -- batches -------------------------------------------------------------------------
    def add_batch(self, batch) -> None:
        blocks = batch.blocks
        m = len(blocks)
        cuts = np.zeros(m + 1, bool)
        for index, _off, item in batch.items:
            if _cuts(item):
                cuts[index] = True
        if not m:
            if cuts[0]:
                self._close()
            return
        ip = blocks["ip"]
        fall = blocks["end_ip"] + blocks["size"].astype(np.uint64)
        plain = _PLAIN_IC[blocks["iclass"]]
        self.insns += int(blocks["ninsn"].sum())
        go_on = np.zeros(m, bool)                  # record r continues r - 1
        go_on[1:] = plain[:-1] & (ip[1:] == fall[:-1]) & ~cuts[1:m]
        first_on = self._start is not None and not cuts[0] and \
            int(ip[0]) == self._next
        if self._start is not None and not first_on:
            self._close()
        starts = np.flatnonzero(~go_on)            # starts[0] == 0
        bstart = ip[starts].copy()
        if first_on:
            bstart[0] = self._start                # the block carried over
        ends = np.append(starts[1:], m) - 1
        bend = fall[ends]
        keep = np.ones(len(starts), bool)
        if bool(plain[m - 1]) and not cuts[m]:
            # the last block may go on into the next batch: hold it
            keep[-1] = False
            self._start = int(bstart[-1])
            self._next = int(bend[-1])
        else:
            self._start = None
        if keep.any():
            k = np.zeros(int(keep.sum()), _KEY)
            k["start"] = bstart[keep]
            k["size"] = bend[keep] - bstart[keep]
            self._keys.append(k)
            self._pending += len(k)
            if self._pending > 1 << 20:
                self._merge()

    def _merge(self) -> None:
        if not self._keys:
            return
        allk = np.concatenate([self._table] + self._keys)
        w = np.concatenate([self._counts, np.ones(self._pending, np.int64)])
        u, inv = np.unique(allk, return_inverse=True)
        self._counts = np.bincount(np.asarray(inv).reshape(-1), w, len(u)).astype(np.int64)
        self._table = u
        self._keys = []
        self._pending = 0

    def finish(self) -> dict[tuple[int, int], int]:
        self._close()
        self._merge()
        out = dict(self._blocks)
        for (s, z), c in zip(self._table.tolist(), self._counts.tolist()):
            out[(s, z)] = out.get((s, z), 0) + c
        return out

    @property
    def blocks(self) -> dict[tuple[int, int], int]:
        return self.finish()


def _cuts(item) -> bool:
    t = getattr(item, "type", None)
    if t == "error":
        return True
    if t == "status":
        return item.name in ("resynced", "resync_stalled")
    if getattr(item, "status_update", False):
        return False
    return t in _CUTS


class _Part:
    """Records [r0, r1) of a batch, with the items among them (indices
    from r0), as :meth:`CoverageCollector.add_batch` takes a batch."""

    __slots__ = ("blocks", "items")

    def __init__(self, batch, r0: int, r1: int):
        self.blocks = batch.blocks[r0:r1]
        self.items = [(i - r0, o, it) for i, o, it in batch.items if r0 <= i <= r1]


class SpacedCoverage:
    """Blocks per set of mapped files, for a bundle whose processes run
    different programs at the same addresses: a :class:`CoverageCollector`
    per ``lookup_of(space)`` (the lookup of a space's files,
    :meth:`hwtrace.streams.TraceSet.space_lookup`), fed the records that
    ran there -- the batches' space items say where a stream switched
    (a switch ends the block open in the space left)."""

    def __init__(self, lookup_of):
        self._lookup_of = lookup_of
        self._parts: dict[int, tuple] = {}      # id(lookup) -> (lookup, collector)
        self._cur: CoverageCollector | None = None

    def _use(self, space) -> None:
        lookup = self._lookup_of(space)
        got = self._parts.get(id(lookup))
        if got is None:
            got = self._parts[id(lookup)] = (lookup, CoverageCollector())
        if self._cur is not None and self._cur is not got[1]:
            self._cur.gap()
        self._cur = got[1]

    def _current(self) -> CoverageCollector:
        if self._cur is None:           # no space said yet
            self._parts[0] = (None, CoverageCollector())
            self._cur = self._parts[0][1]
        return self._cur

    @property
    def insns(self) -> int:
        return sum(c.insns for _l, c in self._parts.values())

    def add_batch(self, batch) -> None:
        switches = [(i, it.space) for i, _o, it in batch.items
                    if getattr(it, "type", None) == "space"]
        if not switches:
            self._current().add_batch(batch)
            return
        r = 0
        for i, space in switches:
            if i > r:
                self._current().add_batch(_Part(batch, r, i))
                r = i
            self._use(space)
        self._current().add_batch(_Part(batch, r, len(batch.blocks)))

    def gap(self) -> None:
        if self._cur is not None:
            self._cur.gap()

    def twin(self) -> "SpacedCoverage":
        return SpacedCoverage(self._lookup_of)

    def absorb(self, other: "SpacedCoverage") -> None:
        """:meth:`CoverageCollector.absorb`, per set of files."""
        for key, (lookup, c) in other._parts.items():
            mine = self._parts.get(key)
            if mine is None:
                mine = self._parts[key] = (lookup, CoverageCollector())
            mine[1].absorb(c)

    def finish(self) -> list[tuple]:
        """(the lookup of the files, or None: no space said, {(start,
        size): count}) per set of files."""
        return [(lookup, c.finish()) for lookup, c in self._parts.values()]
