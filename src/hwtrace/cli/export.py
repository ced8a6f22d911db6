"""hwtrace export: timelines, flame graphs and coverage from a trace.

    hwtrace export BUNDLE --chrome t.json --perfetto t.pftrace
    hwtrace export BUNDLE --folded t.folded --weight time
    hwtrace export BUNDLE --drcov t.drcov --lcov t.info
    hwtrace export BUNDLE --function fib --perfetto fib.pftrace
    hwtrace export FLOW.jsonl --elf prog:0x555555554000 --chrome t.json

BUNDLE is a trace bundle directory, a raw .pt trace (code and symbols from
--elf), or a file of ``ptoracle insn`` JSON lines or branch records.  Every
output is written in one pass over the decoded trace, streaming.  Open
.pftrace and .json files at https://ui.perfetto.dev (or chrome://tracing),
.json and .folded in speedscope (https://www.speedscope.app, or
``npx speedscope FILE``); .folded with flamegraph.pl too; .drcov in
Lighthouse or Cutter; .info with genhtml.
"""

from __future__ import annotations

import os
import sys

from hwtrace.cli import CliError, help_of
from hwtrace.cli._outfile import OutFile
from hwtrace.cli._views import (add_input_args, decode_into, nothing_decoded,
                                summary_line)

__all__ = ["add_input_args", "decode_into", "summary_line", "register", "run"]


def register(sub) -> None:
    from hwtrace.cli._filters import add_filter_args
    p = sub.add_parser("export", help=help_of("export"),
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    p.add_argument("--chrome", metavar="OUT.json",
                   help="Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing, speedscope)")
    p.add_argument("--chrome-args", action="store_true",
                   help="give every Chrome slice args (instructions, address)")
    p.add_argument("--perfetto", metavar="OUT.pftrace",
                   help="Perfetto native protobuf trace (ui.perfetto.dev)")
    p.add_argument("--folded", metavar="OUT", help="flame-graph folded stacks "
                   "(speedscope, flamegraph.pl)")
    p.add_argument("--weight", choices=("insns", "time"), default="insns",
                   help="weight of folded stacks (default: insns)")
    p.add_argument("--drcov", metavar="OUT", help="basic-block coverage (drcov)")
    p.add_argument("--lcov", metavar="OUT", help="line coverage (lcov tracefile)")
    add_filter_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from hwtrace.cli._filters import window_of
    outs = [args.chrome, args.perfetto, args.folded, args.drcov, args.lcov]
    if not any(outs):
        raise CliError("export: nothing to write: give --chrome, --perfetto, "
                       "--folded, --drcov or --lcov")
    from hwtrace.analysis.coverage import CoverageCollector, SpacedCoverage
    from hwtrace.export.chrome import ChromeTraceWriter
    from hwtrace.export.drcov import write_drcov_parts
    from hwtrace.export.folded import FoldedWriter
    from hwtrace.export.lcov import write_lcov_parts
    from hwtrace.export.perfetto import PerfettoTraceWriter

    window = window_of(args)
    files = []
    writers = []
    try:
        if args.chrome:
            files.append(OutFile(args.chrome, "w"))
            writers.append(ChromeTraceWriter(files[-1].f, args=args.chrome_args))
        if args.perfetto:
            files.append(OutFile(args.perfetto, "wb"))
            writers.append(PerfettoTraceWriter(files[-1].f))
        if args.folded:
            files.append(OutFile(args.folded, "w"))
            writers.append(FoldedWriter(files[-1].f, args.weight, root=args.function))
        made = []

        def coverage_for(inp):
            # processes running different programs at the same addresses:
            # blocks per set of files, each against its own modules
            spaced = inp.traces.space_lookup() if inp.traces is not None else None
            made.append(SpacedCoverage(spaced) if spaced is not None else CoverageCollector())
            return made[-1]

        inp, totals, progress = decode_into(
            args, writers, window=window,
            coverage_for=coverage_for if (args.drcov or args.lcov) else None)
        coverage = made[0] if made else None
        for w in writers:
            if isinstance(w, ChromeTraceWriter):
                other = {"source": os.path.basename(str(args.input))}
                lost = _lost_note(totals)
                if lost:
                    other["lost"] = lost
                w.close(other)
            else:
                w.close()
        extra = ""
        if coverage is not None:
            if isinstance(coverage, SpacedCoverage):
                parts = [(blocks, inp.symbolizer if lookup is None else lookup.__self__)
                         for lookup, blocks in coverage.finish()]
            else:
                parts = [(coverage.finish(), inp.symbolizer)]
            if args.drcov:
                with OutFile(args.drcov, "wb") as f:
                    n, skipped = write_drcov_parts(
                        f, [(blocks, [(img.path, img.low, img.high) for img in sym.images])
                            for blocks, sym in parts])
                extra += f", {n} blocks"
                if skipped:
                    extra += f" ({skipped} outside known modules)"
            if args.lcov:
                with OutFile(args.lcov, "w") as f:
                    res = write_lcov_parts(f, parts)
                extra += f", {len(res)} source files"
        for f in files:
            f.commit()
    finally:
        for f in files:
            f.discard()             # a no-op once committed
    nothing_decoded("export", totals)
    progress.done(summary_line("export", totals) + extra)
    if sys.stderr.isatty():
        sys.stderr.write(_how_to_open(args) + "\n")
    return 0


def _how_to_open(args) -> str:
    """One line on opening what was written (a terminal only)."""
    parts = []
    for path, where in ((args.perfetto, "https://ui.perfetto.dev"),
                        (args.chrome, "https://ui.perfetto.dev or speedscope"),
                        (args.folded, "speedscope (npx speedscope FILE) or flamegraph.pl"),
                        (args.drcov, "Lighthouse or Cutter"),
                        (args.lcov, "genhtml")):
        if path:
            parts.append(f"{path} in {where}")
    return "hwtrace export: open " + "; ".join(parts)


def _lost_note(totals) -> list[str]:
    from hwtrace.cli._views import loss_parts
    return loss_parts(totals)
