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
exactly; otherwise the Python instruction decoder does (same result).
"""

from __future__ import annotations

import sys

from hwtrace.cli import CliError
from hwtrace.cli.decode import _DEST, _ImageArg, _image as _load_images, \
    _number


def register(sub) -> None:
    p = sub.add_parser("coverage", help="edge coverage of a trace (exact "
                       "counts and an AFL-style bitmap)",
                       description=__doc__.splitlines()[0])
    p.add_argument("bundle", nargs="?", metavar="DIR",
                   help="a trace bundle (images from its sideband)")
    p.add_argument("--edges", action="store_true",
                   help="edge coverage (the only mode so far)")
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
    p.set_defaults(func=run, images=[])


_TIMING = ("mtc_freq", "nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx")


def _timing_args(args) -> dict:
    """The timing options given on the command line, by FlowConfig name."""
    out = {}
    for (opt, dest), key in zip(_DEST.items(), _TIMING):
        v = _number(opt, getattr(args, dest, None))
        if v is not None:
            out[key] = v
    return out


def _config(cpu_arg, timing=None):
    from hwtrace.flow.config import Errata, FlowConfig
    from hwtrace.pt import cpu as cpumod
    from hwtrace.pt.errors import PtError

    cfg = FlowConfig()
    if cpu_arg:
        try:
            cpu = cpumod.Cpu.parse(cpu_arg)
        except ValueError as e:
            raise CliError(f"--cpu: {e}") from None
        cfg.cpu = cpu
        if cpu is not None:
            errata = cpumod.errata(cpu)
            if not isinstance(errata, PtError):
                cfg.errata = Errata.from_flags(errata)
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


def _jobs(args):
    """(label, trace path, image options, cpu, timing parameters) per trace
    to cover."""
    if not args.bundle:
        if not args.pt:
            raise CliError("coverage: no trace: use --pt FILE or a bundle DIR")
        return [(None, args.pt, args.images, args.cpu, _timing_args(args))]
    if args.pt:
        raise CliError("coverage: give either a bundle DIR or --pt")
    import json
    import os
    from hwtrace.cli.images import stream_args
    try:
        with open(os.path.join(args.bundle, "manifest.json")) as f:
            manifest = json.load(f)
        streams = [s["file"] for s in manifest["streams"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliError(f"coverage: {args.bundle}: not a bundle ({e})") from None
    if args.stream:
        missing = [s for s in args.stream if s not in streams]
        if missing:
            raise CliError(f"coverage: no stream {missing[0]!r} in "
                           f"{args.bundle}")
        streams = args.stream
    cpu = args.cpu
    c = manifest.get("cpu")
    if not cpu and isinstance(c, dict) and type(c.get("family")) is int and \
            type(c.get("model", 0)) is int:
        cpu = f"{c['family']}/{c.get('model', 0)}"
    timing = {k: manifest[k] for k in _TIMING
              if type(manifest.get(k)) is int and manifest[k] > 0}
    timing.update(_timing_args(args))
    out = []
    for name in streams:
        argv = stream_args(args.bundle, name)
        images = [(argv[i].lstrip("-"), argv[i + 1])
                  for i in range(0, len(argv) - 1, 2)
                  if argv[i] in ("--raw", "--elf")]
        if os.path.basename(name) != name:
            raise CliError(f"coverage: bad stream name {name!r}")
        out.append((name, os.path.join(args.bundle, name), images, cpu,
                    timing))
    return out


def run(args) -> int:
    from hwtrace.flow import fast

    if not args.edges:
        raise CliError("coverage: say which coverage: --edges")
    if args.bitmap_size <= 0:
        raise CliError("coverage: --bitmap-size must be positive")
    write = sys.stdout.write
    total: dict = {}
    insns = 0
    for label, path, images, cpu, timing in _jobs(args):
        image = _image(images)
        cfg = _config(cpu, timing)
        e = fast.edges(_read(path, check=label is None), image, cfg)
        insns += e.insns
        for k, n in e.counts.items():
            total[k] = total.get(k, 0) + n
    if not args.quiet:
        for (f, t), n in sorted(total.items()):
            write(f"{f:016x} {t:016x} {n}\n")
    write(f"edges: {len(total)}, taken: {sum(total.values())}, "
          f"insns: {insns}.\n")
    if args.bitmap:
        bm = fast.edge_bitmap(total, args.bitmap_size)
        try:
            with open(args.bitmap, "wb") as f:
                f.write(bm)
        except OSError as e:
            raise CliError(f"--bitmap: cannot write {args.bitmap}: "
                           f"{e.strerror}") from None
    sys.stdout.flush()
    return 0
