"""Parallel decoding, the I/O side: files, mappings, spool files, process
pools and Dask, for the plans of :mod:`hwtrace.flow.parallel` (the Python
decoders' jobs, text output) and :mod:`hwtrace.flow.fast_parallel` (the
compiled core's jobs: counts, batches).

    from hwtrace import jobs
    stats = jobs.decode(Source(path), images, config, sink, write,
                        block=True, jobs=2)              # text, in order
    c = jobs.count(path, 0, None, images, config, block=True, jobs=2)
    for batch in jobs.batches(path, 0, None, images, config, jobs=2): ...

A job is a small picklable description (a file range and the image
options, never the bytes): each worker maps the trace itself and reads
only the pages it decodes.  On Dask the workers may be other machines:
the trace and images must be readable at the same paths there.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import mmap
import os
import shutil
import stat
import tempfile
from typing import NamedTuple

from hwtrace.flow import checkpoint as C
from hwtrace.flow import fast
from hwtrace.flow import fast_parallel as FP
from hwtrace.flow import parallel as P
from hwtrace.flow.parallel import Job, Result, Source

__all__ = ["Source", "Job", "Result", "read", "load_image", "mapped",
           "run_job", "Executor", "decode", "SegmentJob", "run_segment",
           "count", "count_stats", "BatchJob", "run_batch_job", "batches"]


# -- files ----------------------------------------------------------------------

def read(source: Source) -> bytes:
    """The bytes of a file range."""
    with open(source.path, "rb") as f:
        f.seek(source.offset)
        return f.read() if source.size is None else f.read(source.size)


def load_image(images):
    """An image from decode's ``(kind, arg)`` options (--raw, --elf,
    --pagedump), in order."""
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf, load_pagedump, load_raw

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


@contextlib.contextmanager
def mapped(path: str):
    """The whole file read-only: a mmap (b"" for an empty file)."""
    f = open(path, "rb")
    try:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm
        finally:
            mm.close()
    finally:
        f.close()


@contextlib.contextmanager
def _view(path: str, offset: int, size: int):
    with mapped(path) as mm:
        with memoryview(mm) as whole, whole[offset:offset + size] as view:
            yield view


def _regular(path: str) -> bool:
    return stat.S_ISREG(os.stat(path).st_mode)


# -- the Python decoders' jobs (text output) ---------------------------------------

def run_job(job: Job, data=None) -> Result:
    """Decode one segment with the Python decoders (see flow.parallel),
    writing the output to a spool file in ``job.spool_dir`` (None: the
    output comes back as bytes)."""
    if data is None:
        data = read(job.source)
    image = load_image(job.images)
    fd, path = tempfile.mkstemp(prefix="hwtrace-seg-", suffix=".out",
                                dir=job.spool_dir)
    with os.fdopen(fd, "w+b") as f:
        out = C.SpoolWriter(f)
        cps, under, counts, stopped = P.record_job(job, data, image, out)
        size = out.tell()
        if job.spool_dir is None:
            f.seek(0)
            output = f.read()
        else:
            output = path
    if job.spool_dir is None:
        os.unlink(path)
    return Result(job.start, job.end, cps, under, counts, size, stopped,
                  output)


class ExecutorError(RuntimeError):
    """The jobs cannot be run there (one line: no Dask, no scheduler)."""


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
                raise ExecutorError("--dask needs the 'dask' extra: "
                                    "pip install 'hwtrace[dask]'") from None
            try:
                self._client = Client(self.dask, timeout=30)
            except (OSError, TimeoutError, ValueError, TypeError) as e:
                raise ExecutorError(f"--dask {self.dask}: no scheduler there: "
                                    f"{e}") from None
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

    def map(self, fn, jobs: list) -> list:
        if self._client is not None:
            futures = self._client.map(fn, jobs, pure=False)
            return self._client.gather(futures)
        return list(self._pool.map(fn, jobs))

    def one(self, fn, job):
        return self.map(fn, [job])[0]

    def abort(self) -> None:
        """Stop now (the output went away: a closed pipe, an error): the
        local workers are killed rather than waited for, Dask's jobs
        cancelled."""
        if self._pool is not None:
            procs = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                p.kill()
            for p in procs:
                p.join()
        if self._client is not None:
            self._client.close()
            self._client = None

    def submit(self, fn, job):
        """A future of ``fn(job)`` (its ``result()`` waits)."""
        if self._client is not None:
            return self._client.submit(fn, job, pure=False)
        return self._pool.submit(fn, job)


def decode(source: Source, images, config, sink, write, *, block: bool,
           resync: bool = False, jobs: int = 0, dask: str | None = None,
           segments: int | None = None,
           min_segment: int = P.MIN_SEGMENT) -> dict:
    """Decode ``source`` in parallel with the Python decoders, writing
    exactly the sequential output through ``write`` and leaving the
    sequential counters in ``sink``.  Returns statistics of the run
    (segments, re-runs)."""
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
                psbs = P.psb_offsets(view)
                tsize = end - source.offset
                del view
    with Executor(jobs, dask) as ex:
        nseg = segments or ex.jobs * P.SEGMENTS_PER_JOB
        starts = P.segment_starts(psbs, tsize, nseg, min_segment)
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

            results = ex.map(run_job, [job(s, e) for s, e in zip(bounds, ends)])
            reruns = []

            def rerun(start, end):
                reruns.append((start, end))
                return ex.one(run_job, job(start, end))

            pieces = P.stitch(results, rerun)
            sink.insns, sink.blocks, sink.events, sink.errors = emit_pieces(
                pieces, lambda output, a, b: _copy_out(output, a, b, write))
        finally:
            if spool is not None:
                shutil.rmtree(spool, ignore_errors=True)
    return {"segments": len(bounds), "reruns": reruns, "pieces": len(pieces),
            "bytes": tsize}


def emit_pieces(pieces, copy) -> list:
    """Each stitched piece's part of its job's output, in order, through
    ``copy(output, from, to)``; the counts they add up to (instructions,
    blocks, events, errors)."""
    totals = [0, 0, 0, 0]
    for piece in pieces:
        a, b, ca, cb = P.piece_range(piece)
        for n in range(4):
            totals[n] += cb[n] - ca[n]
        copy(piece.result.output, a, b)
    return totals


def output_chunks(output, a: int, b: int, chunk: int = 1 << 20):
    """Bytes [a, b) of a job's output (bytes, or a spool file's path), a
    chunk at a time."""
    if isinstance(output, (bytes, bytearray)):
        for at in range(a, b, chunk):
            yield bytes(output[at:min(b, at + chunk)])
        return
    with open(output, "rb") as f:
        f.seek(a)
        left = b - a
        while left > 0:
            data = f.read(min(chunk, left))
            if not data:
                break
            yield data
            left -= len(data)


def _copy_out(output, a: int, b: int, write, chunk: int = 1 << 20) -> None:
    """Bytes [a, b) of a job's output written as text: one incremental
    UTF-8 decoder over the chunks, so a character split across two of
    them (a symbol's or a path's) is joined, not an error."""
    dec = codecs.getincrementaldecoder("utf-8")()
    for data in output_chunks(output, a, b, chunk):
        text = dec.decode(data)
        if text:
            write(text)
    text = dec.decode(b"", final=True)
    if text:
        write(text)


# -- the compiled core's jobs: counts ------------------------------------------------

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


def run_segment(job: SegmentJob) -> Result:
    """One compiled counts job (fast_parallel.count_segment) over its
    file range, mapped."""
    image = load_image(job.images)
    with _view(job.path, job.offset, job.size) as view:
        return FP.count_segment(view, image, job.config, job.block,
                                job.start, job.end, job.resync)


def _plan(path: str, offset: int, size: int | None, segments: int,
          min_segment: int):
    """(trace size, cut points) of a file range."""
    with mapped(path) as mm:
        total = len(mm)
        offset = min(offset, total)
        tsize = total - offset if size is None else \
            max(0, min(size, total - offset))
        starts = FP.cut_points(mm, offset, tsize, segments, min_segment) \
            if segments > 1 else []
    return offset, tsize, starts


def _stitched(run, job, starts, workers: int, stats: dict,
              dask: str | None = None, unwrap=None):
    """Run the jobs of ``starts`` on ``workers`` processes (or a Dask
    cluster) and stitch them: the pieces, or None if a worker died.
    ``unwrap(result)``: the :class:`Result` of what ``run`` returns."""
    unwrap = unwrap or (lambda r: r)
    bounds = [None] + starts
    ends = starts + [None]
    stats["segments"] = len(bounds)
    if len(bounds) == 1 and dask is None:
        return [P.Piece(unwrap(run(job(None, None))), -1, None, True)]
    from concurrent.futures.process import BrokenProcessPool
    try:
        with Executor(min(workers, len(bounds)), dask) as ex:
            results = [unwrap(r) for r in ex.map(
                run, [job(s, e) for s, e in zip(bounds, ends)])]

            def rerun(start, end):
                stats["reruns"].append((start, end))
                return unwrap(ex.one(run, job(start, end)))

            pieces = P.stitch(results, rerun)
    except BrokenProcessPool:
        # a worker died (killed, out of memory): the caller's usual path
        stats["broken"] = True
        return None
    stats["merged_at"] = [p.first for p in pieces[1:]]
    stats["merged_pos"] = [(p.result.start, p.result.checkpoints[p.first].pos)
                           for p in pieces[1:] if p.first >= 0]
    return pieces


def count(path: str, offset: int, size: int | None, images, config,
          block: bool, jobs: int, *, resync: bool = False,
          segments: int | None = None, min_segment: int = FP.MIN_SEGMENT,
          dask: str | None = None) -> fast.Counts | None:
    """The sequential compiled decode's counts and errors of
    ``path[offset:][:size]`` (``images``: (kind, arg) pairs), decoded on
    ``jobs`` cores (0: all) or a Dask cluster (``dask``: its scheduler);
    None without a compiled core, for a trace that is not a regular file,
    or where a worker process died (the caller then decodes on one
    core)."""
    return count_stats(path, offset, size, images, config, block, jobs,
                       resync=resync, segments=segments,
                       min_segment=min_segment, dask=dask)[0]


def count_stats(path: str, offset: int, size: int | None, images, config,
                block: bool, jobs: int, *, resync: bool = False,
                segments: int | None = None,
                min_segment: int = FP.MIN_SEGMENT, dask: str | None = None):
    """:func:`count` and statistics of the run: segments, re-runs
    ((start, end) pairs), merged_at (for each piece after the first, the
    index of the later job's checkpoint it starts at), merged_pos (the
    (job start, trace position) of those checkpoints)."""
    stats = {"segments": 1, "reruns": [], "merged_at": []}
    jobs = jobs or os.cpu_count() or 1          # 0: every core
    if fast.CORE is None:
        return None, stats
    fast.config_tuple(config)       # Unsupported: the caller's error
    if not _regular(path):
        return None, stats          # a pipe, a device: not mapped here
    offset, tsize, starts = _plan(path, offset, size,
                                  (segments or jobs) if jobs > 1 or dask
                                  else 1, min_segment)
    images = tuple(images)

    def job(start, end):
        return SegmentJob(path, offset, tsize, images, config, block, start,
                          end, resync)
    pieces = _stitched(run_segment, job, starts, jobs, stats, dask)
    if pieces is None:
        return None, stats
    return FP.counts_of(pieces, block), stats


# -- the compiled core's jobs: batches ------------------------------------------------

class BatchJob(NamedTuple):
    path: str
    offset: int
    size: int
    images: tuple
    config: object
    decoder: str            # "block" | "insn"
    start: int | None
    end: int | None
    resync: bool
    want_insns: bool
    spool_dir: str | None   # the records go to a file here (None: bytes)


def run_batch_job(job: BatchJob):
    """One compiled batches job: (Result, BatchOutput); with a spool
    directory the records and instructions are in a file there."""
    image = load_image(job.images)
    with _view(job.path, job.offset, job.size) as view:
        res, blocks, insns, items = FP.batch_segment(
            view, image, job.config, job.decoder, job.start, job.end,
            job.resync, job.want_insns)
    if job.spool_dir is None:
        return res, FP.BatchOutput(blocks, insns, items)
    fd, path = tempfile.mkstemp(prefix="hwtrace-batch-", suffix=".rec",
                                dir=job.spool_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(blocks)
        if insns is not None:
            f.write(insns)
    return res, FP.BatchOutput((path, 0, len(blocks)), None if insns is None
                               else (path, len(blocks), len(insns)), items)


def _array(part, dtype):
    import numpy as np
    if part is None:
        return None
    if isinstance(part, (bytes, bytearray)):
        return np.frombuffer(part, dtype)
    path, offset, size = part
    if not size:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype, "r", offset, (size // dtype.itemsize,))


def batches(path: str, offset: int, size: int | None, images, config,
            decoder: str = "block", *, resync: bool = False,
            want_insns: bool = False, max_records: int = 1 << 16,
            jobs: int = 0, segments: int | None = None,
            min_segment: int = FP.MIN_SEGMENT, stats: dict | None = None,
            dask: str | None = None):
    """The compiled core's batches of ``path[offset:][:size]`` decoded on
    ``jobs`` cores (or a Dask cluster): flatten()-equal to the sequential
    ones.  Local jobs leave their records in spool files, mapped when they
    are handed out; Dask jobs send them back."""
    from hwtrace.flow import batches as B
    stats = {} if stats is None else stats
    stats.update(segments=1, reruns=[], merged_at=[])
    jobs = jobs or os.cpu_count() or 1
    offset, tsize, starts = _plan(path, offset, size,
                                  (segments or jobs) if jobs > 1 or dask
                                  else 1, min_segment)
    images = tuple(images)
    spool = tempfile.mkdtemp(prefix="hwtrace-batches-")
    outputs = {}

    def job(start, end):
        return BatchJob(path, offset, tsize, images, config, decoder, start,
                        end, resync, want_insns, None if dask else spool)

    def as_result(r):
        res, out = r
        outputs[id(res)] = out
        return res

    try:
        pieces = _stitched(run_batch_job, job, starts, jobs, stats, dask,
                           as_result)
        if pieces is None:
            raise RuntimeError("a batches job's worker died")

        def parts():
            for piece in pieces:
                out = outputs[id(piece.result)]
                (ra, rb), (ia, ib), (na, nb) = FP.piece_spans(piece)
                blocks = _array(out.blocks, B.BLOCK)[ra:rb]
                insns = _array(out.insns, B.INSN)
                items = [(i - ra, o, x) for i, o, x in out.items[ia:ib]]
                yield blocks, None if insns is None else insns[na:nb], items
        yield from FP.rebatch(parts(), want_insns, max_records)
    finally:
        shutil.rmtree(spool, ignore_errors=True)
