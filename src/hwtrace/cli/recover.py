"""``hwtrace recover DIR``: turn a trace directory -- even one whose collector
crashed mid-trace -- into a decodable bundle."""

from __future__ import annotations

from hwtrace.cli import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recover", help="make a bundle from a trace directory (e.g. after a crash)",
        description="Read a trace directory's buffers (memory-mapped chunks and "
                    "their persisted ToPA output registers) and sideband, and "
                    "write a bundle: one stream per CPU or thread, oldest byte "
                    "first, a wrapped circular buffer from its first PSB.")
    p.add_argument("directory", metavar="DIR", help="the trace directory")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the bundle here (default: into DIR itself)")
    p.add_argument("--force", action="store_true", help="replace an existing manifest")
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    from hwtrace.bundle import Bundle, BundleError
    from hwtrace.control.recover import RecoverError, write_bundle
    if not os.path.isdir(args.directory):
        raise CliError(f"recover: {args.directory}: no such directory")
    out = args.output or args.directory
    try:
        path = write_bundle(args.directory, out, overwrite=args.force)
        b = Bundle(path)
    except (RecoverError, BundleError) as e:
        msg = str(e)
        if "already holds a bundle" in msg:
            msg += " (use --force to replace it)"
        raise CliError(f"recover: {msg}") from None
    except OSError as e:
        raise CliError(f"recover: {e.filename or out}: {e.strerror}") from None
    print(f"recovered {len(b.streams)} stream(s) into {path}")
    for s in b.streams:
        who = f"cpu {s.cpu}" if s.cpu is not None else f"tid {s.tid}"
        flags = [f for f, on in (("wrapped", s.wrapped), ("stopped", s.stopped)) if on]
        lost = f", {s.lost_bytes} bytes lost" if s.lost_bytes else ""
        print(f"  {s.file}: {who}, {s.size} bytes{', ' + ', '.join(flags) if flags else ''}{lost}")
    return 0
