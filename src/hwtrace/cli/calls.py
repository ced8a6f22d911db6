"""hwtrace calls: the indented function-call history of a trace.

    hwtrace calls BUNDLE [--max-depth N] [--function NAME] [--insns A..B]

One line per function activation (one run of a function, from its call to
its return) in execution order, indented by call depth, with its
instruction count and duration (like a debugger's function-call history).
Lines stream out as activations end; a long-running one (``main``) is
written at once as ``(open: ...)`` and its totals follow where it ends.
Lost data and decode errors are lines of their own (``-- error at insn
N``), where they happened.  One section per thread (``thread T
(program):``), in a cpu-mode recording as in a thread-mode one: the
first thread's written as it goes, the others' after it (held in memory,
then a temporary file); a recording whose CPU streams cannot be taken in
time order (no TSC, ``--clock insns``) is printed per CPU.
"""

from __future__ import annotations

import sys

from hwtrace.cli import help_of


def register(sub) -> None:
    from hwtrace.cli._filters import add_filter_args
    from hwtrace.cli._views import add_input_args
    p = sub.add_parser("calls", help=help_of("calls"),
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    add_filter_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from hwtrace.branches.threadcalls import ThreadCalls
    from hwtrace.cli._filters import window_of
    from hwtrace.cli._spool import TextSpools
    from hwtrace.cli._views import decode_into, nothing_decoded, summary_line

    window = window_of(args)
    hist = ThreadCalls(None, out=sys.stdout, hold=TextSpools())
    _inp, totals, progress = decode_into(args, [hist], label="calls", window=window,
                                         opened=lambda inp: _times(hist, inp))
    hist.close()
    nothing_decoded("calls", totals)
    progress.done(summary_line("calls", totals))
    return 0


def _times(hist, inp) -> None:
    """No duration column where the clock only counts instructions again
    (an emulated recording's TSC): it would repeat the count."""
    if inp.timebase.startswith("instruction count"):
        hist.show_time = False
