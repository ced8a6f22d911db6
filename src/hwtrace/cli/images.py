"""``hwtrace images``: the image arguments ptxed / ptoracle need for a stream."""

from __future__ import annotations

import shlex

from hwtrace.cli import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "images", help="print ptxed/ptoracle --raw image arguments for a stream",
        description="Print, on one line, the --raw FILE:FROM-TO:ADDR arguments that "
                    "load every executable mapping of the stream's process(es) "
                    "(bundle copies from --copy-images first, then --image-path, then "
                    "the recorded paths if they are ELF files with the recorded "
                    "build-id, or any recorded path with --allow-outside), so "
                    "Intel's ptxed or ptoracle can decode the stream.")
    p.add_argument("bundle", metavar="DIR", help="trace bundle")
    p.add_argument("--pt", required=True, metavar="STREAM",
                   help="stream file name in the bundle (e.g. cpu0.pt, tid1234.pt)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="also look for images (by file name) here")
    p.add_argument("--allow-outside", action="store_true",
                   help="use any file the sideband names on this machine, even "
                        "without a matching build-id (trusted bundles only)")
    p.add_argument("--lines", action="store_true", help="one argument per line")
    p.set_defaults(func=run)


def stream_args(bundle_dir, stream: str, image_path=(), allow_outside: bool = False) -> list[str]:
    from hwtrace.bundle import Bundle, BundleError
    from hwtrace.engines.emulated.images import raw_image_args
    try:
        b = Bundle.open(bundle_dir, image_path=image_path, allow_outside=allow_outside)
        info = next((s for s in b.streams if s.file == stream), None)
        if info is None:
            names = ", ".join(s.file for s in b.streams)
            raise CliError(f"no stream {stream!r} in {bundle_dir} (streams: {names})")
        mmaps = [r for r in b.iter_sideband() if type(r).__name__ == "Mmap"]
    except BundleError as e:
        raise CliError(str(e)) from None
    if info.tid is not None:
        pid = info.pid
        if pid is None:
            pid = next((r.pid for r in b.iter_sideband()
                        if type(r).__name__ == "Thread" and r.tid == info.tid), None)
        if pid is not None:
            mmaps = [m for m in mmaps if m.pid == pid]
    found = {}

    def resolve(file, build_id):
        key = (file, build_id)
        if key not in found:
            found[key] = b.find_image(file, build_id)
        return found[key]
    return raw_image_args(mmaps, resolve)


def run(args) -> int:
    argv = stream_args(args.bundle, args.pt, args.image_path, args.allow_outside)
    if args.lines:
        for a in argv:
            print(a)
    else:
        print(" ".join(shlex.quote(a) for a in argv))
    return 0
