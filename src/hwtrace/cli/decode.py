"""hwtrace decode: the executed instructions of a trace (ptxed-compatible).

    hwtrace decode --pt T.pt --raw T.bin:0x1000 [--cpu F/M] [--no-inst]
    hwtrace decode --pt T.pt --elf prog[:BASE] --format jsonl

    hwtrace decode DIR [--stream NAME] [--image-path D] [--merge-time]

A bundle DIR decodes every stream; each part of a cpu-mode stream in the
address space of the process that ran it (sideband context switches, PIP;
see hwtrace.cli._decode_bundle and hwtrace.flow.spaces).

Prints ptxed's text by default (instruction addresses, ``[event]`` lines,
``[offset, ip: error: message]`` lines) or, with ``--format jsonl``, one
JSON object per instruction, event, status or error (ptoracle's ``insn``
schema).  Decode errors are reported in the output and decoding goes on;
unreadable files are a one-line error with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from hwtrace.cli import CliError


class _ImageArg(argparse.Action):
    """--raw/--elf/--pagedump in command-line order (later ones win)."""

    def __call__(self, parser, ns, values, option_string=None):
        items = list(getattr(ns, "images", None) or [])
        items.append((option_string.lstrip("-"), values))
        ns.images = items


def register(sub) -> None:
    p = sub.add_parser("decode", help="decode the executed instructions "
                       "(ptxed-compatible)",
                       description=__doc__.splitlines()[0])
    p.add_argument("bundle", nargs="?", metavar="DIR",
                   help="a trace bundle: decode its streams (images from "
                        "its sideband, decoder parameters from its manifest)")
    p.add_argument("--stream", action="append", default=[], metavar="NAME",
                   help="with DIR: decode only this stream (repeatable)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="with DIR: also look for the mapped files here (by "
                        "file name; repeatable)")
    p.add_argument("--allow-outside", action="store_true",
                   help="with DIR: use any file the sideband names on this "
                        "machine, even without a matching build-id (trusted "
                        "bundles only)")
    p.add_argument("--merge-time", action="store_true",
                   help="with DIR: print all streams' items merged by time "
                        "stamp, each line tagged with its stream")
    p.add_argument("--pt", metavar="FILE[:FROM[-TO]]",
                   help="the Intel PT trace")
    p.add_argument("--raw", action=_ImageArg, dest="images",
                   metavar="FILE[:FROM[-TO]]:ADDR",
                   help="load raw bytes of FILE at ADDR")
    p.add_argument("--elf", action=_ImageArg, dest="images",
                   metavar="FILE[:BASE]", help="load an ELF's PT_LOAD segments")
    p.add_argument("--pagedump", action=_ImageArg, dest="images",
                   metavar="ADDRS:PAGES",
                   help="load a page dump (u64 page addresses, 4 KiB pages)")
    p.add_argument("--cpu", metavar="none|F/M[/S]",
                   help="decode for this CPU (selects erratum workarounds)")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--no-inst", action="store_true",
                   help="print addresses only (the only text mode so far)")
    p.add_argument("--check", action="store_true",
                   help="accepted for ptxed compatibility")
    p.add_argument("--quiet", "-q", action="store_true")
    p.add_argument("--offset", action="store_true",
                   help="print the trace offset of each item")
    p.add_argument("--stat", action="store_true", help="print statistics")
    p.add_argument("--stat:insn", dest="stat_insn", action="store_true")
    p.add_argument("--stat:blocks", dest="stat_blocks", action="store_true")
    p.add_argument("--insn-decoder", dest="decoder", action="store_const",
                   const="insn")
    p.add_argument("--block-decoder", dest="decoder", action="store_const",
                   const="block")
    p.add_argument("--block:show-blocks", dest="show_blocks",
                   action="store_true")
    p.add_argument("--block:end-on-call", dest="end_on_call",
                   action="store_true")
    p.add_argument("--block:end-on-jump", dest="end_on_jump",
                   action="store_true")
    p.add_argument("--event:ip", dest="event_ip", action="store_true")
    p.add_argument("--event:iflags", dest="event_iflags", action="store_true")
    p.add_argument("--event:tick", dest="event_tick", action="store_true")
    p.add_argument("--event:time", dest="event_time", action="store_true")
    p.add_argument("--resync-on-error", dest="resync", action="store_true")
    p.add_argument("--strict", action="store_true",
                   help="libipt 2.3's strict reading: report the PSB+ "
                        "status updates real CPUs write at VM entries as "
                        "errors instead of decoding on (see README, "
                        "\"lossless by default\")")
    p.add_argument("--error-offsets", choices=("2.3", "2.0"), default="2.3",
                   help="report errors at the trace offset libipt 2.3 gives "
                        "(default) or libipt 2.0 gives (to compare with "
                        "Debian's libipt 2.0.5)")
    for n in range(4):
        for which in ("cfg", "a", "b"):
            p.add_argument(f"--filter:addr{n}_{which}",
                           dest=f"filter_{n}_{which}", metavar="N")
    p.add_argument("--mtc-freq", metavar="N")
    p.add_argument("--nom-freq", metavar="N")
    p.add_argument("--cpuid-0x15.eax", dest="cpuid_eax", metavar="N")
    p.add_argument("--cpuid-0x15.ebx", dest="cpuid_ebx", metavar="N")
    p.add_argument("--insn:keep-tcal-on-ovf", dest="keep_tcal",
                   action="store_true")
    p.add_argument("--block:keep-tcal-on-ovf", dest="keep_tcal_block",
                   action="store_true")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="decode PSB segments on N processes (0: all "
                        "cores); the output is the sequential one")
    p.add_argument("--dask", metavar="SCHEDULER_ADDRESS",
                   help="decode PSB segments on this Dask cluster (trace "
                        "and images at the same paths on its workers)")
    p.set_defaults(func=run, images=[], decoder=None)


def _number(opt: str, text) -> int | None:
    from hwtrace.flow.loaders import parse_c_number
    if text is None:
        return None
    n = parse_c_number(text)
    if n is None:
        raise CliError(f"{opt}: bad argument: {text}")
    return n


def _config(args, out):
    from hwtrace.flow.config import Errata, FlowConfig
    from hwtrace.pt import cpu as cpumod
    from hwtrace.pt.errors import PtError

    cfg = FlowConfig()
    if args.cpu:
        try:
            cpu = cpumod.Cpu.parse(args.cpu)
        except ValueError as e:
            raise CliError(f"--cpu: {e}") from None
        cfg.cpu = cpu
        if cpu is not None:
            errata = cpumod.errata(cpu)
            if isinstance(errata, PtError):
                if args.format == "jsonl":
                    out('{"error":"%s","kind":"config error","offset":0,'
                        '"ip":0}\n' % errata.code)
                else:
                    out(f"[0, 0: config error: {errata.code}]\n")
            else:
                cfg.errata = Errata.from_flags(errata)
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
    cfg.mtc_freq = _number("--mtc-freq", args.mtc_freq) or 0
    cfg.nom_freq = _number("--nom-freq", args.nom_freq) or 0
    cfg.cpuid_0x15_eax = _number("--cpuid-0x15.eax", args.cpuid_eax) or 0
    cfg.cpuid_0x15_ebx = _number("--cpuid-0x15.ebx", args.cpuid_ebx) or 0
    cfg.enable_tick_events = args.event_tick
    cfg.enable_iflags_events = args.event_iflags
    block = args.decoder != "insn"
    cfg.keep_tcal_on_ovf = args.keep_tcal_block if block else args.keep_tcal
    cfg.end_on_call = args.end_on_call
    cfg.error_offsets = args.error_offsets
    cfg.strict = args.strict
    cfg.end_on_jump = args.end_on_jump
    return cfg


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


def _trace(arg: str, check: bool = True):
    """The --pt trace, mapped rather than read (a read-only mmap or a
    memoryview of one; bytes for a pipe): see hwtrace.cli._tracemap.
    ``check``: refuse one with nothing to decode (a bundle's streams are
    not refused: an idle CPU's may be empty)."""
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
    if check:
        check_trace(data, f"--pt: {arg}")
    return data


def _bundle_streams(args):
    """(Bundle, [(StreamInfo, path)], extra argv: the manifest's decoder
    parameters the command line didn't give) for the streams to decode."""
    from hwtrace.bundle import Bundle, BundleError

    try:
        b = Bundle(args.bundle, image_path=args.image_path,
                   allow_outside=args.allow_outside)
        infos = {s.file: s for s in b.streams}
        streams = list(infos)
        if args.stream:
            missing = [s for s in args.stream if s not in infos]
            if missing:
                raise CliError(f"decode: no stream {missing[0]!r} in "
                               f"{args.bundle}")
            streams = args.stream
        paths = {}
        for name in streams:
            paths[name] = b.stream_path(infos[name])   # refuses a symbolic link
            b.open_stream(infos[name]).close()         # a regular file of its size
    except BundleError as e:
        raise CliError(f"decode: {args.bundle}: {e}") from None
    manifest = b.manifest
    extra = []
    cpu = manifest.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    fam, mod = cpu.get("family"), cpu.get("model", 0)
    if fam and not args.cpu and all(type(v) is int and 0 <= v < 256 for v in (fam, mod)):
        extra += ["--cpu", f"{fam}/{mod}"]
    for key, opt in (("mtc_freq", "--mtc-freq"), ("nom_freq", "--nom-freq"),
                     ("cpuid_0x15_eax", "--cpuid-0x15.eax"),
                     ("cpuid_0x15_ebx", "--cpuid-0x15.ebx")):
        if manifest.get(key) and getattr(args, _DEST[opt]) is None:
            extra += [opt, str(manifest[key])]
    return b, [(infos[n], str(paths[n])) for n in streams], extra


_DEST = {"--mtc-freq": "mtc_freq", "--nom-freq": "nom_freq",
         "--cpuid-0x15.eax": "cpuid_eax", "--cpuid-0x15.ebx": "cpuid_ebx"}


def run(args) -> int:
    if args.bundle:
        if args.pt:
            raise CliError("decode: give either a bundle DIR or --pt")
        from hwtrace.cli._decode_bundle import run_bundle
        return run_bundle(args)
    if args.image_path or args.allow_outside or args.merge_time:
        raise CliError("decode: --image-path, --allow-outside and "
                       "--merge-time need a bundle DIR")
    return _run_one(args)


def _parser_of(args):
    from hwtrace.cli import Parser
    sub = Parser(prog="hwtrace decode").add_subparsers(parser_class=Parser)
    register(sub)
    return sub.choices["decode"]


def _argv_of(args) -> list[str]:
    """The options of ``args`` again as a command line (for one stream)."""
    argv = []
    for kind, arg in args.images:
        argv += [f"--{kind}", arg]
    if args.cpu:
        argv += ["--cpu", args.cpu]
    argv += ["--format", args.format, "--error-offsets", args.error_offsets]
    flags = {"no_inst": "--no-inst", "check": "--check", "quiet": "--quiet",
             "offset": "--offset", "stat": "--stat",
             "stat_insn": "--stat:insn", "stat_blocks": "--stat:blocks",
             "show_blocks": "--block:show-blocks",
             "end_on_call": "--block:end-on-call",
             "end_on_jump": "--block:end-on-jump", "event_ip": "--event:ip",
             "event_iflags": "--event:iflags", "event_tick": "--event:tick",
             "event_time": "--event:time", "resync": "--resync-on-error",
             "strict": "--strict",
             "keep_tcal": "--insn:keep-tcal-on-ovf",
             "keep_tcal_block": "--block:keep-tcal-on-ovf"}
    for dest, opt in flags.items():
        if getattr(args, dest):
            argv.append(opt)
    if args.decoder:
        argv.append(f"--{args.decoder}-decoder")
    for n in range(4):
        for which in ("cfg", "a", "b"):
            v = getattr(args, f"filter_{n}_{which}")
            if v is not None:
                argv += [f"--filter:addr{n}_{which}", v]
    for opt, dest in _DEST.items():
        v = getattr(args, dest)
        if v is not None:
            argv += [opt, v]
    return argv


def _fast():
    from hwtrace.flow import fast
    return fast


def _run_one(args, image=None, wrap=None, write=None) -> int:
    """Decode ``args.pt``; ``image`` instead of the --raw/--elf images,
    ``wrap(decoder)`` to drive the decoder through a wrapper (the bundle's
    address-space switcher), ``write`` instead of stdout."""
    from hwtrace.flow import session, sinks
    from hwtrace.flow.block import BlockDecoder
    from hwtrace.flow.insn import InsnDecoder

    if not args.pt:
        raise CliError("decode: no trace: use --pt FILE or a bundle DIR")
    write = write or sys.stdout.write
    cfg = _config(args, write)
    if image is None:
        image = _image(args)
    data = _trace(args.pt, check=wrap is None)

    use_block = args.decoder != "insn"
    stats = args.stat or args.stat_insn or args.stat_blocks
    if args.format == "jsonl":
        sink = sinks.JsonSink(write, print_offset=args.offset)
    elif args.quiet and not args.show_blocks:
        sink = sinks.PtxedSink(write, quiet=True)
    else:
        sink = sinks.PtxedSink(write, quiet=args.quiet,
                               event_ip=args.event_ip,
                               event_time=args.event_time,
                               print_offset=args.offset,
                               show_blocks=args.show_blocks,
                               block_ids=stats)
    if True:
        if (getattr(args, "jobs", 1) != 1 or getattr(args, "dask", None)) \
                and not getattr(args, "bundle", None):
            from hwtrace.flow import parallel
            parallel.decode_args(args, cfg, sink, write, block=use_block,
                                 data=data)
        elif wrap is None and stats and args.quiet and \
                args.format == "text" and not args.show_blocks and \
                _fast().count_into(sink, data, image, cfg, use_block):
            pass        # counted by the compiled flow core (flow/fast.py)
        elif use_block:
            dec = BlockDecoder(data, image, cfg)
            session.run_blocks(wrap(dec) if wrap else dec, sink,
                               resync=args.resync)
        else:
            dec = InsnDecoder(data, image, cfg)
            session.run_insn(wrap(dec) if wrap else dec, sink,
                             resync=args.resync)
        if stats and args.format == "text":
            want_insn = args.stat_insn or not (args.stat_insn or
                                               args.stat_blocks)
            want_blocks = args.stat_blocks or not (args.stat_insn or
                                                   args.stat_blocks)
            from hwtrace.flow import ptxed
            for line in ptxed.stats_lines(
                    sink.insns if want_insn else None,
                    sink.blocks if (want_blocks and use_block) else None):
                write(line + "\n")
        elif args.format == "jsonl" and stats:
            import json
            write(json.dumps({"summary": "insn", "bytes": len(data),
                              "insns": sink.insns, "events": sink.events,
                              "errors": sink.errors},
                             separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return 0
