"""``hwtrace import SOURCE -o DIR``: a trace another tool saved, as a
trace bundle.

SOURCE is a perf recording of Intel PT (perf.data, file or pipe layout;
``-`` reads a pipe-layout stream from stdin; ``--image FILE`` gives
binaries), or LLDB's ``trace save`` output: its ``trace.json`` or the
directory holding it (:mod:`hwtrace.importers.lldb`)."""

from __future__ import annotations

import os
import sys

from hwtrace.cli import CliError, help_of


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import", help=help_of("import"),
        description="Read a perf.data file (perf record -e intel_pt//, file or "
                    "pipe layout) or an LLDB saved trace (trace save: its "
                    "trace.json or directory) and write a trace bundle: one "
                    "stream per CPU (or thread), sideband (processes, threads, "
                    "maps with build-ids, context switches) and the CPU/timing "
                    "parameters.")
    p.add_argument("perf_data", metavar="SOURCE",
                   help="the perf.data file (- to read a pipe-layout stream "
                        "from stdin), or LLDB's trace.json or its directory")
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

    if args.perf_data != "-":
        from hwtrace.importers.lldb import is_trace_json
        if is_trace_json(args.perf_data):
            return _run_lldb(args)
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


def _run_lldb(args) -> int:
    from hwtrace.bundle import BundleError
    from hwtrace.importers.lldb import LldbTraceError, import_lldb_trace

    if args.image:
        raise CliError("import: --image is for perf.data: an LLDB trace "
                       "names its modules in trace.json")
    try:
        res = import_lldb_trace(args.perf_data, args.output,
                                exist_ok=args.force)
    except LldbTraceError as e:
        raise CliError(f"import: {e}") from None
    except BundleError as e:
        raise CliError(f"import: {e}") from None
    except OSError as e:
        raise CliError(f"import: {e.filename or args.output}: "
                       f"{e.strerror}") from None
    streams = ", ".join(f"{f} ({n} bytes)" for f, n in res.streams) or "none"
    print(f"imported {args.perf_data} (LLDB trace, {res.mode} mode) into "
          f"{res.path}: streams {streams}; {res.sideband_records} sideband "
          f"records; {len(res.images)} image(s)")
    for recorded in res.missing_images:
        print(f"note: trace.json saved no copy of {recorded}")
    return 0
