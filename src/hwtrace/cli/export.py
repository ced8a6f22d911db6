"""hwtrace export: timelines, flame graphs and coverage from a trace.

    hwtrace export BUNDLE --chrome t.json --perfetto t.pftrace
    hwtrace export BUNDLE --folded t.folded --weight time
    hwtrace export BUNDLE --drcov t.drcov --lcov t.info
    hwtrace export FLOW.jsonl --elf prog:0x555555554000 --chrome t.json

BUNDLE is a trace bundle directory, or a file of ``ptoracle insn`` JSON
lines (one stream; symbols from --elf).  Every output is written in one
pass over the decoded trace, streaming.
"""

from __future__ import annotations

import os

from hwtrace.cli import CliError


def register(sub) -> None:
    p = sub.add_parser("export", help="export call timelines, flame graphs "
                       "and coverage (Chrome JSON, Perfetto, folded, drcov, lcov)",
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    p.add_argument("--chrome", metavar="OUT.json",
                   help="Chrome trace-event JSON (Perfetto UI, chrome://tracing, speedscope)")
    p.add_argument("--chrome-args", action="store_true",
                   help="give every Chrome slice args (instructions, address)")
    p.add_argument("--perfetto", metavar="OUT.pftrace",
                   help="Perfetto native protobuf trace")
    p.add_argument("--folded", metavar="OUT", help="flame-graph folded stacks")
    p.add_argument("--weight", choices=("insns", "time"), default="insns",
                   help="weight of folded stacks (default: insns)")
    p.add_argument("--drcov", metavar="OUT", help="basic-block coverage (drcov)")
    p.add_argument("--lcov", metavar="OUT", help="line coverage (lcov tracefile)")
    p.set_defaults(func=run)


def add_input_args(p) -> None:
    p.add_argument("input", metavar="BUNDLE",
                   help="trace bundle directory, or a .jsonl file of flow items")
    p.add_argument("--elf", action="append", default=[], metavar="FILE[:BIAS]",
                   help="symbols of FILE loaded at BIAS (repeatable)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="look for the recorded executables in DIR too")
    p.add_argument("--clock", choices=("auto", "tsc", "insns"), default="auto",
                   help="time from TSC timing or from instruction counts")
    p.add_argument("--tsc-hz", type=float, metavar="HZ",
                   help="TSC frequency (default: the bundle's tsc_hz)")


def _open(path: str, mode: str):
    try:
        return open(path, mode, buffering=1 << 20)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}") from None


def decode_into(args, writers, coverage=None, label="export"):
    """Open the input, push every stream through writers; returns
    (source, totals).  All failures become one-line CliErrors."""
    from hwtrace.export.pipeline import StreamExporter, add_totals, new_totals
    from hwtrace.export.progress import Progress
    from hwtrace.cli._tracemap import check_view_input
    from hwtrace.export.source import SourceError, open_source

    check_view_input(args.input, args.elf)
    try:
        src = open_source(args.input, args.elf, args.image_path)
    except SourceError as e:
        raise CliError(str(e)) from None
    total_bytes = sum(j.size for j in src.jobs)
    progress = Progress(f"hwtrace {label}", None, unit="items")
    totals = new_totals()
    for i, job in enumerate(src.jobs):
        progress.set_label(f"hwtrace {label} {i + 1}/{len(src.jobs)} "
                           f"({job.info.label()})")
        if args.tsc_hz is not None and args.tsc_hz <= 0:
            raise CliError("--tsc-hz must be positive")
        ex = StreamExporter(job.info, writers, src.symbolizer.lookup, coverage,
                            progress, args.tsc_hz or job.tsc_hz, args.clock)
        try:
            job.run(ex)
            ex.finish()
        except SourceError as e:
            raise CliError(str(e)) from None
        except CliError:
            raise
        except (KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as e:   # the decoder is another team's: no traceback
            raise CliError(f"{job.info.label()}: decoding failed: "
                           f"{type(e).__name__}: {e}") from None
        add_totals(totals, ex)
    totals["bytes"] = total_bytes
    return src, totals, progress


def summary_line(label: str, totals: dict) -> str:
    m = totals["markers"]
    lost = ", ".join(f"{v} {k}" for k, v in sorted(m.items())) or "no gaps"
    return (f"hwtrace {label}: {totals['streams']} stream(s), "
            f"{totals['insns']:,} instructions, "
            f"{totals['activations']:,} activations, {lost}")


def run(args) -> int:
    outs = [args.chrome, args.perfetto, args.folded, args.drcov, args.lcov]
    if not any(outs):
        raise CliError("export: nothing to write: give --chrome, --perfetto, "
                       "--folded, --drcov or --lcov")
    from hwtrace.analysis.coverage import CoverageCollector
    from hwtrace.export.chrome import ChromeTraceWriter
    from hwtrace.export.drcov import write_drcov
    from hwtrace.export.folded import FoldedWriter
    from hwtrace.export.lcov import write_lcov
    from hwtrace.export.perfetto import PerfettoTraceWriter

    files = []
    writers = []
    try:
        if args.chrome:
            f = _open(args.chrome, "w")
            files.append(f)
            chrome = ChromeTraceWriter(f, args=args.chrome_args)
            writers.append(chrome)
        if args.perfetto:
            f = _open(args.perfetto, "wb")
            files.append(f)
            writers.append(PerfettoTraceWriter(f))
        if args.folded:
            f = _open(args.folded, "w")
            files.append(f)
            writers.append(FoldedWriter(f, args.weight))
        coverage = CoverageCollector() if (args.drcov or args.lcov) else None
        src, totals, progress = decode_into(args, writers, coverage)
        for w in writers:
            if isinstance(w, ChromeTraceWriter):
                w.close({"source": os.path.basename(str(args.input))})
            else:
                w.close()
        extra = ""
        if coverage is not None:
            blocks = coverage.finish()
            if args.drcov:
                mods = [(img.path, img.low, img.high)
                        for img in src.symbolizer.images]
                with _open(args.drcov, "wb") as f:
                    n, skipped = write_drcov(f, blocks, mods)
                extra += f", {n} blocks"
                if skipped:
                    extra += f" ({skipped} outside known modules)"
            if args.lcov:
                with _open(args.lcov, "w") as f:
                    res = write_lcov(f, blocks, src.symbolizer)
                extra += f", {len(res)} source files"
    finally:
        for f in files:
            try:
                f.close()
            except OSError:
                pass
    progress.done(summary_line("export", totals) + extra)
    return 0
