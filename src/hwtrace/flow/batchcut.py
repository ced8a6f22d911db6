"""Batches cut where tracing is enabled (no I/O).

A CPU's stream switches threads only where tracing is enabled again (a
context switch is a disable, then an enable where the next thread goes
on).  :func:`enables` finds those enables in a :class:`~.batches.Batch`
with the times they carry, and :func:`piece` takes the part of a batch
between two cuts -- numpy slices of the records and the items
re-indexed, so the pieces fed one after the other are the batch -- so
the pieces of several CPUs' streams can be taken in time order
(:mod:`hwtrace.export.interleave`).  :func:`cut_at_enables` cuts a batch
at every one.
"""

from __future__ import annotations

from .batches import Batch


#: events that change what a call-stack builder knows (the others only
#: tell the time; :func:`hwtrace.analysis.batchfeed.structural`)
_STRUCTURAL = frozenset({"enabled", "disabled", "async_disabled", "overflow",
                         "stop", "async_branch", "tsx"})


def _telling(it) -> bool:
    """Whether an item only tells the time (or the address space the
    records after it run in): a piece may begin at it."""
    t = getattr(it, "type", None)
    if t == "space":
        return True
    if not hasattr(it, "status_update"):
        return False
    return t not in _STRUCTURAL or (it.status_update and t in ("enabled", "disabled"))


def enables(batch: Batch) -> list[tuple[int, int | None]]:
    """(where a piece may begin, TSC or None) for every enable that is
    not a PSB+'s restatement of the tracing state: the position in
    ``batch.items`` of the first item at the enable's record that, like
    every one up to the enable, only tells the time -- a CPU idle until
    then has its clock jump there, before the enable, and that time is
    the next thread's, not the last one's.  None in a batch that
    carries every instruction (``insns``: not cut)."""
    if batch.insns is not None:
        return []
    items = batch.items
    out = []
    for j, (i, _o, it) in enumerate(items):
        if getattr(it, "type", None) != "enabled" or \
                getattr(it, "status_update", False):
            continue
        c = j
        while c > 0 and items[c - 1][0] == i and _telling(items[c - 1][2]) \
                and (not out or c - 1 > out[-1][0]):
            c -= 1
        out.append((c, int(it.tsc) if getattr(it, "has_tsc", False) else None))
    return out


def start_time(batch: Batch, r: int) -> int | None:
    """The TSC of record ``r`` of ``batch``, or None (none there)."""
    if r < len(batch.blocks):
        t = int(batch.blocks["tsc"][r])
        if t:
            return t
    return None


def piece(batch: Batch, first: int, r0: int, j0: int, r1: int, j1: int) -> Batch:
    """The part of ``batch`` from record r0 and item position j0 to record
    r1 and item j1 (the items between: their index re-based; ``first``:
    the stream's instructions before it).  The batch itself when that is
    all of it."""
    items = batch.items
    if r0 == 0 and j0 == 0 and j1 == len(items) and r1 == len(batch.blocks):
        return batch
    its = items[j0:j1]
    if r0:
        its = [(i - r0, o, it) for i, o, it in its]
    return Batch(batch.blocks[r0:r1], None, its, first)


def cut_at_enables(batch: Batch) -> list[Batch]:
    """``batch`` cut before every enable (:func:`enables`)."""
    items, blocks = batch.items, batch.blocks
    out, r0, j0, first = [], 0, 0, batch.first_insn
    for j1 in [j for j, _t in enables(batch)] + [len(items)]:
        r1 = items[j1][0] if j1 < len(items) else len(blocks)
        if (r1, j1) == (r0, j0):
            continue
        out.append(piece(batch, first, r0, j0, r1, j1))
        first += int(blocks["ninsn"][r0:r1].sum(dtype="u8"))
        r0, j0 = r1, j1
    return out
