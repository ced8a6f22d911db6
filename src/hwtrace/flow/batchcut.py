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


def enables(batch: Batch) -> list[tuple[int, int | None]]:
    """(position in ``batch.items``, TSC or None) of every enable that is
    not a PSB+'s restatement of the tracing state; none in a batch that
    carries every instruction (``insns``: not cut)."""
    if batch.insns is not None:
        return []
    return [(j, int(it.tsc) if getattr(it, "has_tsc", False) else None)
            for j, (_i, _o, it) in enumerate(batch.items)
            if getattr(it, "type", None) == "enabled"
            and not getattr(it, "status_update", False)]


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
