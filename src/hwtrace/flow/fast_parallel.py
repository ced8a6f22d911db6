"""The compiled counts path on all cores: ``hwtrace decode --quiet --stat
--jobs N`` for ``--pt`` traces.

The plan is :mod:`.parallel`'s, with the compiled flow core doing each
job::

    from hwtrace.flow import fast_parallel
    c = fast_parallel.count(path, 0, None, [("raw", spec)], config,
                            block=True, jobs=2)      # fast.Counts or None

1. The trace (``path[offset:offset+size]``) is cut at PSBs into about
   ``segments`` (default: ``jobs``) pieces of similar size:
   :func:`parallel.segment_starts` over the PSBs found at the cut points.
2. Job 0 decodes from the trace start exactly as the sequential compiled
   decode does (:func:`fast.compiled_decode`); job *k* synchronizes at the
   PSB that starts segment *k* with a fresh decoder (empty return stack,
   time reset).  Each job runs in a fork process pool, maps the file
   read-only and reads only the pages it decodes: its segment, and a tail
   of :data:`TAIL` PSBs past its end.  The core records checkpoints (see
   ``_c_flow.c``, "checkpoints": the PSB offset, the whole live decode
   state except the return stack, the return stack, the counts) at the
   first :data:`HEAD` PSBs of a job and at the PSBs of its tail.
3. :func:`parallel.stitch` merges job *k* and *k+1* at the first checkpoint
   where their states are equal and *k+1*'s return stack is a suffix of
   *k*'s, and re-runs a job over the next segment where it cannot prove
   that.  A job *k > 0* that bails (the core's "return stack empty" when it
   pops past the bottom of its stack, or anything a fresh start decodes
   differently) stops there and reports it as an underflow after its last
   checkpoint: the stitch then takes none of its output past that point
   (it re-runs the job before it instead).
4. The counts are the sum of the pieces' count differences.

Result: exactly the sequential compiled decode's counts, or None where
that decode (or job 0, which is its beginning) bails, where a piece that
is the sequential decode bails, where there is no compiled core
(``HWTRACE_NO_EXTENSIONS=1``: the Python parallel decode handles it) or
where a worker process died -- the caller then takes its usual path.

Timing: the calibration state (the last MTC interval's frequency ratio)
is the same in a fresh job two MTCs after its PSB, so timing traces merge
at the second checkpoint instead of the first.
"""

from __future__ import annotations

import mmap
import os
import stat
from typing import NamedTuple

from . import fast
from . import parallel as P
from .checkpoint import Checkpoint

TAIL = 3            # checkpoints a job records at/after the end of its segment
HEAD = 3            # checkpoints a job k > 0 records from its start
MIN_SEGMENT = 256 << 10


class SegmentJob(NamedTuple):
    path: str
    offset: int
    size: int               # bytes of the trace from offset
    images: tuple           # (kind, arg) as decode's --raw/--elf/--pagedump
    config: object          # FlowConfig
    block: bool
    start: int | None       # PSB to synchronize at; None: the trace start
    end: int | None         # record TAIL checkpoints from here; None: run out
    resync: bool = False    # resynchronize on errors (--resync-on-error)


def run_segment(job: SegmentJob):
    """Decode one job (see the module doc): a :class:`parallel.Result`
    (checkpoints with counts; ``output``: the job's errors, as sinks get
    them), or None without a compiled core."""
    image = P.load_image(job.images)
    f, mm = _map(job.path)
    try:
        with memoryview(mm) as whole, \
                whole[job.offset:job.offset + job.size] as view:
            r = fast.compiled_segment(
                view, image, job.config, job.block,
                -1 if job.start is None else job.start,
                -1 if job.end is None else job.end, TAIL,
                0 if job.start is None else HEAD, job.resync)
    finally:
        if not isinstance(mm, bytes):
            mm.close()
        f.close()
    if r is None:
        return None
    insns, blocks, events, errors, cps, underflows, stopped = r
    checkpoints = [Checkpoint(pos, key, stack, 0, counts)
                   for pos, key, stack, counts in cps]
    return P.Result(job.start, job.end, checkpoints, underflows,
                    (insns, blocks, events, len(errors)), 0, bool(stopped),
                    errors)


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


def count(path: str, offset: int, size: int | None, images, config,
          block: bool, jobs: int, *, resync: bool = False,
          segments: int | None = None,
          min_segment: int = MIN_SEGMENT) -> fast.Counts | None:
    """The sequential compiled decode's counts (and errors) of
    ``path[offset:][:size]`` (``images``: (kind, arg) pairs), decoded on
    ``jobs`` cores (0: all); None without a compiled core, for a trace
    that is not a regular file, or where a worker process died (the caller
    then decodes on one core)."""
    return count_stats(path, offset, size, images, config, block, jobs,
                       resync=resync, segments=segments,
                       min_segment=min_segment)[0]


def count_stats(path: str, offset: int, size: int | None, images, config,
                block: bool, jobs: int, *, resync: bool = False,
                segments: int | None = None,
                min_segment: int = MIN_SEGMENT):
    """:func:`count` and statistics of the run: segments, re-runs
    ((start, end) pairs), merged_at (for each piece after the first, the
    index of the later job's checkpoint it starts at)."""
    stats = {"segments": 1, "reruns": [], "merged_at": []}
    jobs = jobs or os.cpu_count() or 1          # 0: every core
    if fast.CORE is None:
        return None, stats
    fast.config_tuple(config)       # Unsupported: the caller's error
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None, stats          # a pipe, a device: not mapped here
    f, mm = _map(path)
    try:
        total = len(mm)
        offset = min(offset, total)
        tsize = total - offset if size is None else \
            max(0, min(size, total - offset))
        starts = cut_points(mm, offset, tsize, segments or jobs, min_segment) \
            if jobs > 1 else []
    finally:
        if not isinstance(mm, bytes):
            mm.close()
        f.close()
    images = tuple(images)

    def job(start, end):
        return SegmentJob(path, offset, tsize, images, config, block, start,
                          end, resync)

    bounds = [None] + starts
    ends = starts + [None]
    stats["segments"] = len(bounds)
    if len(bounds) == 1:
        r = run_segment(job(None, None))
        return _counts([P.Piece(r, -1, None, True)], block), stats

    import concurrent.futures as cf
    import multiprocessing as mp
    from concurrent.futures.process import BrokenProcessPool

    try:
        with cf.ProcessPoolExecutor(min(jobs, len(bounds)),
                                    mp_context=mp.get_context("fork")) as pool:
            results = list(pool.map(
                run_segment, [job(s, e) for s, e in zip(bounds, ends)]))

            def rerun(start, end):
                stats["reruns"].append((start, end))
                return pool.submit(run_segment, job(start, end)).result()

            pieces = P.stitch(results, rerun)
    except BrokenProcessPool:
        # a worker died (killed, out of memory): the caller's usual path
        stats["broken"] = True
        return None, stats
    stats["merged_at"] = [p.first for p in pieces[1:]]
    return _counts(pieces, block), stats


def _counts(pieces, block: bool) -> fast.Counts:
    """The counts and errors of the stitched pieces."""
    totals = [0, 0, 0, 0]
    errors = []
    for piece in pieces:
        _, _, ca, cb = P.piece_range(piece)
        for n in range(4):
            totals[n] += cb[n] - ca[n]
        errors.extend(piece.result.output[ca[3]:cb[3]])
    return fast.Counts(totals[0], totals[1] if block else 0, totals[3],
                       True, totals[2], tuple(errors))
