"""Parallel decoding: a trace cut at PSBs, the pieces decoded at once on
all cores (or on a Dask cluster), stitched into exactly the output of one
sequential decode.

The plan
--------
The trace is cut into segments at PSBs.  Job 0 decodes from the start of
the trace exactly as :mod:`.session` does; job *k* synchronizes at the
PSB that starts segment *k* (a fresh decoder: empty return stack, time
reset).  A job records :class:`~.checkpoint.Checkpoint` s (a digest of the
whole decode state, at the first item after a PSB+) at its first ``HEAD``
PSBs and past the end of its segment, where it decodes on into the next
segment until it meets the next job's state -- at most ``TAIL`` PSBs.
Whether it met it is known at once: the job decodes the next job's first
checkpoint itself, with a second decoder synchronized at that PSB (a few
items), and stops at the first checkpoint of its own with the same state;
on valid traces that is the PSB where the next segment starts, so the
overlap costs almost nothing.  Nothing else runs per instruction or block
in a job (see :class:`~.checkpoint.Recorder`): a job decodes at the
sequential decoder's speed.

A job's output is correct from the point where its state equals the
sequential decoder's.  Job 0's is correct from the start.  If job *k*'s
output is correct from checkpoint *c*, and job *k+1* reaches a checkpoint
with the same digest at a later point (with a return stack that is a
suffix of job *k*'s), both emit the same from there on, so the output is
job *k*'s up to that checkpoint and job *k+1*'s after it.  Job *k+1*'s
missing stack entries could only show as a ``RETSTACK_EMPTY`` error, so a
piece of a job that did not start in an equal state is only taken if it
has no such error.  Where either test fails the stitch does not guess: it
re-runs the earlier job over the later job's segment too (in the worst
case this is the sequential decode), so the result is always identical.

Where states never meet (MTC/CYC timing: a decoder synchronized later
never reaches the same calibration state) the second miss in a row makes
the stitch decode on to the end: identical output at the cost of about
two decodes.  Counts only (``--quiet --stat``) go to the compiled flow
core where it decodes the trace (faster on one core than the Python
decoders on all cores).

Memory: a job holds one copy of the trace (the packet decoder's buffer)
and writes its output to a spool file; the stitch copies the pieces in
order, so output is never held in memory.  On Dask the output comes back
as bytes (workers may be other machines: the trace and images must be
readable at the same paths there).

This module is the plan, a job's decode over a buffer and the stitch (no
I/O); :mod:`hwtrace.jobs` opens the files, runs the jobs (process pool or
Dask) and writes the spool files, and ``hwtrace.cli._parallel`` is the
``decode --jobs`` / ``--dask`` command line.
"""

from __future__ import annotations

import io
from typing import NamedTuple

from hwtrace.pt.decoder import find_psb_forward

from . import checkpoint as C

TAIL = 3            # PSBs a job decodes on past its end (if need be)
# PSBs from its start where a job records checkpoints.  At least TAIL: the
# head holds every checkpoint the previous job's tail can meet, so the
# stitch's indices into it stay valid when it re-runs the job with a later
# end (the head is the same prefix of any run from the same start).
HEAD = TAIL
SEGMENTS_PER_JOB = 4
# A segment costs its job ~30 ms beyond the decode (images, the probe, a
# few digests), about what 1 KB of trace takes to decode; 32 KB segments
# still let the cores share out a trace of a few hundred KB evenly.
MIN_SEGMENT = 32 << 10


class Source(NamedTuple):
    """Where the trace is: a file range (``--pt FILE[:FROM[-TO]]``);
    :func:`hwtrace.jobs.read` reads it."""

    path: str
    offset: int = 0
    size: int | None = None


class Job(NamedTuple):
    source: Source
    images: tuple           # (kind, arg) as decode's --raw/--elf/--pagedump
    config: object          # FlowConfig
    block: bool             # block decoder (else instruction decoder)
    sink: object            # a copy of the CLI's sink, write=None
    resync: bool
    start: int | None       # PSB to synchronize at; None: the trace start
    end: int | None         # stop TAIL checkpoints past this; None: run out
    spool_dir: str | None   # keep output in a file here; None: return bytes


class Result(NamedTuple):
    start: int | None
    end: int | None
    checkpoints: list
    underflows: list
    counts: tuple           # the sink's counters at the end
    out_size: int
    stopped: bool           # stopped past ``end`` (else the decode ended)
    output: object          # a spool file path or bytes


# -- segments ---------------------------------------------------------------
def psb_offsets(buf) -> list[int]:
    """The PSBs a decoder can synchronize at, in order."""
    out = []
    pos = 0
    while True:
        found = find_psb_forward(buf, pos)
        if found < 0:
            return out
        out.append(found)
        pos = found + 16


def psb_after(buf, pos: int, n: int) -> int | None:
    """The ``n``-th PSB after the one at ``pos`` (None: there is none)."""
    for _ in range(n):
        pos = find_psb_forward(buf, pos + 16)
        if pos < 0:
            return None
    return pos


def segment_starts(psbs: list[int], size: int, segments: int,
                   min_size: int = MIN_SEGMENT) -> list[int]:
    """Up to ``segments - 1`` PSBs cutting a ``size``-byte trace into
    pieces of similar size (none smaller than ``min_size``)."""
    if segments < 2 or len(psbs) < 2:
        return []
    starts = []
    i = 1
    for k in range(1, segments):
        want = size * k // segments
        while i < len(psbs) and psbs[i] < want:
            i += 1
        if i >= len(psbs):
            break
        at = psbs[i]
        prev = starts[-1] if starts else 0
        if at > prev and at - prev >= min_size and size - at >= min_size:
            starts.append(at)
    return starts


# -- one job ----------------------------------------------------------------
def _meets_next(job: Job, data, image):
    """``done`` for the recorder of ``job``: whether a checkpoint of its
    tail meets the next job (which synchronizes at ``job.end``) at that
    job's first checkpoint, as :func:`_merge` will find it.  That first
    checkpoint comes a few items after the PSB, so it is computed here,
    by a decoder of our own (cheaper than decoding on for more tail)."""
    index = None

    def done(cp) -> bool:
        nonlocal index
        if index is None:
            index = _key_index(_first_checkpoints(job, data, image))
        return _meets(cp, index) is not None
    return done


def _first_checkpoints(job: Job, data, image) -> list:
    """The first checkpoint of a job starting at ``job.end`` (or none)."""
    rec = C.Recorder(C.SpoolWriter(io.BytesIO()), tail=(job.end, job.end))
    dec = rec.decoder(_decoder_class(job), data, image, job.config,
                      start=job.end)
    _drive(job, dec, rec.sink(job.sink, lambda s: None))
    return rec.checkpoints


def _decoder_class(job: Job):
    from .block import BlockDecoder
    from .insn import InsnDecoder
    return BlockDecoder if job.block else InsnDecoder


def _drive(job: Job, dec, sink) -> bool:
    """Run the session; True if the recorder stopped it."""
    from . import session
    try:
        if job.block:
            session.run_blocks(dec, sink, resync=job.resync)
        else:
            session.run_insn(dec, sink, resync=job.resync)
    except C.Stop:
        return True
    return False


def record_job(job: Job, data, image, out: C.SpoolWriter):
    """Decode one segment (with its tail) of ``data`` in ``image``, writing
    the sink's output to ``out``: ``(checkpoints, underflows, counts,
    stopped)`` (see the module doc; :func:`hwtrace.jobs.run_job` is the
    job with its files)."""
    rec = C.Recorder(
        out, head=None if job.start is None else
        (job.start, psb_after(data, job.start, HEAD)),
        tail=None if job.end is None else
        (job.end, psb_after(data, job.end, TAIL)),
        done=None if job.end is None else _meets_next(job, data, image))
    dec = rec.decoder(_decoder_class(job), data, image, job.config,
                      start=job.start)
    stopped = _drive(job, dec, rec.sink(job.sink, out.write))
    return rec.checkpoints, rec.underflows, rec.counts(), stopped


# -- the stitch ---------------------------------------------------------------
class Piece(NamedTuple):
    result: Result
    first: int          # checkpoint index the piece starts at (-1: output start)
    last: int | None    # checkpoint index it ends before (None: output end)
    exact: bool         # the job's state equals the sequential one at `first`


def _key_index(checkpoints) -> dict:
    """digest -> index of its first checkpoint."""
    index = {}
    for j, cp in enumerate(checkpoints):
        index.setdefault(cp.key, (j, cp.stack))
    return index


def _meets(cp, index):
    """(j, same_stack) if checkpoint ``cp`` of a job meets the next job
    (``index``: :func:`_key_index` of its checkpoints) at its checkpoint j:
    the same state, with a return stack that is a suffix of ``cp``'s."""
    hit = index.get(cp.key)
    if hit is None:
        return None
    j, theirs = hit
    if len(theirs) <= len(cp.stack) and \
            cp.stack[len(cp.stack) - len(theirs):] == theirs:
        return j, theirs == cp.stack
    return None


def _merge(cur: Result, first: int, nxt: Result):
    """(i, j, same_stack): the first checkpoint i >= first of ``cur`` whose
    state job ``nxt`` also reaches, at its checkpoint j."""
    index = _key_index(nxt.checkpoints)
    for i in range(max(first, 0), len(cur.checkpoints)):
        cp = cur.checkpoints[i]
        if nxt.start is not None and cp.pos < nxt.start:
            continue
        m = _meets(cp, index)
        if m is not None:
            return i, m[0], m[1]
    return None


def _underflow_in(piece: Piece) -> bool:
    lo = piece.first
    hi = piece.last if piece.last is not None else 1 << 62
    return any(lo < u <= hi for u in piece.result.underflows)


def stitch(results: list[Result], rerun) -> list[Piece]:
    """The pieces of job outputs that make up the sequential output.
    ``rerun(start, end)`` decodes again from ``start`` to ``end`` (a job
    covering more segments) when a boundary cannot be proven."""
    pieces: list[Piece] = []
    cur, first, exact = results[0], -1, True
    k = 1
    fails = 0
    while True:
        done = k >= len(results) or not cur.stopped
        if done:
            piece = Piece(cur, first, None, exact)
        else:
            nxt = results[k]
            m = _merge(cur, first, nxt)
            if m is None:
                # No common state within the tail: decode on through the
                # next segment from the same start; after a second miss
                # in a row (state that never meets, e.g. MTC/CYC timing)
                # on to the end, so a trace costs at most ~2 decodes.
                fails += 1
                cur = rerun(cur.start, nxt.end if fails < 2 else None)
                k += 1
                continue
            fails = 0
            piece = Piece(cur, first, m[0], exact)
        if not exact and _underflow_in(piece):
            # Entries from before this job's PSB may have been needed:
            # the previous job decodes this segment too.
            prev = pieces.pop()
            cur = rerun(prev.result.start, cur.end)
            first, exact = prev.first, prev.exact
            continue
        pieces.append(piece)
        if done:
            return pieces
        cur, first, exact = results[k], m[1], exact and m[2]
        k += 1


def piece_range(piece: Piece) -> tuple[int, int, tuple, tuple]:
    """(out_from, out_to, counts_from, counts_to) of a piece."""
    r = piece.result
    zero = (0, 0, 0, 0)
    if piece.first < 0:
        a, ca = 0, zero
    else:
        cp = r.checkpoints[piece.first]
        a, ca = cp.out, cp.counts
    if piece.last is None:
        b, cb = r.out_size, r.counts
    else:
        cp = r.checkpoints[piece.last]
        b, cb = cp.out, cp.counts
    return a, b, ca, cb
