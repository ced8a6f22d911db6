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
"""

from __future__ import annotations

import copy
import io
import os
import shutil
import tempfile
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
    """Where the trace is: a file range (``--pt FILE[:FROM[-TO]]``)."""

    path: str
    offset: int = 0
    size: int | None = None

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read() if self.size is None else f.read(self.size)


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
def load_image(images):
    from .image import Image
    from .loaders import load_elf, load_pagedump, load_raw

    image = Image()
    for kind, arg in images:
        if kind == "raw":
            load_raw(image, arg)
        elif kind == "elf":
            load_elf(image, arg)
        else:
            addrs, _, pages = arg.rpartition(":")
            load_pagedump(image, addrs, pages)
    return image


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


def run_job(job: Job, data=None) -> Result:
    """Decode one segment (with its tail); see the module doc."""
    if data is None:
        data = job.source.read()
    image = load_image(job.images)
    fd, path = tempfile.mkstemp(prefix="hwtrace-seg-", suffix=".out",
                                dir=job.spool_dir)
    with os.fdopen(fd, "w+b") as f:
        out = C.SpoolWriter(f)
        rec = C.Recorder(
            out, head=None if job.start is None else
            (job.start, psb_after(data, job.start, HEAD)),
            tail=None if job.end is None else
            (job.end, psb_after(data, job.end, TAIL)),
            done=None if job.end is None else _meets_next(job, data, image))
        dec = rec.decoder(_decoder_class(job), data, image, job.config,
                          start=job.start)
        stopped = _drive(job, dec, rec.sink(job.sink, out.write))
        size = out.tell()
        if job.spool_dir is None:
            f.seek(0)
            output = f.read()
        else:
            output = path
    if job.spool_dir is None:
        os.unlink(path)
    return Result(job.start, job.end, rec.checkpoints, rec.underflows,
                  rec.counts(), size, stopped, output)


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


# -- running it -----------------------------------------------------------------
class Executor:
    """Runs jobs: a local process pool, or a Dask client."""

    def __init__(self, jobs: int = 0, dask: str | None = None):
        self.dask = dask
        self.jobs = jobs or os.cpu_count() or 1
        self._pool = None
        self._client = None

    def __enter__(self):
        if self.dask:
            try:
                from distributed import Client
            except ImportError:
                raise RuntimeError("--dask needs the 'dask' extra: "
                                   "pip install 'hwtrace[dask]'") from None
            self._client = Client(self.dask, timeout=30)
        else:
            import concurrent.futures as cf
            import multiprocessing as mp
            self._pool = cf.ProcessPoolExecutor(
                self.jobs, mp_context=mp.get_context("fork"))
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._client is not None:
            self._client.close()

    @property
    def local(self) -> bool:
        return self._client is None

    def map(self, jobs: list[Job]) -> list[Result]:
        if self._client is not None:
            futures = self._client.map(run_job, jobs, pure=False)
            return self._client.gather(futures)
        return list(self._pool.map(run_job, jobs))

    def one(self, job: Job) -> Result:
        return self.map([job])[0]


def decode(source: Source, images, config, sink, write, *, block: bool,
           resync: bool = False, jobs: int = 0, dask: str | None = None,
           segments: int | None = None, min_segment: int = MIN_SEGMENT) -> dict:
    """Decode ``source`` in parallel, writing exactly the sequential output
    through ``write`` and leaving the sequential counters in ``sink``.
    Returns statistics of the run (segments, re-runs)."""
    import mmap

    with open(source.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        tsize = 0
        if size == 0:
            psbs = []
        else:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                end = size if source.size is None else source.offset + source.size
                view = mm[source.offset:end] if (source.offset or
                                                 end != size) else mm
                psbs = psb_offsets(view)
                tsize = end - source.offset
                del view
    with Executor(jobs, dask) as ex:
        nseg = segments or ex.jobs * SEGMENTS_PER_JOB
        starts = segment_starts(psbs, tsize, nseg, min_segment)
        spool = None if not ex.local else tempfile.mkdtemp(
            prefix="hwtrace-par-")
        try:
            template = copy.copy(sink)
            if hasattr(template, "write"):
                template.write = None
            for name in ("insns", "blocks", "events", "errors"):
                setattr(template, name, 0)
            bounds = [None] + starts
            ends = starts + [None]

            def job(start, end):
                return Job(source, tuple(images), config, block, template,
                           resync, start, end, spool)

            results = ex.map([job(s, e) for s, e in zip(bounds, ends)])
            reruns = []

            def rerun(start, end):
                reruns.append((start, end))
                return ex.one(job(start, end))

            pieces = stitch(results, rerun)
            totals = [0, 0, 0, 0]
            for piece in pieces:
                a, b, ca, cb = piece_range(piece)
                for n in range(4):
                    totals[n] += cb[n] - ca[n]
                _copy_out(piece.result.output, a, b, write)
            sink.insns, sink.blocks, sink.events, sink.errors = totals
        finally:
            if spool is not None:
                shutil.rmtree(spool, ignore_errors=True)
    return {"segments": len(bounds), "reruns": reruns, "pieces": len(pieces),
            "bytes": tsize}


def _copy_out(output, a: int, b: int, write, chunk: int = 1 << 20) -> None:
    if isinstance(output, (bytes, bytearray)):
        for at in range(a, b, chunk):
            write(output[at:min(b, at + chunk)].decode())
        return
    with open(output, "rb") as f:
        f.seek(a)
        left = b - a
        while left > 0:
            data = f.read(min(chunk, left))
            if not data:
                break
            write(data.decode())
            left -= len(data)


def decode_args(args, config, sink, write, *, block: bool,
                data=None) -> dict:
    """``hwtrace decode --jobs N / --dask ADDR`` for ``--pt`` traces
    (``data``: the trace if the caller read it already)."""
    from hwtrace.cli import CliError
    from .image import ImageError
    from .loaders import split_range

    try:
        path, offset, size = split_range(args.pt)
    except ImageError as e:
        raise CliError(f"--pt: {e}") from None
    if args.jobs < 0:
        raise CliError(f"--jobs: bad argument: {args.jobs}")
    stats = args.stat or args.stat_insn or args.stat_blocks
    if stats and args.quiet and args.format == "text" and \
            not args.show_blocks and args.dask is None:
        # Counts only: the compiled core, where it decodes the trace, is
        # faster on one core than the Python decoders on all of them.
        # On every core (flow/fast_parallel.py) where it can, else on one.
        from . import fast, fast_parallel
        env = os.environ
        try:
            # The same test knobs as below (segment size, count).
            c = fast_parallel.count(
                path, offset, size, args.images, config, block, args.jobs,
                resync=args.resync, segments=int(env["HWTRACE_PARALLEL_SEGMENTS"])
                if env.get("HWTRACE_PARALLEL_SEGMENTS") else None,
                min_segment=int(env.get("HWTRACE_PARALLEL_MIN_SEGMENT",
                                        fast_parallel.MIN_SEGMENT)))
            if c is None and data is None:
                data = Source(path, offset, size).read()
        except OSError as e:
            raise CliError(f"--pt: cannot read {path}: {e.strerror}") from None
        if c is not None:
            for e in c.error_items:
                sink.error(*e)
            sink.insns += c.insns
            sink.blocks += c.blocks
            sink.events += c.events
            return {}
        if fast.CORE is not None and fast.count_into(
                sink, data, load_image(args.images), config, block,
                args.resync):
            return {}
    if getattr(args, "show_blocks", False) and (
            args.stat or args.stat_insn or args.stat_blocks):
        # Block numbers count from the trace start: sequential only.
        from .block import BlockDecoder
        from .insn import InsnDecoder
        from . import session
        if data is None:
            data = Source(path, offset, size).read()
        image = load_image(args.images)
        if block:
            session.run_blocks(BlockDecoder(data, image, config), sink,
                               resync=args.resync)
        else:
            session.run_insn(InsnDecoder(data, image, config), sink,
                             resync=args.resync)
        return {}
    try:
        # HWTRACE_PARALLEL_MIN_SEGMENT: smallest segment in bytes (tests
        # cut small traces at every PSB with 0).
        min_seg = int(os.environ.get("HWTRACE_PARALLEL_MIN_SEGMENT",
                                     MIN_SEGMENT))
        segs = os.environ.get("HWTRACE_PARALLEL_SEGMENTS")
        return decode(Source(path, offset, size), args.images, config, sink,
                      write, block=block, resync=args.resync, jobs=args.jobs,
                      dask=args.dask, min_segment=min_seg,
                      segments=int(segs) if segs else None)
    except (OSError, RuntimeError, ValueError) as e:
        raise CliError(f"decode: {e}") from None
