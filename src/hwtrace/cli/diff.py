"""hwtrace diff: where two recorded executions parted ways.

    hwtrace diff A B [--format text|jsonl] [--max N] [--thread A:TID=B:TID]

Pairs the threads of two bundles (process tree, creation order), and for
each pair reports the first divergence (instruction index and trace
offset in each run, the last common and first differing instructions,
the deciding branch, the call stack), the later divergent regions in
short, and what only one run executed.  Different builds of a program
are compared by symbol+offset, libraries loaded elsewhere by module
offset.  Exit status: 0 the runs are the same, 1 they differ, 2 error.
"""

from __future__ import annotations

import json
import sys

from hwtrace.cli import CliError, help_of, warn


def register(sub) -> None:
    p = sub.add_parser("diff", help=help_of("diff"),
                       description=__doc__.splitlines()[0])
    p.add_argument("a", metavar="A", help="trace bundle of the first run")
    p.add_argument("b", metavar="B", help="trace bundle of the second run")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--max", type=int, default=10, metavar="N",
                   help="divergences reported per thread pair (default 10; "
                        "0: no limit)")
    p.add_argument("--thread", action="append", default=[],
                   metavar="A:TID=B:TID", help="pair these threads "
                   "(repeatable; the others are paired around them)")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="functions listed whose counts differ most (default 10)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="look for the recorded executables in DIR too")
    p.set_defaults(func=run)


def _open(path: str, image_path):
    from hwtrace.streams import StreamsError, open_bundle
    try:
        ts = open_bundle(path, image_path=image_path, warn=warn)
    except StreamsError as e:
        raise CliError(f"diff: {e}") from None
    ts.report(warn)
    return ts


def run(args) -> int:
    from hwtrace.diff.runs import Options, diff_runs
    from hwtrace.diff.text import TextWriter
    from hwtrace.diff.threads import ThreadsError, parse_override
    from hwtrace.streams import StreamsError

    if args.max < 0:
        raise CliError("diff: --max must be 0 or more")
    if args.top < 0:
        raise CliError("diff: --top must be 0 or more")
    try:
        overrides = [parse_override(t) for t in args.thread]
    except ThreadsError as e:
        raise CliError(f"diff: {e}") from None
    a = _open(args.a, args.image_path)
    b = _open(args.b, args.image_path)
    opts = Options(overrides=overrides, max_divergences=args.max or None,
                   top=args.top)
    out = sys.stdout
    if args.format == "jsonl":
        def write(r):
            out.write(json.dumps(r) + "\n")
    else:
        write = TextWriter(out).write
    same = None
    try:
        for r in diff_runs(a, b, opts):
            write(r)
            if r["type"] == "summary":
                same = r["same"]
    except (ThreadsError, StreamsError) as e:
        raise CliError(f"diff: {e}") from None
    except BrokenPipeError:
        raise                       # the reader left: main() ends quietly
    except OSError as e:            # an image file gone while decoding
        raise CliError(f"diff: {e.filename or ''}: {e.strerror or e}") from None
    out.flush()
    return 0 if same else 1
