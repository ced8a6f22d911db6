"""hwtrace calls: the indented function-call history of a trace.

    hwtrace calls BUNDLE [--max-depth N]

One line per function activation in execution order, indented by call
depth, with its instruction count and duration (like a debugger's
function-call history).
"""

from __future__ import annotations

import sys

from hwtrace.cli import CliError


def register(sub) -> None:
    from hwtrace.cli.export import add_input_args
    p = sub.add_parser("calls", help="indented function-call history with counts and durations",
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    p.add_argument("--max-depth", type=int, metavar="N",
                   help="leave out activations deeper than N (0 = outermost only)")
    p.set_defaults(func=run)


def run(args) -> int:
    from hwtrace.branches.calls import CallHistory
    from hwtrace.cli.export import decode_into, summary_line

    if args.max_depth is not None and args.max_depth < 0:
        raise CliError("calls: --max-depth must be 0 or more")
    hist = CallHistory(args.max_depth)
    _src, totals, progress = decode_into(args, [hist], label="calls")
    progress.done(summary_line("calls", totals))
    out = sys.stdout
    for line in hist.lines():
        out.write(line + "\n")
    return 0
