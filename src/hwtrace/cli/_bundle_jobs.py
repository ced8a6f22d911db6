"""``hwtrace decode DIR --jobs N`` / ``--dask ADDR``: a bundle decoded on
N processes (or a Dask cluster), printing exactly what ``--jobs 1``
prints.

The units of work, chosen by measurement (on 2 cores; see the constants
below):

* each stream is a job: the sequential decode of the stream into a spool
  file -- but the largest is decoded by the command itself, straight to
  the output, while the workers decode the others (a listing: as many as
  fit :data:`SPOOL_LIMIT`; the command decodes the rest too);
* a stream whose address-space plan can't switch (one process, no PIP to
  another: :attr:`hwtrace.flow.spaces.SpacePlan.fixed`, every stream of a
  one-program recording, thread or cpu mode), whose jobs can meet
  (:func:`hwtrace.flow.fast_parallel.jobs_can_meet`: not with MTC and
  without CYC) and whose output does not number blocks from its start
  (``--block:show-blocks`` with ``--stat``) can be cut at PSBs as a raw
  trace is: each job decodes its segment with the compiled core in the
  initial space's image -- the counts of ``--quiet --stat``, or batches
  that the job itself walks into listing text (text or jsonl) in a spool
  file, noting the output position and the walk's counts at each
  checkpoint -- and :func:`hwtrace.flow.parallel.stitch` joins the jobs
  where their states meet (re-running where they don't), so the pieces
  are the sequential output.  Counts are cut only on more workers than
  :data:`COUNT_SEGMENT_COST`, listings only when the test knob asks
  (:data:`CUT_LISTINGS`).

The jobs of every stream are handed out at once; their output is copied
out stream by stream, in order, with the per-stream headers, stats lines
and warnings where the sequential decode puts them.  A job is a small
picklable description (the bundle, the command line, the stream, the
segment): local workers are forked after the bundle is opened and find
it opened; a Dask worker opens the bundle itself (the bundle must be at
the same path there).  A worker that dies leaves its stream to be
decoded here, sequentially.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import NamedTuple

from hwtrace.cli import CliError

#: what a counts job's decode costs against the sequential count's (the
#: compiled core's segment decode has no fast walk: 1.44 s against
#: 0.50 s of CPU for 490 M instructions of gzip): cutting a stream for
#: counts pays only on more workers than this
COUNT_SEGMENT_COST = 3
#: trace bytes per listing job at most (its records and instructions are
#: held while it walks them: ~100 MB per MB of trace)
LIST_SEGMENT = 1 << 20
#: a listing's bytes per byte of trace, about (text: 1,650 on mig/b1,
#: 1,200 on gzip; jsonl more) -- to keep what workers spool small
LISTING_PER_TRACE_BYTE = 2000
#: listing bytes the workers may spool at most, all streams together: a
#: spool is written and read back once more than the output, which costs
#: about what the decode does while it stays in the page cache (mig/b1,
#: 0.75 GB spooled: 0.83 s against 0.86 s on one job) and far more beyond
#: (4 threads, 16 GB spooled: 50 s against 13 s); streams past it are
#: decoded by the command itself, in order
SPOOL_LIMIT = 1 << 30
#: whether a listing's stream is cut into segments unless the test knob
#: (HWTRACE_PARALLEL_SEGMENTS) asks: not yet -- the core's segment_batches
#: hands a job's whole output at once (records and instructions of a MB
#: of trace: ~600 MB, page-faulted afresh by every job), which cost more
#: than the decode: gzip (45 M instructions, no MTC) listed in 2.1 s on
#: one job, 6 s cut on two (--quiet, no output at all: 2.4 s against 3.2 s,
#: 3 s of it system time)
CUT_LISTINGS = False


class StreamJob(NamedTuple):
    run: str                # this command's (what a worker keeps is per run)
    bundle: str
    args: object            # the command line (argparse.Namespace)
    stream: str             # its name in the bundle
    kind: str               # "whole" | "count" | "list"
    start: int | None       # PSB to synchronize at (None: the start)
    end: int | None         # where the next job starts (None: the end)
    spool_dir: str | None   # output to a file here (None: bytes back)


#: stream name -> Stream of the run ``_RUN[0]``: filled before the local
#: workers fork (they find it), and by a Dask worker on its first job of
#: a stream
_OPENED: dict = {}
#: stream name -> (format, contexts): a worker's line caches
_FORMATS: dict = {}
_RUN = [None]


def _this_run(job: StreamJob) -> None:
    """Forget what a worker kept for another command (a Dask worker
    serves many)."""
    if _RUN[0] != job.run:
        _RUN[0] = job.run
        _OPENED.clear()
        _FORMATS.clear()


def _stream(job: StreamJob):
    _this_run(job)
    key = job.stream
    st = _OPENED.get(key)
    if st is None:
        from hwtrace.cli._decode_bundle import open_streams
        st = _OPENED[key] = open_streams(job.args, only=[job.stream],
                                         cfg_lines=[]).streams[0]
    return st


def _formats(job: StreamJob):
    _this_run(job)
    got = _FORMATS.get(job.stream)
    if got is None:
        got = _FORMATS[job.stream] = _make_formats(job.args)
    return got


def _make_formats(args):
    from hwtrace.cli import decode as D
    fmt = D.listing_format(args)
    return fmt, D.contexts(args, fmt)


class _Spool:
    """A job's output: a file in the spool directory, or bytes."""

    def __init__(self, spool_dir: str | None):
        import io
        if spool_dir is None:
            self.f, self.path = io.BytesIO(), None
        else:
            fd, self.path = tempfile.mkstemp(prefix="hwtrace-stream-",
                                             suffix=".out", dir=spool_dir)
            self.f = os.fdopen(fd, "wb", buffering=1 << 20)
        self.size = 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.size += len(data)

    def text(self, s: str) -> None:
        if s:
            self.write(s.encode())

    def flush(self) -> None:
        pass

    def close(self):
        """What the parent copies from: the file's path, or the bytes."""
        if self.path is None:
            return self.f.getvalue()
        self.f.close()
        return self.path


def run_job(job: StreamJob):
    """One job, in a worker: ``(Result, ambiguous offsets)`` (see
    :class:`hwtrace.flow.parallel.Result`; its output is the spool
    file's path or the bytes, for counts jobs the error items)."""
    from hwtrace import streams
    from hwtrace.flow import parallel as P
    st = _stream(job)
    try:
        if job.kind == "count":
            return _count_job(job, st), ()
        if job.kind == "list":
            return _list_job(job, st), ()
        spool = _Spool(job.spool_dir)
        try:
            counts = _whole(job.args, st, spool, lambda: _formats(job))
        finally:
            output = spool.close()
    except streams.StreamsError as e:
        raise CliError(f"decode: {e}") from None
    amb = tuple(sorted(getattr(st.plan, "ambiguous", None) or ()))
    return P.Result(None, None, [], [], counts, spool.size, False,
                    output), amb


def _whole(args, st, out, formats) -> tuple:
    """A stream's sequential decode through ``out``: its counts
    (``formats()``: the listing's format and contexts)."""
    from hwtrace.cli import decode as D
    counts = None
    if D.counts_only(args):
        counts = D.fast_counts(args, out, st.data(), st.image, st.config,
                               st.plan)
    if counts is None:
        fmt, ctx = formats()
        w = D.decode_stream(args, st, fmt, ctx, out)
        counts = (w.insns, w.blocks, w.events, w.errors)
    return counts


def _count_job(job: StreamJob, st):
    from hwtrace.flow import fast_parallel as FP
    a = job.args
    return FP.count_segment(st.data(), st.image, st.config,
                            a.decoder != "insn", job.start, job.end,
                            a.resync, plain_offsets=st.plan is not None)


def _list_job(job: StreamJob, st):
    """A segment's batches, walked into listing text here: the Result's
    checkpoints hold the output position and the walk's counts."""
    import numpy as np

    from hwtrace.flow import batches as B
    from hwtrace.flow import fast_parallel as FP
    from hwtrace.flow import parallel as P
    from hwtrace.flow.checkpoint import Checkpoint
    from hwtrace.listing.walk import Walker
    a = job.args
    block = a.decoder != "insn"
    fmt, ctx = _formats(job)
    res, blocks, insns, items = FP.batch_segment(
        st.data(), st.image, st.config, "block" if block else "insn",
        job.start, job.end, a.resync, fmt.lines,
        plain_offsets=st.plan is not None)
    blocks = np.frombuffer(blocks, B.BLOCK)
    insns = None if insns is None else np.frombuffer(insns, B.INSN)
    spool = _Spool(job.spool_dir)
    initial = st.plan.initial if st.plan is not None else None
    w = Walker(fmt, spool.write,
               lambda space: ctx.for_space(space, st.image), block=block)
    if job.start is None and initial is not None:
        # the sequential decode's first item: the space it starts in
        w._item(0, B.SpaceItem(initial, 0))
    else:
        w.space = initial
    cps = []
    at = (0, 0, 0)              # records, items, instructions walked
    try:
        for cp in res.checkpoints:
            ra, ia, na = cp.counts[:3]
            _walk(w, blocks, insns, items, at, (ra, ia, na))
            at = (ra, ia, na)
            cps.append(Checkpoint(cp.pos, cp.key, cp.stack, spool.size,
                                  (w.insns, w.blocks, w.events, w.errors)))
        _walk(w, blocks, insns, items, at,
              (len(blocks), len(items), 0 if insns is None else len(insns)))
    finally:
        output = spool.close()
    return P.Result(res.start, res.end, cps, res.underflows,
                    (w.insns, w.blocks, w.events, w.errors), spool.size,
                    res.stopped, output)


def _walk(w, blocks, insns, items, at, to) -> None:
    """Walk records, items and instructions from ``at`` up to ``to``
    (a checkpoint's (records, items, instructions)) as one batch."""
    from hwtrace.flow import batches as B
    ra, ia, na = at
    rb, ib, nb = to
    if rb == ra and ib == ia:
        return
    its = [(i - ra, o, x) for i, o, x in items[ia:ib]]
    w.batch(B.Batch(blocks[ra:rb], None if insns is None else insns[na:nb],
                    its, na))


# -- the parent ------------------------------------------------------------------

def _cuts(args, st, kind: str, workers: int) -> list:
    """The PSBs cutting stream ``st`` into jobs (none: one job)."""
    from hwtrace.cli._parallel import _knobs
    from hwtrace.flow import fast_parallel as FP
    size = st.entry.size if st.entry is not None else 0
    segs, min_seg = _knobs(FP.MIN_SEGMENT)
    if segs is None:
        if kind == "count" and workers <= COUNT_SEGMENT_COST or \
                kind == "list" and not CUT_LISTINGS:
            return []
        segs = workers if kind == "count" else \
            max(workers * 4, -(-size // LIST_SEGMENT))
    if segs < 2:
        return []
    from hwtrace import jobs
    with jobs.mapped(st.path) as mm:
        return FP.cut_points(mm, 0, len(mm), segs, min_seg)


def _kind(args, st) -> str:
    """How stream ``st`` is shared out: "count"/"list" (segments), else
    "whole"."""
    from hwtrace.cli import decode as D
    from hwtrace.flow import fast
    from hwtrace.flow import fast_parallel as FP
    stats = args.stat or args.stat_insn or args.stat_blocks
    plan = st.plan
    if fast.CORE is None or (plan is not None and not plan.fixed) or \
            (args.show_blocks and stats) or \
            not FP.jobs_can_meet(st.entry.ctl if st.entry else None):
        return "whole"
    try:
        fast.config_tuple(st.config)
    except fast.Unsupported:
        return "whole"
    return "count" if D.counts_only(args) else "list"


def run_parallel(args, ts, cfg_line: str, out) -> int | None:
    """Decode the streams of ``ts`` (opened from ``args.bundle``) on
    ``args.jobs`` processes or ``args.dask``, printing through ``out``
    what :func:`hwtrace.cli._decode_bundle.run_bundle` prints; None
    where there is nothing to share out (the caller decodes)."""
    from hwtrace import jobs
    from hwtrace.cli import decode as D
    workers = args.jobs or os.cpu_count() or 1
    if workers < 2 and not args.dask:
        return None
    bundle = os.path.abspath(args.bundle)
    plans = []
    for st in ts.streams:
        kind = _kind(args, st)
        cuts = _cuts(args, st, kind, workers) if kind != "whole" else []
        if not cuts:
            kind = "whole"
        plans.append((st, kind, [None] + cuts, cuts + [None]))
    # The largest stream that is one job is decoded here, straight to the
    # output (spooling it would only copy its listing once more), while
    # the workers decode the others.
    whole = [i for i, p in enumerate(plans) if p[1] == "whole"]
    if whole:
        i = max(whole, key=lambda i: (plans[i][0].entry.size, -i))
        plans[i] = (plans[i][0], "here", [], [])
        workers = max(1, workers - 1)
        if not D.counts_only(args):
            _spool_budget(plans)
    if not args.dask and not any(p[2] for p in plans):
        return None                 # nothing to share out: sequential
    run = f"{os.getpid()}-{id(ts)}-{os.urandom(4).hex()}"
    _RUN[0] = run
    _OPENED.clear()
    _FORMATS.clear()
    for st in ts.streams:
        _OPENED[st.name] = st
    spool = None if args.dask else tempfile.mkdtemp(prefix="hwtrace-bundle-")
    try:
        with jobs.Executor(workers, args.dask) as ex:
            def job(st, kind, s, e):
                return StreamJob(run, bundle, args, st.name, kind, s, e,
                                 spool)
            futures = [[ex.submit(run_job, job(st, kind, s, e))
                        for s, e in zip(starts, ends)]
                       for st, kind, starts, ends in plans]
            try:
                for (st, kind, _s, _e), futs in zip(plans, futures):
                    _stream_out(args, st, kind, futs, ex, job, cfg_line,
                                out)
            except BaseException:
                ex.abort()      # e.g. `| head`: don't wait for the rest
                raise
    except jobs.ExecutorError as e:
        raise CliError(f"decode: {e}") from None
    finally:
        _RUN[0] = None
        _OPENED.clear()
        _FORMATS.clear()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
    out.flush()
    return 0


def _spool_budget(plans) -> None:
    """Streams whose listings would take the workers' spools past
    :data:`SPOOL_LIMIT` (the smallest go first) are decoded here."""
    left = SPOOL_LIMIT
    for i in sorted((i for i, p in enumerate(plans) if p[1] == "whole"),
                    key=lambda i: plans[i][0].entry.size):
        need = plans[i][0].entry.size * LISTING_PER_TRACE_BYTE
        if need > left:
            plans[i] = (plans[i][0], "here", [], [])
        else:
            left -= need


def _stream_out(args, st, kind, futs, ex, job, cfg_line, out) -> None:
    """One stream's output, from its jobs' results."""
    import json
    from concurrent.futures.process import BrokenProcessPool

    from hwtrace.cli import _decode_bundle as DB
    from hwtrace.cli import decode as D
    from hwtrace.flow import parallel as P
    out.text('{"stream":%s}\n' % json.dumps(st.name)
             if args.format == "jsonl" else f"[stream {st.name}]\n")
    out.text(cfg_line)

    def rerun(start, end):
        return ex.submit(run_job, job(st, kind, start, end)).result()[0]
    got = pieces = None
    try:
        if futs:
            got = [f.result() for f in futs]
            if kind != "whole":
                pieces = P.stitch([r for r, _ in got], rerun)
    except BrokenProcessPool:
        got = None              # a worker died: this stream, here
    if got is None:
        counts = _whole(args, st, out, lambda: _make_formats(args))
    elif kind == "whole":
        res, amb = got[0]
        if st.plan is not None:
            st.plan.ambiguous.update(amb)
        _copy(res.output, 0, res.out_size, out)
        counts = res.counts
    else:
        if kind == "count":
            counts = _count_pieces(args, pieces, out)
        else:
            from hwtrace.jobs import emit_pieces
            counts = tuple(emit_pieces(
                pieces, lambda output, a, b: _copy(output, a, b, out)))
    out.text(D.stats_text(args, counts[0], counts[1], st.entry.size,
                          counts[2], counts[3]))
    DB._warn_ambiguous(st, out)


def _count_pieces(args, pieces, out) -> tuple:
    from hwtrace.flow import fast_parallel as FP
    from hwtrace.flow import sinks
    c = FP.counts_of(pieces, args.decoder != "insn")
    sink = sinks.PtxedSink(out.text, quiet=True)
    for e in c.error_items:
        sink.error(*e)
    return (sink.insns + c.insns, sink.blocks + c.blocks,
            sink.events + c.events, sink.errors)


def _copy(output, a: int, b: int, out) -> None:
    """Bytes [a, b) of a job's output (bytes, or a spool file's path) to
    ``out`` (the kernel copies a spool file to an output that is a file
    descriptor: :func:`os.sendfile`)."""
    if isinstance(output, (bytes, bytearray)):
        if b > a:
            out.write(bytes(output[a:b]))
        return
    with open(output, "rb") as f:
        fd = _out_fd(out)
        if fd is not None:
            out.flush()
            try:
                while a < b:
                    n = os.sendfile(fd, f.fileno(), a, min(b - a, 1 << 30))
                    if n <= 0:
                        break
                    a += n
                return
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise           # EPIPE: the output went away
    from hwtrace.jobs import output_chunks
    for data in output_chunks(output, a, b):
        out.write(data)


def _out_fd(out):
    """The file descriptor ``out`` writes to, where it writes straight to
    one (stdout's buffer), else None."""
    import sys
    buf = getattr(sys.stdout, "buffer", None)
    if buf is None or getattr(out, "write", None) != buf.write:
        return None
    try:
        return buf.fileno()
    except (OSError, ValueError):
        return None
