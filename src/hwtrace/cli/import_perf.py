"""``hwtrace import perf.data -o DIR [--image FILE...]``: a perf recording
of Intel PT (file or pipe layout) into a trace bundle."""

from __future__ import annotations

import os
import sys

from hwtrace.cli import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import", help="import a perf.data Intel PT recording into a bundle",
        description="Read a perf.data file (perf record -e intel_pt//, file or "
                    "pipe layout) and write a trace bundle: one stream per CPU "
                    "(or thread), sideband (processes, maps with build-ids, "
                    "context switches) and the CPU/timing parameters.")
    p.add_argument("perf_data", metavar="PERF_DATA",
                   help="the perf.data file, or - to read a pipe-layout stream from stdin")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory to create")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="a traced binary, matched by build-id or file name when the "
                        "recorded path does not exist here (repeatable)")
    p.add_argument("--force", action="store_true", help="overwrite an existing bundle in DIR")
    p.set_defaults(func=run)


def run(args) -> int:
    from hwtrace.bundle import BundleError
    from hwtrace.engines.perf.errors import PerfDataError
    from hwtrace.engines.perf.importer import import_perf_data, import_perf_file

    if args.perf_data == "-":
        data = sys.stdin.buffer.read()
        load = lambda: import_perf_data(data, args.output, images=args.image,  # noqa: E731
                                        source="<stdin>", exist_ok=args.force)
    elif not os.path.isfile(args.perf_data):
        raise CliError(f"import: {args.perf_data}: no such file")
    else:
        load = lambda: import_perf_file(args.perf_data, args.output,  # noqa: E731
                                        images=args.image, exist_ok=args.force)
    for img in args.image:
        if not os.path.isfile(img):
            raise CliError(f"import: --image {img}: no such file")
    try:
        res = load()
    except PerfDataError as e:
        raise CliError(f"import: {args.perf_data}: {e}") from None
    except BundleError as e:
        raise CliError(f"import: {e}") from None
    except OSError as e:
        raise CliError(f"import: {e.filename or args.output}: {e.strerror}") from None
    streams = ", ".join(f"{f} ({n} bytes)" for f, n in res.streams) or "none"
    print(f"imported {args.perf_data} ({res.layout} layout) into {res.path}: "
          f"streams {streams}; {res.sideband_records} sideband records; "
          f"{len(res.images)} image(s)")
    for recorded in res.missing_images:
        print(f"note: no binary for {recorded} (give it with --image)")
    return 0
