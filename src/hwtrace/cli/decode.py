"""hwtrace decode: every executed instruction of a trace.

    hwtrace decode DIR [--stream NAME] [--lines] [--format jsonl]
    hwtrace decode --pt T.pt --elf prog[:BASE] [--cpu F/M] [--no-inst]
    hwtrace decode --pt T.pt --raw T.bin:0x1000 --format jsonl

Text output is an instruction listing: per instruction its address, the
function and offset it is in, its disassembly (capstone) and, with
``--lines``, its source file:line (DWARF); events, errors and statuses
are ptxed's bracketed lines (``[enabled]``, ``[OFFSET, IP: error:
MESSAGE]``).  ``--no-inst`` prints addresses only, exactly as ptxed
``--no-inst`` does.  ``--format jsonl`` prints one JSON object per
instruction, event, status or error (ptoracle's ``insn`` schema).

A bundle DIR decodes every stream, each part of a cpu-mode stream in the
address space of the process that ran it (see
hwtrace.cli._decode_bundle).  Decode errors are reported in the output
and decoding goes on; unreadable input is a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from hwtrace.cli import CliError, help_of


class _ImageArg(argparse.Action):
    """--raw/--elf/--pagedump in command-line order (later ones win)."""

    def __call__(self, parser, ns, values, option_string=None):
        items = list(getattr(ns, "images", None) or [])
        items.append((option_string.lstrip("-"), values))
        ns.images = items


USAGE = """hwtrace decode DIR [options]
       hwtrace decode --pt FILE (--elf FILE[:BASE] | --raw FILE:ADDR)... [options]"""

DESCRIPTION = """\
Print every executed instruction of a trace: its address, the function
and offset it is in, its disassembly and, with --lines, its source
file:line.  Events, errors and statuses are ptxed's bracketed lines
([enabled], [OFFSET, IP: error: MESSAGE]).  --no-inst prints addresses
only, exactly as ptxed --no-inst does; --format jsonl prints one JSON
object per instruction, event, status or error (ptoracle's insn schema).

A bundle DIR (what hwtrace record writes) decodes every stream, each part
of it in the address space of the process that ran it: a [stream NAME]
line starts each stream, a [process PID (COMM)] line each process."""

EPILOG = """\
examples:
  hwtrace decode rec/ | less            the listing of every stream
  hwtrace decode rec/ --lines           ... with source lines (build with -g)
  hwtrace decode rec/ --quiet --stat    instruction counts only
  hwtrace decode rec/ --jobs 0 > l.txt  ... on every core (the same bytes)
  hwtrace decode rec/ --format jsonl --annotate
  hwtrace decode --pt t.pt --elf prog --no-inst     ptxed's output"""


def register(sub) -> None:
    p = sub.add_parser(
        "decode", help=help_of("decode"),
        usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _input_options(p)
    _output_options(p)
    _decoder_options(p)
    _config_options(p)
    p.set_defaults(func=run, images=[], decoder=None)


def _input_options(p) -> None:
    g = p.add_argument_group("input: a bundle")
    g.add_argument("bundle", nargs="?", metavar="DIR",
                   help="a trace bundle: decode its streams (images from "
                        "its sideband, decoder parameters from its "
                        "manifest)")
    g.add_argument("--stream", action="append", default=[], metavar="NAME",
                   help="decode only this stream of DIR (repeatable)")
    g.add_argument("--image-path", action="append", default=[],
                   metavar="DIR",
                   help="also look for DIR's mapped files here, by file "
                        "name (repeatable)")
    g.add_argument("--allow-outside", action="store_true",
                   help="use any file DIR's sideband names on this "
                        "machine, even without a matching build-id "
                        "(trusted bundles only)")
    g.add_argument("--merge-time", action="store_true",
                   help="print all of DIR's streams merged by time stamp, "
                        "each line tagged with its stream")
    g = p.add_argument_group(
        "input: a raw trace, as ptxed (with DIR: code for every process)")
    g.add_argument("--pt", metavar="FILE[:FROM[-TO]]",
                   help="the Intel PT trace (bytes FROM to TO of FILE)")
    g.add_argument("--raw", action=_ImageArg, dest="images",
                   metavar="FILE[:FROM[-TO]]:ADDR",
                   help="load bytes FROM to TO of FILE at address ADDR "
                        "(an ELF file's symbols are used too)")
    g.add_argument("--elf", action=_ImageArg, dest="images",
                   metavar="FILE[:BASE]",
                   help="load an ELF file's PT_LOAD segments (its lowest "
                        "at BASE if given) and its symbols")
    g.add_argument("--pagedump", action=_ImageArg, dest="images",
                   metavar="ADDRS:PAGES",
                   help="load a page dump: ADDRS holds little-endian u64 "
                        "page addresses, PAGES the 4 KiB pages in order")


def _output_options(p) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=("text", "jsonl"), default="text",
                   help="text: the instruction listing (default); jsonl: "
                        "one JSON object per instruction, event, status or "
                        "error (ptoracle's insn schema)")
    g.add_argument("--no-inst", action="store_true",
                   help="text: addresses only, no function or disassembly "
                        "(ptxed --no-inst's exact output)")
    g.add_argument("--lines", action="store_true",
                   help="add each instruction's source file:line (from "
                        "DWARF: build with -g)")
    g.add_argument("--att", action="store_true",
                   help="disassemble in AT&T syntax (default: Intel)")
    g.add_argument("--annotate", action="store_true",
                   help="jsonl: add \"function\", \"function_offset\" and "
                        "\"disasm\" (with --lines \"file\", \"line\") to "
                        "each instruction")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="print no instructions or events (errors, "
                        "statistics and stream names only)")
    g.add_argument("--offset", action="store_true",
                   help="print the trace offset of each instruction and "
                        "event (ptxed --print-offset)")
    g.add_argument("--stat", action="store_true",
                   help="print the number of instructions (and blocks) "
                        "at the end of each stream")
    g.add_argument("--stat:insn", dest="stat_insn", action="store_true",
                   help="--stat: the instruction count only")
    g.add_argument("--stat:blocks", dest="stat_blocks", action="store_true",
                   help="--stat: the block count only (block decoder; "
                        "blocks as libipt cuts them with a warm block "
                        "cache, see README \"Block counts\")")
    g.add_argument("--event:ip", dest="event_ip", action="store_true",
                   help="text: print the IP of events that have one")
    g.add_argument("--event:time", dest="event_time", action="store_true",
                   help="text: print the time stamp (TSC) of events")
    g.add_argument("--block:show-blocks", dest="show_blocks",
                   action="store_true",
                   help="text, block decoder: a [block] line before each "
                        "block's instructions (numbered with --stat)")
    g.add_argument("--check", action="store_true",
                   help="accepted for ptxed compatibility (no effect)")


def _decoder_options(p) -> None:
    g = p.add_argument_group("decoder (libipt's, as ptxed's options)")
    g.add_argument("--insn-decoder", dest="decoder", action="store_const",
                   const="insn",
                   help="use the instruction decoder (pt_insn)")
    g.add_argument("--block-decoder", dest="decoder", action="store_const",
                   const="block",
                   help="use the block decoder (pt_blk; the default)")
    g.add_argument("--block:end-on-call", dest="end_on_call",
                   action="store_true",
                   help="block decoder: end a block after every call")
    g.add_argument("--block:end-on-jump", dest="end_on_jump",
                   action="store_true",
                   help="block decoder: end a block after every jump")
    g.add_argument("--resync-on-error", dest="resync", action="store_true",
                   help="after an error, go on right after it (libipt's "
                        "pt_*_resync) instead of at the next PSB")
    g.add_argument("--strict", action="store_true",
                   help="libipt 2.3's strict reading: report the PSB+ "
                        "status updates real CPUs write at VM entries as "
                        "errors instead of decoding on (see README, "
                        "\"lossless by default\")")
    g.add_argument("--error-offsets", choices=("2.3", "2.0"), default="2.3",
                   help="report errors at the trace offset libipt 2.3 "
                        "gives (default) or libipt 2.0 gives (to compare "
                        "with Debian's libipt 2.0.5)")
    g.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="decode on N processes (0: all cores): DIR's "
                        "streams (a one-process stream's PSB segments "
                        "where that pays), a raw trace's PSB segments; "
                        "the output is the sequential one (--merge-time: "
                        "sequential)")
    g.add_argument("--dask", metavar="SCHEDULER_ADDRESS",
                   help="as --jobs, on this Dask cluster (the bundle, or "
                        "the trace and images, at the same paths on its "
                        "workers)")


def _config_options(p) -> None:
    g = p.add_argument_group(
        "processor (a bundle's manifest gives these unless set here)")
    g.add_argument("--cpu", metavar="none|F/M[/S]",
                   help="the CPU that recorded the trace, family/model"
                        "[/stepping] (selects erratum workarounds)")
    g.add_argument("--mtc-freq", metavar="N",
                   help="IA32_RTIT_CTL.MTCFreq the trace was recorded with")
    g.add_argument("--nom-freq", metavar="N",
                   help="the nominal frequency (MSR_PLATFORM_INFO[15:8], "
                        "the TSC's ratio to the bus clock)")
    g.add_argument("--cpuid-0x15.eax", dest="cpuid_eax", metavar="N",
                   help="CPUID leaf 0x15 EAX (TSC/core crystal clock ratio "
                        "denominator)")
    g.add_argument("--cpuid-0x15.ebx", dest="cpuid_ebx", metavar="N",
                   help="CPUID leaf 0x15 EBX (the ratio's numerator)")
    g.add_argument("--event:tick", dest="event_tick", action="store_true",
                   help="report timing packets as tick events")
    g.add_argument("--event:iflags", dest="event_iflags",
                   action="store_true",
                   help="report changes of the interrupt flag (event "
                        "trace)")
    g.add_argument("--insn:keep-tcal-on-ovf", dest="keep_tcal",
                   action="store_true",
                   help="instruction decoder: keep the timing calibration "
                        "across an overflow")
    g.add_argument("--block:keep-tcal-on-ovf", dest="keep_tcal_block",
                   action="store_true",
                   help="block decoder: keep the timing calibration across "
                        "an overflow")
    g = p.add_argument_group(
        "address filters the trace was recorded with (IA32_RTIT_CTL."
        "ADDRn_CFG, IA32_RTIT_ADDRn_A/B; n = 0..3)")
    for n in range(4):
        g.add_argument(f"--filter:addr{n}_cfg", dest=f"filter_{n}_cfg",
                       metavar="N",
                       help=f"ADDR{n}_CFG: 1 trace only in range {n}, 2 "
                            f"stop tracing there")
        g.add_argument(f"--filter:addr{n}_a", dest=f"filter_{n}_a",
                       metavar="ADDR", help=f"range {n}: first address")
        g.add_argument(f"--filter:addr{n}_b", dest=f"filter_{n}_b",
                       metavar="ADDR", help=f"range {n}: last address")


def _number(opt: str, text) -> int | None:
    from hwtrace.flow.loaders import parse_c_number
    if text is None:
        return None
    n = parse_c_number(text)
    if n is None:
        raise CliError(f"{opt}: bad argument: {text}")
    return n


_DEST = {"--mtc-freq": "mtc_freq", "--nom-freq": "nom_freq",
         "--cpuid-0x15.eax": "cpuid_eax", "--cpuid-0x15.ebx": "cpuid_ebx"}
#: the widths ptxed reads them in (and ``dump`` checks): 8 bits, 32 bits
_LIMIT = {"mtc_freq": 0xff, "nom_freq": 0xff,
          "cpuid_eax": 0xffffffff, "cpuid_ebx": 0xffffffff}
_MANIFEST_KEY = {"mtc_freq": "mtc_freq", "nom_freq": "nom_freq",
                 "cpuid_eax": "cpuid_0x15_eax", "cpuid_ebx": "cpuid_0x15_ebx"}


def _timing_number(opt: str, dest: str, text) -> int | None:
    """A timing option's value, checked against its field's width."""
    v = _number(opt, text)
    if v is not None and v > _LIMIT[dest]:
        raise CliError(f"{opt}: value too big: {text}")
    return v


def _config(args, out, options=None):
    """The FlowConfig of the options (``options``: a bundle manifest's,
    :func:`hwtrace.streams.manifest_options`, for what the command line
    leaves out).  An unknown CPU is a ``config error`` line through
    ``out``, as ptxed prints it."""
    from hwtrace.flow.config import FlowConfig
    from hwtrace.pt import cpu as cpumod

    options = options or {}
    cfg = FlowConfig()
    cpu_arg = args.cpu or options.get("cpu")
    if cpu_arg:
        try:
            cpu = cpumod.Cpu.parse(cpu_arg)
        except ValueError as e:
            raise CliError(f"--cpu: {e}") from None
        unknown = cfg.set_cpu(cpu)
        if unknown is not None:
            out(config_error_line(args.format, unknown.code))
    for n in range(4):
        v = _number(f"--filter:addr{n}_cfg", getattr(args, f"filter_{n}_cfg"))
        if v is not None:
            if v > 15:
                raise CliError(f"--filter:addr{n}_cfg: value too big: {v}")
            cfg.addr_filter.addr_cfg |= v << (4 * n)
        a = _number(f"--filter:addr{n}_a", getattr(args, f"filter_{n}_a"))
        if a is not None:
            cfg.addr_filter.a[n] = a
        b = _number(f"--filter:addr{n}_b", getattr(args, f"filter_{n}_b"))
        if b is not None:
            cfg.addr_filter.b[n] = b
    for opt, dest in _DEST.items():
        v = _timing_number(opt, dest, getattr(args, dest))
        if v is None:
            v = options.get(_MANIFEST_KEY[dest])
        setattr(cfg, _MANIFEST_KEY[dest], v or 0)
    cfg.enable_tick_events = args.event_tick
    cfg.enable_iflags_events = args.event_iflags
    block = args.decoder != "insn"
    cfg.keep_tcal_on_ovf = args.keep_tcal_block if block else args.keep_tcal
    cfg.end_on_call = args.end_on_call
    cfg.error_offsets = args.error_offsets
    cfg.end_on_jump = args.end_on_jump
    cfg.strict = args.strict
    return cfg


def config_error_line(fmt: str, code: str) -> str:
    if fmt == "jsonl":
        return '{"error":"%s","kind":"config error","offset":0,"ip":0}\n' \
            % code
    return f"[0, 0: config error: {code}]\n"


def _image(args, image=None):
    """The --raw/--elf/--pagedump images (loaded into ``image`` if given)."""
    from hwtrace.flow.image import Image, ImageError
    from hwtrace.flow.loaders import load_elf, load_pagedump, load_raw

    image = Image() if image is None else image
    for kind, arg in args.images:
        try:
            if kind == "raw":
                load_raw(image, arg)
            elif kind == "elf":
                load_elf(image, arg)
            else:
                addrs, sep, pages = arg.rpartition(":")
                if not sep:
                    raise ImageError("--pagedump needs ADDRS:PAGES")
                load_pagedump(image, addrs, pages)
        except ImageError as e:
            raise CliError(f"--{kind}: failed to load '{arg}': {e}") from None
    return image


def _trace(arg: str):
    """The --pt trace, mapped rather than read (a read-only mmap or a
    memoryview of one; bytes for a pipe): see hwtrace.cli._tracemap.  One
    with nothing to decode (empty, no PSB) is a one-line error there."""
    from hwtrace.cli._tracemap import check_trace, map_trace
    from hwtrace.flow.image import ImageError
    from hwtrace.flow.loaders import split_range

    try:
        path, offset, size = split_range(arg)
    except ImageError as e:
        raise CliError(f"--pt: {e}") from None
    try:
        data = map_trace(path, offset, size)
    except OSError as e:
        raise CliError(f"--pt: cannot read {path}: "
                       f"{e.strerror or e}") from None
    except ValueError as e:     # an offset past what mmap can address
        raise CliError(f"--pt: bad range in {arg}: {e}") from None
    if size is not None and len(data) < size:
        raise CliError(f"--pt: bad range in {arg}")
    check_trace(data, f"--pt: {arg}")
    return data


def run(args) -> int:
    if args.jobs < 0:       # a bundle's too (hwtrace.cli._bundle_jobs)
        raise CliError(f"--jobs: bad argument: {args.jobs}")
    if args.bundle:
        if args.pt:
            raise CliError("decode: give either a bundle DIR or --pt")
        from hwtrace.cli._decode_bundle import run_bundle
        return run_bundle(args)
    if args.image_path or args.allow_outside or args.merge_time:
        raise CliError("decode: --image-path, --allow-outside and "
                       "--merge-time need a bundle DIR")
    return _run_one(args)


# -- what to print ---------------------------------------------------------------

def annotated(args) -> bool:
    """Whether instructions get function, disassembly (and lines)."""
    if args.format == "jsonl":
        return args.annotate
    return not args.no_inst and not args.quiet


def listing_format(args):
    """The :mod:`hwtrace.listing` format the options ask for."""
    from hwtrace.listing.jsonl import JsonFormat
    from hwtrace.listing.text import TextFormat
    stats = args.stat or args.stat_insn or args.stat_blocks
    if annotated(args):
        from hwtrace.listing import disasm
        if not disasm.available():
            raise CliError("decode: disassembly needs capstone (pip install "
                           "capstone); --no-inst prints addresses only")
    if args.format == "jsonl":
        return JsonFormat(print_offset=args.offset, quiet=args.quiet,
                          annotate=args.annotate, lines=args.lines)
    if args.quiet:
        return TextFormat(quiet=True)
    return TextFormat(event_ip=args.event_ip, event_time=args.event_time,
                      print_offset=args.offset, show_blocks=args.show_blocks,
                      block_ids=stats, annotate=annotated(args),
                      lines=args.lines)


def contexts(args, fmt):
    from hwtrace.listing.contexts import Contexts
    return Contexts(fmt, annotate=annotated(args), lines=args.lines,
                    syntax="att" if args.att else "intel",
                    images=args.images)


def stats_text(args, insns: int, blocks: int, nbytes: int, events: int,
               errors: int) -> str:
    """The --stat lines after a stream ("" without --stat)."""
    if not (args.stat or args.stat_insn or args.stat_blocks):
        return ""
    if args.format == "jsonl":
        import json
        return json.dumps({"summary": "insn", "bytes": nbytes,
                           "insns": insns, "events": events,
                           "errors": errors}, separators=(",", ":")) + "\n"
    from hwtrace.flow import ptxed
    want_insn = args.stat_insn or not args.stat_blocks
    want_blocks = args.stat_blocks or not args.stat_insn
    lines = ptxed.stats_lines(insns if want_insn else None,
                              blocks if (want_blocks and
                                         args.decoder != "insn") else None)
    return "".join(line + "\n" for line in lines)


class Output:
    """Where a decode's bytes go: stdout's binary buffer (the text layer
    flushed first), or a text ``write`` callable (tests, in-process)."""

    def __init__(self, write=None):
        buf = getattr(sys.stdout, "buffer", None) if write is None else None
        if buf is not None:
            sys.stdout.flush()
            self.write = buf.write
            self._flush = buf.flush
        else:
            text = write or sys.stdout.write
            self.write = lambda data: text(data.decode())
            self._flush = getattr(sys.stdout, "flush", lambda: None)

    def text(self, s: str) -> None:
        if s:
            self.write(s.encode())

    def flush(self) -> None:
        self._flush()


def decode_stream(args, stream, fmt, ctx, out, *, data=None,
                  timed: bool = False):
    """Print one stream's decode through ``out`` (``out.write(bytes)``,
    or with ``timed`` ``out.write(bytes, time)``); returns the walker (its
    counts)."""
    from hwtrace.flow import batches as B
    from hwtrace.listing.walk import Walker
    block = args.decoder != "insn"
    w = Walker(fmt, out.write,
               lambda space: ctx.for_space(space, stream.image),
               block=block, timed=timed)
    impl = None
    if stream.plan is not None and not B.reports_switches():
        # said, not silent: the bench fails on it where it should not be
        sys.stderr.write("hwtrace: warning: the compiled core does not "
                         "report address-space switches yet: this bundle "
                         "decodes with the Python decoders\n")
        impl = "python"
    switched = []
    for b in stream.batches("block" if block else "insn",
                            want_insns=fmt.lines, resync=args.resync,
                            data=data, space_items=True, impl=impl,
                            on_switch=lambda sp, off: switched.append(off)):
        w.batch(b)
    if len(switched) != w.switches:
        # a producer that switches spaces without saying where would
        # print one process's code as another's
        raise RuntimeError(f"{stream.name}: the batches report "
                           f"{w.switches} of {len(switched)} address-space "
                           f"switches")
    return w


def _run_one(args, write=None) -> int:
    """Decode ``args.pt`` (``write``: a text writer instead of stdout)."""
    if not args.pt:
        raise CliError("decode: no trace: use --pt FILE or a bundle DIR")
    out = Output(write)
    cfg = _config(args, out.text)
    image = _image(args)
    data = _trace(args.pt)
    parallel = args.jobs != 1 or args.dask
    counts = None
    if counts_only(args) and not parallel:
        counts = fast_counts(args, out, data, image, cfg)
    if counts is None:
        counts = _listing(args, out, data, image, cfg, parallel)
    out.text(stats_text(args, counts[0], counts[1], len(data), counts[2],
                        counts[3]))
    out.flush()
    return 0


def counts_only(args) -> bool:
    """Whether the output is the --stat lines and the error lines only
    (--quiet text): what the compiled flow core's counts give, without a
    listing."""
    return bool(args.stat or args.stat_insn or args.stat_blocks) and \
        args.quiet and args.format == "text" and not args.show_blocks


def fast_counts(args, out, data, image, cfg, plan=None):
    """``(insns, blocks, events, errors)`` of a :func:`counts_only` decode
    by the compiled flow core (hwtrace.flow.fast; ``plan``: a bundle
    stream's address-space switching, hwtrace.flow.spaces.SpacePlan), its
    error lines written through ``out`` as the listing writes them; None
    without the core (nothing written: the listing's walk decodes it)."""
    from hwtrace.flow import fast, sinks
    sink = sinks.PtxedSink(out.text, quiet=True)
    if not fast.count_into(sink, data, image, cfg, args.decoder != "insn",
                           args.resync,
                           plan.wrap if plan is not None else None):
        return None
    return sink.insns, sink.blocks, sink.events, sink.errors


def _listing(args, out, data, image, cfg, parallel) -> tuple:
    """Decode ``args.pt`` into its listing (the walk over batches, or with
    --jobs/--dask the parallel decoder into a session sink); returns
    ``(insns, blocks, events, errors)``."""
    from hwtrace.flow import sinks

    fmt = listing_format(args)
    use_block = args.decoder != "insn"
    stats = args.stat or args.stat_insn or args.stat_blocks
    if parallel:
        from hwtrace.cli._parallel import decode_args
        from hwtrace.listing.single import InsnNotes
        notes = None
        if annotated(args):
            notes = InsnNotes(args.images, args.format, lines=args.lines,
                              syntax="att" if args.att else "intel")
        if args.format == "jsonl":
            sink = sinks.JsonSink(out.text, print_offset=args.offset,
                                  notes=notes)
        elif args.quiet and not args.show_blocks:
            sink = sinks.PtxedSink(out.text, quiet=True)
        else:
            sink = sinks.PtxedSink(out.text, quiet=args.quiet,
                                   event_ip=args.event_ip,
                                   event_time=args.event_time,
                                   print_offset=args.offset,
                                   show_blocks=args.show_blocks,
                                   block_ids=stats, notes=notes)
        decode_args(args, cfg, sink, out.text, block=use_block, data=data)
        counts = (sink.insns, sink.blocks, sink.events, sink.errors)
    else:
        from hwtrace import streams
        from hwtrace.flow.loaders import split_range
        path, offset, size = split_range(args.pt)
        try:
            ts = streams.open_trace(path, image, cfg, offset=offset,
                                    length=size)
        except streams.StreamsError as e:
            raise CliError(f"--pt: {e}") from None
        w = decode_stream(args, ts.streams[0], fmt, contexts(args, fmt), out,
                          data=data)
        counts = (w.insns, w.blocks, w.events, w.errors)
    return counts
