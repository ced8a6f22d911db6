"""``hwtrace decode --jobs N`` / ``--dask ADDR`` for ``--pt`` traces: the
command line's side of parallel decoding (its options, errors for the
user, the test knobs in the environment); the decoding is hwtrace.jobs'.
A bundle's is hwtrace.cli._bundle_jobs (the same knobs).
"""

from __future__ import annotations

import os

from hwtrace.cli import CliError

# Test knobs: the smallest segment in bytes (tests cut small traces at
# every PSB with 0) and the number of segments.
MIN_SEGMENT_ENV = "HWTRACE_PARALLEL_MIN_SEGMENT"
SEGMENTS_ENV = "HWTRACE_PARALLEL_SEGMENTS"


def _knobs(default_min: int) -> tuple[int | None, int]:
    env = os.environ
    try:
        segs = int(env[SEGMENTS_ENV]) if env.get(SEGMENTS_ENV) else None
        min_seg = int(env.get(MIN_SEGMENT_ENV, default_min))
    except ValueError as e:
        raise CliError(f"decode: bad {SEGMENTS_ENV}/{MIN_SEGMENT_ENV}: "
                       f"{e}") from None
    return segs, min_seg


def decode_args(args, config, sink, write, *, block: bool, data=None) -> dict:
    """Decode ``args.pt`` on ``args.jobs`` processes (or ``args.dask``):
    counts only (``--quiet --stat``) through the compiled core's segment
    jobs where it is in use, everything else through the Python decoders'
    jobs; the output is the sequential decode's (``data``: the trace if
    the caller read it already)."""
    from hwtrace import jobs
    from hwtrace.flow import fast
    from hwtrace.flow import fast_parallel as FP
    from hwtrace.flow import parallel as P
    from hwtrace.flow.image import ImageError
    from hwtrace.flow.loaders import split_range

    try:
        path, offset, size = split_range(args.pt)
    except ImageError as e:
        raise CliError(f"--pt: {e}") from None
    if args.jobs < 0:
        raise CliError(f"--jobs: bad argument: {args.jobs}")
    stats = args.stat or args.stat_insn or args.stat_blocks
    if stats and args.quiet and args.format == "text" and \
            not args.show_blocks and fast.CORE is not None:
        # Counts only: the compiled core's segment jobs on every core (or
        # the Dask cluster), else the core on one (a pipe, a dead worker).
        segs, min_seg = _knobs(FP.MIN_SEGMENT)
        try:
            c = jobs.count(path, offset, size, args.images, config, block,
                           args.jobs, resync=args.resync, segments=segs,
                           min_segment=min_seg, dask=args.dask)
            if c is None and data is None:
                data = jobs.read(P.Source(path, offset, size))
        except jobs.ExecutorError as e:
            raise CliError(f"decode: {e}") from None
        except OSError as e:
            raise CliError(f"--pt: cannot read {path}: {e.strerror}") from None
        except (fast.Unsupported, RuntimeError) as e:
            raise CliError(f"decode: {e}") from None
        if c is None:
            c = fast.count(data, jobs.load_image(args.images), config,
                           "block" if block else "insn", resync=args.resync)
        for e in c.error_items:
            sink.error(*e)
        sink.insns += c.insns
        sink.blocks += c.blocks
        sink.events += c.events
        return {}
    if getattr(args, "show_blocks", False) and stats:
        # Block numbers count from the trace start: sequential only.
        from hwtrace.flow import session
        from hwtrace.flow.block import BlockDecoder
        from hwtrace.flow.insn import InsnDecoder
        if data is None:
            data = jobs.read(P.Source(path, offset, size))
        image = jobs.load_image(args.images)
        if block:
            session.run_blocks(BlockDecoder(data, image, config), sink,
                               resync=args.resync)
        else:
            session.run_insn(InsnDecoder(data, image, config), sink,
                             resync=args.resync)
        return {}
    segs, min_seg = _knobs(P.MIN_SEGMENT)
    try:
        return jobs.decode(P.Source(path, offset, size), args.images, config,
                           sink, write, block=block, resync=args.resync,
                           jobs=args.jobs, dask=args.dask,
                           min_segment=min_seg, segments=segs)
    except (OSError, RuntimeError, ValueError) as e:
        raise CliError(f"decode: {e}") from None
