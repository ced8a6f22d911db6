"""hwtrace coverage: edge coverage of a trace, without listing instructions.

    hwtrace coverage --edges --pt T.pt --raw code.bin:0x400000 [--cpu F/M]
    hwtrace coverage --edges DIR [--stream cpu0.pt] [--bitmap map.bin]

Prints one line per edge -- ``FROM TO COUNT`` (hex addresses, decimal
count), sorted by address -- and a summary line ``edges: N, taken: T,
insns: I.``  (``--quiet``: the summary only).  An edge is an executed branch
instruction and the instruction executed after it (hwtrace.flow.fast
documents the exact rule and the bitmap hash).  ``--bitmap FILE`` also
writes an AFL-style map of ``--bitmap-size`` bytes (default 65536).

The compiled flow core computes the edges when it can decode the trace
exactly; otherwise the Python instruction decoder does (same result).  A
bundle's streams are opened through hwtrace.streams (images, CPU and
timing from the manifest; a CPU's stream that runs several processes
switches address spaces by the sideband and the trace's PIPs in the same
compiled decode, as ``decode DIR`` does).  Loss is said on stderr: decode
errors (the edges cover what could be decoded) and what the recorder
lost; a trace of which nothing could be decoded is an error (exit status
1).
"""

from __future__ import annotations

import os
import sys

from hwtrace.cli import CliError, help_of, warn
from hwtrace.cli.decode import _DEST, _ImageArg, _image as _load_images, \
    _timing_number


def register(sub) -> None:
    p = sub.add_parser("coverage", help=help_of("coverage"),
                       description=__doc__.splitlines()[0])
    p.add_argument("bundle", nargs="?", metavar="DIR",
                   help="a trace bundle (images from its sideband)")
    p.add_argument("--edges", action="store_true",
                   help="edge coverage (the only mode so far, and the default)")
    p.add_argument("--stream", action="append", default=[], metavar="NAME",
                   help="with DIR: only this stream (repeatable)")
    p.add_argument("--pt", metavar="FILE", help="the Intel PT trace")
    p.add_argument("--raw", action=_ImageArg, dest="images",
                   metavar="FILE[:FROM[-TO]]:ADDR")
    p.add_argument("--elf", action=_ImageArg, dest="images",
                   metavar="FILE[:BASE]")
    p.add_argument("--cpu", metavar="none|F/M[/S]")
    # The timing parameters `hwtrace images` prints with a stream's images
    # (a bundle's manifest gives them otherwise).
    for opt, dest in _DEST.items():
        p.add_argument(opt, dest=dest, metavar="N")
    p.add_argument("--bitmap", metavar="FILE",
                   help="write the AFL-style edge bitmap here")
    p.add_argument("--bitmap-size", type=int, default=1 << 16, metavar="N")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print the summary line only")
    # quick_exit: nothing to finalize after run (hwtrace.cli._exit)
    p.set_defaults(func=run, images=[], quick_exit=True)


_TIMING = ("mtc_freq", "nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx")


def _timing_args(args) -> dict:
    """The timing options given on the command line, by FlowConfig name."""
    out = {}
    for (opt, dest), key in zip(_DEST.items(), _TIMING):
        v = _timing_number(opt, dest, getattr(args, dest, None))
        if v is not None:
            out[key] = v
    return out


def _config(cpu_arg, timing=None):
    from hwtrace.flow.config import FlowConfig
    from hwtrace.pt import cpu as cpumod

    cfg = FlowConfig()
    if cpu_arg:
        try:
            cpu = cpumod.Cpu.parse(cpu_arg)
        except ValueError as e:
            raise CliError(f"--cpu: {e}") from None
        cfg.set_cpu(cpu)            # an unknown CPU: no workarounds
    for key, v in (timing or {}).items():
        setattr(cfg, key, v)
    return cfg


def _image(images):
    """The --raw/--elf images, loaded as ``hwtrace decode`` loads them."""
    from types import SimpleNamespace
    return _load_images(SimpleNamespace(images=images))


def _read(path: str, check: bool = True):
    """The trace, mapped in place (hwtrace.cli._tracemap), not copied;
    ``check``: refuse one with nothing to decode (not a bundle's stream)."""
    from hwtrace.cli._tracemap import check_trace, map_trace
    try:
        data = map_trace(path)
    except OSError as e:
        raise CliError(f"--pt: cannot read {path}: {e.strerror}") from None
    if check:
        check_trace(data, f"--pt: {path}")
    return data


def _streams(args):
    """(label, data, image, config, entry, stream) per trace to cover;
    ``stream``: the hwtrace.streams.Stream of one that switches address
    spaces (None otherwise)."""
    if not args.bundle:
        if not args.pt:
            raise CliError("coverage: no trace: use --pt FILE or a bundle DIR")
        return [(None, _read(args.pt), _image(args.images),
                 _config(args.cpu, _timing_args(args)), None, None)]
    if args.pt:
        raise CliError("coverage: give either a bundle DIR or --pt")
    from hwtrace.streams import StreamsError, flow_config, open_bundle
    timing = _timing_args(args)

    def config(options):
        cfg = flow_config({k: v for k, v in options.items()
                           if not (k == "cpu" and args.cpu)})
        if args.cpu:
            cfg = _config(args.cpu, timing)
        for k, v in timing.items():
            setattr(cfg, k, v)
        return cfg
    try:
        ts = open_bundle(args.bundle, only=args.stream, config=config, warn=warn)
        ts.report(warn)
        out = []
        for st in ts.streams:
            plan = st.plan
            switching = plan is not None and plan.timeline is not None and \
                len(plan.timeline.spaces()) > 1
            out.append((st.name, st.data(), st.image, st.config, st.entry,
                        st if switching else None))
    except StreamsError as e:
        raise CliError(f"coverage: {e}") from None
    return out


def _switched_edges(fast, data, image, cfg, stream):
    """The packed edges of a stream that switches address spaces by the
    sideband and the trace's PIPs: the flow core decodes it through the
    stream's switcher (as ``decode --quiet --stat DIR`` counts it), then
    says where the trace left the process ambiguous (what its batches
    would have said when they ended)."""
    from hwtrace.streams import StreamsError
    try:
        e = fast.packed_edges(data, image, cfg, wrap=stream.plan.wrap)
    except StreamsError as err:
        raise CliError(f"coverage: {err}") from None
    stream.report()
    return e


def _write_ascii(data: bytes) -> None:
    """ASCII lines onto stdout: straight into its binary buffer, after
    what its text layer holds, where that writes ASCII as itself (no str
    made of them and encoded back: python3's 2.4 MB of edges, ~2 ms and
    ~1,100 page faults); else (a StringIO, an encoding like UTF-16)
    through the text layer."""
    out = sys.stdout
    buf = getattr(out, "buffer", None)
    if buf is None or os.linesep != "\n" or not _ascii_as_is(out):
        out.write(data.decode("ascii"))
        return
    out.flush()
    buf.write(data)


def _ascii_as_is(out) -> bool:
    """Whether the text stream ``out`` encodes ASCII text as its bytes."""
    try:
        return "0 a\n".encode(out.encoding) == b"0 a\n"
    except (LookupError, TypeError):
        return False


def run(args) -> int:
    from hwtrace.flow import fast

    if args.bitmap_size <= 0:
        raise CliError("coverage: --bitmap-size must be positive")
    write = sys.stdout.write
    tables = []         # a packed edge table per stream (fast.PackedEdges)
    insns = errors = 0
    notes = []
    for label, data, image, cfg, entry, stream in _streams(args):
        if stream is not None:
            e = _switched_edges(fast, data, image, cfg, stream)
        else:
            e = fast.packed_edges(data, image, cfg)
        tables.append(e.table)
        n, err = e.insns, e.errors
        insns += n
        errors += err
        name = label or args.pt
        if err:
            notes.append(f"{name}: {err:,} decode error{'s' if err > 1 else ''}: "
                         f"the edges cover what could be decoded")
        if entry is not None and entry.lossy:
            notes.append(f"{name}: recorded with loss: {entry.loss()}")
    if not insns:
        why = (f"{errors:,} decode error{'s' if errors > 1 else ''}" if errors
               else notes[0] if notes else "no instructions in the trace: not a trace?")
        raise CliError(f"coverage: nothing could be decoded ({why})", 1)
    if len(tables) == 1:
        table = tables[0]
    else:               # the streams' edges added up
        total: dict = {}
        for t in tables:
            for k, c in fast.unpack_edges(t).items():
                total[k] = total.get(k, 0) + c
        table = fast.pack_edges(total)
    text, taken = fast.edge_text(table, not args.quiet, binary=True)
    if text:
        _write_ascii(text)
    write(f"edges: {len(table) // fast.EDGE_BYTES}, taken: {taken}, "
          f"insns: {insns}.\n")
    if args.bitmap:
        bm = fast.edge_bitmap(fast.unpack_edges(table), args.bitmap_size)
        try:
            with open(args.bitmap, "wb") as f:
                f.write(bm)
        except OSError as e:
            raise CliError(f"--bitmap: cannot write {args.bitmap}: "
                           f"{e.strerror}") from None
    sys.stdout.flush()
    for line in notes:
        sys.stderr.write(f"hwtrace coverage: {line}\n")
    return 0
