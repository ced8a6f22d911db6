"""``hwtrace decode DIR``: every stream of a bundle, each part of it in the
address space of the process that ran it.

The bundle is opened by :func:`hwtrace.streams.open_bundle` (streams,
decoder parameters from the manifest under the command line's, images
by the bundle's trust rules: the bundle's copies, ``--image-path``,
recorded paths that are ELF files with the recorded build-id, anything
with ``--allow-outside``; a mapped file that can't be found is a one-line
error naming it).  Thread-mode streams run in their process's space (a
new one after an exec); cpu-mode streams switch spaces as the sideband's
context switches (by time) and the trace's PIP packets (by CR3) say
(:mod:`hwtrace.flow.spaces`); each switch is an item of the batches, and
the listing's symbols and disassembly follow it.

Output: per stream a ``[stream NAME]`` line (jsonl: ``{"stream": NAME}``)
then the decode; when the space changes, ``[process PID (COMM)]`` (jsonl:
``{"process": PID, "comm": ..., "cr3": ..., "offset": ...}``), except with
``--quiet``.  ``--merge-time`` prints all streams' lines merged by time
stamp (the decoder's time when the line was decoded, never running back
within a stream), each tagged with its stream: ``[NAME] LINE`` (jsonl:
``"stream"`` and ``"time"`` keys first).  The merge goes through
temporary files, so memory stays small.

``--jobs N`` / ``--dask`` (not merged) decode the streams on workers and
print the same bytes (:mod:`hwtrace.cli._bundle_jobs`).

``--quiet --stat`` (text, not merged) prints counts and errors only: the
compiled flow core counts each stream, switching address spaces through
the same switcher (:func:`hwtrace.cli.decode.fast_counts`), and nothing
of the listing is loaded.
"""

from __future__ import annotations

import json

from hwtrace.cli import CliError, warn


def open_streams(args, only, cfg_lines: list):
    """The bundle ``args.bundle`` opened as the command line says
    (``only``: the streams to keep; the ``config error`` lines of its
    decoder parameters go to ``cfg_lines``)."""
    from hwtrace import streams
    from hwtrace.cli import decode as D

    def config(options):
        return D._config(args, cfg_lines.append, options)

    def extend(image):
        D._image(args, image)       # --raw/--elf on top of every space

    try:
        return streams.open_bundle(args.bundle, image_path=args.image_path,
                                   allow_outside=args.allow_outside,
                                   only=only, config=config,
                                   extend=extend if args.images else None)
    except streams.StreamsError as e:
        raise CliError(f"decode: {e}") from None


def run_bundle(args) -> int:
    from hwtrace.cli import decode as D

    if args.images:
        D._image(args)              # a bad --raw/--elf is an error now
    cfg_lines: list = []
    ts = open_streams(args, args.stream, cfg_lines)
    ts.report(warn)
    cfg_line = "".join(cfg_lines)
    out = D.Output()
    if (args.jobs != 1 or args.dask) and not args.merge_time:
        # streams, and PSB segments of one-process streams, on N workers
        from hwtrace.cli._bundle_jobs import run_parallel
        done = run_parallel(args, ts, cfg_line, out)
        if done is not None:
            return done
    counts_only = D.counts_only(args) and not args.merge_time
    fmt = ctx = None
    if not counts_only:
        fmt = D.listing_format(args)
        ctx = D.contexts(args, fmt)
    if args.merge_time:
        return _merged(args, ts, fmt, ctx, cfg_line, out)
    jsonl = args.format == "jsonl"
    for st in ts.streams:
        out.text('{"stream":%s}\n' % json.dumps(st.name) if jsonl
                 else f"[stream {st.name}]\n")
        out.text(cfg_line)
        counts = _fast_counts(args, st, out) if counts_only else None
        if counts is None:
            if fmt is None:         # counts without the compiled core
                fmt = D.listing_format(args)
                ctx = D.contexts(args, fmt)
            w = _decode(args, st, fmt, ctx, out)
            counts = (w.insns, w.blocks, w.events, w.errors)
        out.text(D.stats_text(args, counts[0], counts[1], st.entry.size,
                              counts[2], counts[3]))
        _warn_ambiguous(st, out)
    out.flush()
    return 0


def _warn_ambiguous(st, out) -> None:
    """After a stream's output (its stats lines included), what its decode
    found the trace does not tell (:meth:`hwtrace.streams.Stream.report`,
    the views' warning too).  The bundle is opened without a ``warn`` so
    that it comes here, after the counts of the compiled core too, and
    not when the stream's batches end.  And what its recorder lost (a
    listing that just ends where the buffer filled says nothing itself;
    the views and coverage say it)."""
    st.report(lambda text: (out.flush(), warn(text)))
    e = st.entry
    if e is not None and e.lossy:
        out.flush()
        warn(f"{st.name}: recorded with loss: {e.loss()}")


def _fast_counts(args, st, out):
    """A stream's counts by the compiled flow core, switching address
    spaces as the listing's walk does (None without the core)."""
    from hwtrace import streams
    from hwtrace.cli import decode as D
    try:
        return D.fast_counts(args, out, st.data(), st.image, st.config,
                             st.plan)
    except streams.StreamsError as e:
        raise CliError(f"decode: {e}") from None


def _decode(args, st, fmt, ctx, out, timed: bool = False):
    from hwtrace import streams
    from hwtrace.cli import decode as D
    try:
        return D.decode_stream(args, st, fmt, ctx, out, timed=timed)
    except streams.StreamsError as e:
        raise CliError(f"decode: {e}") from None


class _Spool:
    """One stream's output as (time, bytes) chunks in a temporary file."""

    def __init__(self, name: str, jsonl: bool):
        import tempfile         # --merge-time only
        self.f = tempfile.TemporaryFile("w+b")
        self.jsonl = jsonl
        tag = json.dumps(name)
        self.tag = (b'{"stream":' + tag.encode() + b',"time":') if jsonl \
            else f"[{name}] ".encode()

    def write(self, data: bytes, time: int = 0) -> None:
        if data:
            self.f.write(b"%020d %d\n" % (time, len(data)))
            self.f.write(data)

    def text(self, s: str, time: int = 0) -> None:
        self.write(s.encode(), time)

    def chunks(self):
        """(time, tagged lines) in the order written."""
        f = self.f
        f.seek(0)
        while True:
            head = f.readline()
            if not head:
                return
            t, n = head.split()
            yield int(t), self._tagged(f.read(int(n)), int(t))

    def _tagged(self, data: bytes, time: int) -> bytes:
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if not self.jsonl:
            return b"".join(self.tag + x + b"\n" for x in lines)
        pre = self.tag + b"%d" % time
        out = []
        for x in lines:
            body = x[1:] if x.startswith(b"{") else b"}"
            out.append(pre + (b"," if body != b"}" else b"") + body + b"\n")
        return b"".join(out)


class _Timed:
    """``out`` for decode_stream with --merge-time: pieces go to the spool
    with their time."""

    def __init__(self, spool: _Spool):
        self.write = spool.write


def _merged(args, ts, fmt, ctx, cfg_line: str, out) -> int:
    """Decode each stream into a temporary file of timed chunks, then
    merge them by time (ties: stream order; a stream's own order is kept,
    its times never run back)."""
    import heapq
    from hwtrace.cli import decode as D
    spools = []
    try:
        for st in ts.streams:
            sp = _Spool(st.name, args.format == "jsonl")
            spools.append(sp)
            sp.text(cfg_line, 0)
            w = _decode(args, st, fmt, ctx, _Timed(sp), timed=True)
            sp.text(D.stats_text(args, w.insns, w.blocks, st.entry.size,
                                 w.events, w.errors), w.time)
            _warn_ambiguous(st, out)
        for _t, data in heapq.merge(*(sp.chunks() for sp in spools),
                                    key=lambda x: x[0]):
            out.write(data)
    finally:
        for sp in spools:
            sp.f.close()
    out.flush()
    return 0
