"""``hwtrace images``: the image arguments ptxed / ptoracle need for a stream."""

from __future__ import annotations

import shlex

from hwtrace.cli import CliError, help_of


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "images", help=help_of("images"),
        description="Print, on one line, the --raw FILE:FROM-TO:ADDR arguments that "
                    "load every executable mapping of the stream's process(es) "
                    "(bundle copies from --copy-images first, then --image-path, then "
                    "the recorded paths if they are ELF files with the recorded "
                    "build-id, or any recorded path with --allow-outside), so "
                    "Intel's ptxed or ptoracle can decode the stream.")
    p.add_argument("bundle", metavar="DIR", help="trace bundle")
    p.add_argument("--pt", required=True, metavar="STREAM",
                   help="a stream of the bundle: its file name (e.g. cpu0.pt, tid1234.pt) "
                        "or the path to it (e.g. DIR/cpu0.pt)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="also look for images (by file name) here")
    p.add_argument("--allow-outside", action="store_true",
                   help="use any file the sideband names on this machine, even "
                        "without a matching build-id (trusted bundles only)")
    p.add_argument("--pid", type=int, metavar="PID",
                   help="the image of this process (its latest address space: "
                        "what a cpu stream runs while PID is scheduled)")
    p.add_argument("--lines", action="store_true", help="one argument per line")
    p.set_defaults(func=run)


def stream_args(bundle_dir, stream: str, image_path=(), allow_outside: bool = False,
                pid: int | None = None) -> list[str]:
    """--raw arguments for ``stream``: its process's address space for a
    thread stream (or ``pid``'s), else every mapping in the sideband."""
    from hwtrace.bundle import Bundle, BundleError
    from hwtrace.engines.emulated.images import raw_image_args
    from hwtrace.flow.spaces import AddressSpaces
    found = {}
    try:
        b = Bundle.open(bundle_dir, image_path=image_path, allow_outside=allow_outside)
        info = find_stream(b, stream)
        if info is None:
            names = ", ".join(s.file for s in b.streams)
            raise CliError(f"no stream {stream!r} in {bundle_dir} (streams: {names})")

        def resolve(file, build_id):
            key = (file, build_id)
            if key not in found:
                found[key] = b.find_image(file, build_id)
            return found[key]
        if pid is None and info.tid is None:
            mmaps = [r for r in b.iter_sideband() if type(r).__name__ == "Mmap"]
            return raw_image_args(mmaps, resolve)
        spaces = AddressSpaces(b.iter_sideband(), resolve)
    except BundleError as e:
        raise CliError(str(e)) from None
    if pid is None:
        pid = info.pid if info.pid is not None else spaces.thread_pid.get(info.tid)
        if pid is None:
            return _raw_args(spaces.union().mappings)
        tl = spaces.thread_timeline(pid)
        lives = [sp for _, sp in tl.entries] if tl is not None else []
        if len(lives) > 1:          # it exec'd: every image the thread ran, later ones last
            seen, maps = set(), []
            for sp in lives:
                for m in sp.mappings:
                    if m not in seen:
                        seen.add(m)
                        maps.append(m)
            return _raw_args(maps)
    space = spaces.of_pid(pid)
    if space is None:
        raise CliError(f"no process {pid} in the sideband of {bundle_dir}")
    return _raw_args(space.mappings)


def find_stream(b, stream: str):
    """The manifest entry of ``stream``: a stream's file name, or a path
    (absolute, or relative to the working directory) to that file inside
    the bundle; None if it names no stream of the bundle."""
    import os
    info = next((s for s in b.streams if s.file == stream), None)
    if info is not None or os.sep not in stream:
        return info
    for s in b.streams:
        try:
            if os.path.samefile(stream, b.path / s.file):
                return s
        except OSError:
            continue
    return None


def _raw_args(mappings) -> list[str]:
    """``--raw FILE:FROM-TO:ADDR`` per mapping (clipped to the file)."""
    import os
    args: list[str] = []
    for m in mappings:
        try:
            fsize = os.path.getsize(m.path)
        except OSError:
            continue
        end = min(m.offset + m.size, fsize)
        if end > m.offset:
            args += ["--raw", f"{m.path}:{m.offset:#x}-{end:#x}:{m.start:#x}"]
    return args


def run(args) -> int:
    import os
    for d in args.image_path:
        if not os.path.isdir(d):
            raise CliError(f"images: --image-path {d}: not a directory")
    argv = stream_args(args.bundle, args.pt, args.image_path, args.allow_outside,
                       args.pid)
    if args.lines:
        for a in argv:
            print(a)
    else:
        print(" ".join(shlex.quote(a) for a in argv))
    return 0
