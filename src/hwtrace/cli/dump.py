"""hwtrace dump: print an Intel PT trace's packets like Intel's ptdump.

Accepts ptdump's option names.  ``--format jsonl`` prints one JSON object
per packet or error in the reference oracle's ``pkt`` schema; ``--stat``
prints only the counts (packets, bytes, errors).
"""

from __future__ import annotations

import json
import os
import sys

from hwtrace.cli import CliError, help_of

_FLAGS = [
    # (option, dest, help)
    ("--no-sync", "no_sync", "assume a sync point at offset 0"),
    ("--quiet", "quiet", "print nothing but errors"),
    ("--no-pad", "no_pad", "don't show PAD packets"),
    ("--no-timing", "no_timing", "don't show timing packets"),
    ("--no-cyc", "no_cyc", "don't show CYC packets and ignore them"),
    ("--no-offset", "no_offset", "don't show the offset column"),
    ("--raw", "raw", "show raw packet bytes"),
    ("--lastip", "lastip", "show last IP on packets with IP payloads"),
    ("--exec-mode", "exec_mode", "show the execution mode on mode.exec"),
    ("--time", "time", "show the estimated TSC on timing packets"),
    ("--tcal", "tcal", "show time calibration"),
    ("--time-delta", "time_delta", "show timing as deltas"),
    ("--no-tcal", "no_tcal", "skip timing calibration"),
    ("--no-wall-clock", "no_wall_clock",
     "suppress the no-time error, print relative time"),
    ("--keep-tcal-on-ovf", "keep_tcal_on_ovf",
     "keep time calibration across overflows"),
]
_NUMS = [
    ("--mtc-freq", "mtc_freq", 0xff, "IA32_RTIT_CTL.MTCFreq"),
    ("--nom-freq", "nom_freq", 0xff, "MSR_PLATFORM_INFO[15:8]"),
    ("--cpuid-0x15.eax", "cpuid_0x15_eax", 0xffffffff, "cpuid[0x15].eax"),
    ("--cpuid-0x15.ebx", "cpuid_0x15_ebx", 0xffffffff, "cpuid[0x15].ebx"),
]


def _c_int(text: str) -> int:
    """An unsigned number in C syntax (0x hex, 0 octal, decimal)."""
    t = text.strip()
    if len(t) > 1 and t[0] == "0" and t[1] in "01234567":
        return int(t, 8)
    return int(t, 0)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "dump", help=help_of("dump"),
        description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("file", metavar="FILE.pt[:FROM[-TO]]")
    for opt, dest, hlp in _FLAGS:
        p.add_argument(opt, dest=dest, action="store_true", help=hlp)
    p.add_argument("--cpu", metavar="F/M[/S]|none",
                   help="decode for this cpu (errata workarounds)")
    for opt, dest, _lim, hlp in _NUMS:
        p.add_argument(opt, dest=dest, metavar="N", default="0", help=hlp)
    p.add_argument("--format", choices=("ptdump", "jsonl"),
                   default="ptdump", help="output format")
    p.add_argument("--stat", action="store_true",
                   help="print only packet, byte and error counts")
    p.set_defaults(func=run)


def _load(spec: str):
    """The trace FILE[:FROM[-TO]], mapped rather than read (see
    hwtrace.cli._tracemap): offsets in the output count from FROM."""
    from hwtrace.cli._tracemap import map_trace

    path, lo, hi = spec, 0, None
    if not os.path.exists(spec) and ":" in spec:
        head, _, rng = spec.rpartition(":")
        try:
            if "-" in rng:
                a, b = rng.split("-", 1)
                lo, hi = _c_int(a), _c_int(b)
                if hi <= lo:
                    raise CliError(f"bad range in {spec}")
            else:
                lo = _c_int(rng)
            path = head
        except ValueError:
            path, lo, hi = spec, 0, None
    try:
        data = map_trace(path)
        if lo or hi is not None:
            n = len(data)
            if lo >= n or (hi is not None and hi > n):
                raise CliError(f"bad offset or range {spec}")
            if data.__class__ is bytes:         # a pipe: read already
                return data[lo:hi]
            data = map_trace(path, lo, (n if hi is None else hi) - lo)
    except OSError as e:
        raise CliError(_streams_hint(path) or f"cannot read {path}: {e.strerror or e}") from None
    return data


def _streams_hint(path: str) -> str:
    """For a bundle directory: which of its files to dump ('' if not one)."""
    import os
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        return ""
    from hwtrace.bundle import Bundle, BundleError
    try:
        names = [s.file for s in Bundle(path).streams]
    except (BundleError, OSError, ValueError):     # damaged: the plain message
        return ""
    if not names:
        return ""
    return (f"{path} is a trace bundle: dump one of its streams, e.g. "
            f"{os.path.join(path, names[0])} (its streams: {', '.join(names[:6])}"
            f"{', ...' if len(names) > 6 else ''})")


def _config(args):
    from hwtrace.pt.cpu import Cpu
    from hwtrace.pt.timing import TimingConfig
    nums = {}
    for opt, dest, lim, _h in _NUMS:
        try:
            v = _c_int(getattr(args, dest))
        except ValueError:
            raise CliError(f"{opt}: bad argument: "
                           f"{getattr(args, dest)}") from None
        if not 0 <= v <= lim:
            raise CliError(f"{opt}: value too big: {getattr(args, dest)}")
        nums[dest] = v
    cpu = None
    if args.cpu is not None:
        try:
            cpu = Cpu.parse(args.cpu)
        except ValueError:
            raise CliError("cpu must be specified as f/m[/s]") from None
    return cpu, TimingConfig(**nums)


def run(args) -> int:
    from hwtrace.cli._tracemap import check_trace
    from hwtrace.pt.decoder import PacketDecoder

    if args.time and args.tcal:
        raise CliError("specify either --time or --tcal")
    cpu, config = _config(args)
    data = _load(args.file)
    check_trace(data, args.file, sync=not args.no_sync,
                hint=" (--no-sync dumps it from offset 0)")
    out = sys.stdout

    if args.stat or args.format == "jsonl":
        dec = PacketDecoder(data, cpu=cpu)
        if args.stat:
            # Scan-only: no packet objects are made (compiled where built).
            npk, nerr = dec.count(no_sync=args.no_sync)
            if args.format == "jsonl":
                out.write(json.dumps({"summary": "pkt", "bytes": len(data),
                                      "packets": npk, "errors": nerr},
                                     separators=(",", ":")) + "\n")
            else:
                out.write(f"packets: {npk}\nbytes: {len(data)}\n"
                          f"errors: {nerr}\n")
            return 0
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        lines = []
        if dec.cpu_error is not None:
            lines.append(dumps({"error": dec.cpu_error.code,
                                "kind": "config error", "offset": 0,
                                "ip": 0}))
        for p in dec.packets(no_sync=args.no_sync):
            lines.append(p.to_jsonl())
            if len(lines) >= 4096:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")
        return 0

    from hwtrace.pt.ptdump_format import PtdumpOptions, ptdump_lines
    opts = PtdumpOptions(
        show_offset=not args.no_offset, show_raw_bytes=args.raw,
        show_last_ip=args.lastip, show_exec_mode=args.exec_mode,
        show_time=args.time, show_tcal=args.tcal,
        show_time_as_delta=args.time_delta, quiet=args.quiet,
        no_pad=args.no_pad, no_sync=args.no_sync, no_tcal=args.no_tcal,
        no_wall_clock=args.no_wall_clock, no_timing=args.no_timing,
        no_cyc=args.no_cyc, keep_tcal_on_ovf=args.keep_tcal_on_ovf)
    lines = []
    for line in ptdump_lines(data, opts, config, cpu=cpu):
        lines.append(line)
        if len(lines) >= 4096:
            out.write("\n".join(lines) + "\n")
            lines.clear()
    if lines:
        out.write("\n".join(lines) + "\n")
    return 0
