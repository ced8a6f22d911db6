"""The compiled core's segment jobs: counts and batches on all cores.

The plan is :mod:`.parallel`'s, with the compiled flow core doing each
job (:mod:`hwtrace.jobs` runs them: files, process pool)::

    from hwtrace import jobs
    c = jobs.count(path, 0, None, [("raw", spec)], config, block=True,
                   jobs=2)                          # fast.Counts or None
    for b in jobs.batches(path, 0, None, images, config, jobs=2): ...

1. The trace is cut at PSBs into about ``segments`` (default: ``jobs``)
   pieces of similar size (:func:`cut_points`: the first PSB at or after
   each cut, as :func:`parallel.segment_starts` picks them).
2. Job 0 decodes from the trace start exactly as the sequential compiled
   decode does; job *k* synchronizes at the PSB that starts segment *k*
   with a fresh decoder (empty return stack, time reset).  The core records
   checkpoints (core/segment.h: the PSB, the whole live decode state but
   the return stack, the return stack, the output position) at the first
   :data:`HEAD` PSBs of a job and at the PSBs of its tail, and stops after
   :data:`TAIL` of those.
3. :func:`parallel.stitch` merges job *k* and *k+1* at the first checkpoint
   where their states are equal and *k+1*'s return stack is a suffix of
   *k*'s, and re-runs a job over the next segment where it cannot prove
   that.  A job *k > 0* that reports "compressed return without call"
   (it popped past the bottom of its stack) notes it as an underflow: the
   stitch takes none of its output past that point unless its start was
   proven exact.
4. The counts are the sum of the pieces' count differences and the errors
   the pieces' errors; batches are the pieces' records and items, in
   order.

Result: exactly the sequential decode's counts and errors, or records and
items (``flatten()``-equal to the sequential batches).

Timing: the calibration state (the last MTC interval's frequency ratio)
is the same in a fresh job two MTCs after its PSB, so timing traces merge
at the second checkpoint instead of the first.

No I/O here: the jobs get their trace as a buffer and their image built.
"""

from __future__ import annotations

from typing import NamedTuple

from . import fast
from . import parallel as P
from .checkpoint import Checkpoint

TAIL = 3            # PSBs a job decodes on past the end of its segment
HEAD = 3            # checkpoints a job k > 0 records from its start
MIN_SEGMENT = 256 << 10


def cut_points(buf, offset: int, size: int, segments: int,
               min_segment: int = MIN_SEGMENT) -> list[int]:
    """Up to ``segments - 1`` PSB offsets (relative to ``offset``) cutting
    ``buf[offset:offset+size]`` into pieces of similar size: the first PSB
    at or after each ``size * k / segments`` (only those are searched for,
    not every PSB of the trace), as :func:`parallel.segment_starts` picks
    them."""
    from hwtrace.pt.decoder import find_psb_forward

    if segments < 2 or size <= 0:
        return []
    psbs = []
    for k in range(segments):
        at = find_psb_forward(buf, offset + size * k // segments)
        if at < 0 or at + 16 > offset + size:
            break
        if not psbs or at - offset > psbs[-1]:
            psbs.append(at - offset)
    return P.segment_starts(psbs, size, segments, min_segment)


_CYC_EN, _MTC_EN = 1 << 1, 1 << 9


def jobs_can_meet(ctl: int | None) -> bool:
    """Whether segment jobs of a trace recorded with IA32_RTIT_CTL ``ctl``
    can meet (None: not known, so no).  With MTC and without CYC they
    can't: the timing calibration keeps the CTC of the decode's first MTC
    for good (it takes a new one only where cycles were counted since the
    last, as libipt's pt_tcal_update_mtc), so a job that starts at a later
    PSB holds another CTC at every checkpoint, and the stitch re-runs
    the whole trace from its start: more work than one sequential decode.
    (The field is dead in such a trace, but the state key can't know that
    no CYC will come.)"""
    return ctl is not None and (not ctl & _MTC_EN or bool(ctl & _CYC_EN))


def _window(start, end):
    return (-1 if start is None else start, -1 if end is None else end,
            TAIL, 0 if start is None else HEAD)


def _checkpoints(cps) -> list:
    return [Checkpoint(pos, key, stack, 0, out) for pos, key, stack, out in cps]


def count_segment(data, image, config, block: bool, start, end,
                  resync: bool = False, plain_offsets: bool = False
                  ) -> P.Result:
    """One counts job over ``data`` (the whole trace): a
    :class:`parallel.Result` whose counts are (insns, blocks, events,
    errors) and whose ``output`` is the job's errors as sinks get them.
    ``plain_offsets``: report offsets as a decode switched by an
    address-space plan does (a bundle stream's)."""
    dec = fast.core_decoder(data, image, config, block=block, resync=resync,
                            plain_offsets=plain_offsets)
    insns, blocks, events, errors, cps, underflows, stopped = \
        dec.segment(*_window(start, end))
    return P.Result(start, end, _checkpoints(cps), underflows,
                    (insns, blocks, events, len(errors)), 0, bool(stopped),
                    errors)


def counts_of(pieces, block: bool) -> fast.Counts:
    """The counts and errors of stitched counts pieces."""
    totals = [0, 0, 0, 0]
    errors = []
    for piece in pieces:
        _, _, ca, cb = P.piece_range(piece)
        for n in range(4):
            totals[n] += cb[n] - ca[n]
        errors.extend(piece.result.output[ca[3]:cb[3]])
    return fast.Counts(totals[0], totals[1] if block else 0, totals[3], True,
                       totals[2], tuple(errors))


class BatchOutput(NamedTuple):
    """What a batches job hands back: its records, instructions (or None)
    and items -- the bytes themselves, or where a spool file holds them."""

    blocks: object          # bytes, or (path, offset, size) in a spool file
    insns: object
    items: list             # (record index in the job, offset, item)


def batch_segment(data, image, config, decoder: str, start, end,
                  resync: bool = False, want_insns: bool = False,
                  plain_offsets: bool = False):
    """One batches job over ``data``: (Result with checkpoints at
    (records, items, instructions, 0), blocks bytes, insns bytes or None,
    items); ``plain_offsets`` as for :func:`count_segment`."""
    dec = fast.core_decoder(data, image, config, block=decoder == "block",
                            resync=resync, want_insns=want_insns,
                            plain_offsets=plain_offsets)
    from . import batches as B
    fast._core("compiled").set_item_types(B.ErrorItem, B.StatusItem)
    blocks, insns, items, cps, underflows, stopped, ninsn = \
        dec.segment_batches(*_window(start, end))
    res = P.Result(start, end, _checkpoints(cps), underflows,
                   (len(blocks) // B.BLOCK.itemsize, len(items), ninsn, 0),
                   0, bool(stopped), None)
    return res, blocks, insns, items


def piece_spans(piece):
    """(records, items, instructions) ranges of a batches piece: three
    (from, to) pairs into its job's output."""
    _, _, ca, cb = P.piece_range(piece)
    return (ca[0], cb[0]), (ca[1], cb[1]), (ca[2], cb[2])


def rebatch(parts, want_insns: bool, max_records: int):
    """Batches from pieces' outputs: ``parts`` yields (blocks array, insns
    array or None, items re-indexed to the blocks) in order; the result is
    cut like the sequential producer's batches (a first batch of
    batches.FIRST_BATCH records, doubling up to ``max_records``), never
    inside a record, so flatten() is the sequential decode's."""
    import numpy as np

    from . import batches as B
    max_records = max(1, max_records)
    limit = min(B.FIRST_BATCH, max_records)
    recs, insns, items = [], [], []
    nrec = 0
    first = 0

    def cut(n):
        nonlocal recs, insns, items, nrec, first, limit
        blocks = np.concatenate(recs) if recs else np.zeros(0, B.BLOCK)
        take = blocks[:n]
        ninsn = int(take["ninsn"].sum()) if len(take) else 0
        ins = None
        if want_insns:
            allins = np.concatenate(insns) if insns else np.zeros(0, B.INSN)
            ins = allins[:ninsn]
            insns = [allins[ninsn:]]
        mine = [(i, o, x) for i, o, x in items if i < n or
                (i == n and n == len(blocks))]
        rest = [(i - n, o, x) for i, o, x in items[len(mine):]]
        b = B.Batch(take, ins, mine, first)
        first += ninsn
        recs = [blocks[n:]]
        items = rest
        nrec = len(blocks) - n
        limit = min(limit * 2, max_records)
        return b

    for blocks, ins, its in parts:
        items.extend((nrec + i, o, x) for i, o, x in its)
        recs.append(blocks)
        if want_insns:
            insns.append(ins)
        nrec += len(blocks)
        while nrec >= limit:
            yield cut(limit)
    if nrec or items:
        yield cut(nrec)
