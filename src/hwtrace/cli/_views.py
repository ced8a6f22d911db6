"""What ``calls``, ``summary`` and ``export`` share: their input options,
the run of every stream through the view pipeline, and how loss is said.

Loss is always said: a stream the recorder reports as stopped (its buffer
filled), wrapped (its ring buffer overwrote the oldest data) or short of
bytes, and every decode error, overflow or gap, each with its trace
offset or its count -- on stderr's one summary line, and in every view's
own output (``lost`` / ``error`` markers where they happened).  A view of
a trace of which nothing could be decoded is an error (exit status 1),
not an empty success.
"""

from __future__ import annotations

from contextlib import contextmanager

from hwtrace.cli import CliError


def add_input_args(p) -> None:
    p.add_argument("input", metavar="BUNDLE",
                   help="trace bundle directory, a raw .pt trace (with --elf), "
                        "or a .jsonl file of flow items or branch records")
    p.add_argument("--elf", action="append", default=[], metavar="FILE[:BIAS]",
                   help="symbols (and, for a raw .pt, code) of FILE loaded at "
                        "BIAS (repeatable)")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="look for the recorded executables in DIR too")
    p.add_argument("--clock", choices=("auto", "tsc", "insns"), default="auto",
                   help="time from TSC timing or from instruction counts")
    p.add_argument("--tsc-hz", type=float, metavar="HZ",
                   help="TSC frequency (default: the bundle's tsc_hz)")


def decode_into(args, writers, coverage=None, label="export", window=None,
                opened=None, coverage_for=None):
    """Open the input, push every stream through writers; returns
    (input, totals, progress).  All failures become one-line CliErrors.
    ``coverage_for(input)``: the coverage collector for the input, once
    it is open (instead of ``coverage``)."""
    from hwtrace.cli._inputs import open_input
    from hwtrace.export.interleave import alone, applies
    from hwtrace.export.pipeline import ViewRun
    from hwtrace.export.progress import Progress

    if args.tsc_hz is not None and args.tsc_hz <= 0:
        raise CliError("--tsc-hz must be positive")
    inp = open_input(args.input, args.elf, args.image_path)
    if opened is not None:
        opened(inp)
    if coverage_for is not None:
        coverage = coverage_for(inp)
    total = sum(s.size for s in inp.streams)
    progress = Progress(f"hwtrace {label}", total or None,
                        unit="bytes" if total else "items")
    # a bundle whose processes run different programs: each part of a
    # stream named by its own process's files (the space items say where)
    spaced = inp.traces.space_lookup() if inp.traces is not None else None
    run = ViewRun(writers, inp.symbolizer.lookup, args.clock, args.tsc_hz,
                  coverage, progress, window=window, space_lookup=spaced)
    more = {"space_items": True} if spaced is not None else {}
    if coverage is None:
        # the call-stack builder takes the plain events as rows
        more["plain_events"] = True
    infos = [s.info for s in inp.streams]
    by_thread = all(hasattr(w, "threads_followed") for w in writers)
    # (coverage alone needs no time order: each stream on its own is cheaper)
    if (coverage is None or writers) and not getattr(window, "by_time", False) and \
            all(s.batches is not None for s in inp.streams) and \
            (applies(infos, args.clock) or (by_thread and alone(infos))):
        _interleaved(run, inp, label, progress, more)
    else:
        _one_by_one(run, inp, label, progress, more)
    totals = run.totals
    totals["bytes"] = total
    if getattr(window, "function", None) is not None and not window.found:
        totals["unmatched"] = window.function
    return inp, totals, progress


def _interleaved(run, inp, label, progress, more) -> None:
    """A recording's CPU streams in time order: threads followed from CPU
    to CPU (:mod:`hwtrace.export.interleave`); the later streams' output
    spooled to a file while it waits for its turn."""
    from hwtrace.cli._spool import Spool
    from hwtrace.export.interleave import Source
    from hwtrace.export.pipeline import MAX_RECORDS
    n = len(inp.streams)
    progress.set_label(f"hwtrace {label} {n} CPU streams in time order")
    where = [0]

    def at(k: int) -> None:
        where[0] = k
    with _failures(lambda: inp.streams[where[0]].info.label()):
        sources = []
        for k, s in enumerate(inp.streams):
            at(k)
            sources.append(Source(s.info, s.batches(max_records=MAX_RECORDS, **more),
                                  s.entry, s.tsc_hz))
        run.interleaved(sources, Spool, at)


def _one_by_one(run, inp, label, progress, more) -> None:
    from hwtrace.export.pipeline import MAX_RECORDS
    for i, s in enumerate(inp.streams):
        progress.set_label(f"hwtrace {label} {i + 1}/{len(inp.streams)} "
                           f"({s.info.label()})")
        with _failures(s.info.label):
            if s.batches is not None:
                run.batches(s.info, s.batches(max_records=MAX_RECORDS, **more),
                            entry=s.entry, tsc_hz=s.tsc_hz)
            elif s.items is not None:
                run.items(s.info, s.items(), tsc_hz=s.tsc_hz)
            else:
                run.branches(s.info, s.branches())


@contextmanager
def _failures(label):
    """Every failure of decoding a stream (``label()`` names it) as one
    CliError line."""
    from hwtrace.analysis.window import WindowError
    from hwtrace.streams import StreamsError
    try:
        yield
    except (StreamsError, WindowError) as e:
        raise CliError(str(e)) from None
    except CliError:
        raise
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as e:   # the decoder is another team's: no traceback
        raise CliError(f"{label()}: decoding failed: "
                       f"{type(e).__name__}: {e}") from None


def loss_parts(totals: dict) -> list[str]:
    """What was lost, short: the recorder's word per stream, then decode
    errors, overflows and gaps with the first offset."""
    out = []
    for e in totals.get("lost", ()):
        out.append(f"{e.file}: {e.loss()}")
    m = totals.get("markers", {})
    first = {}
    for kind, off, _idx, _detail in totals.get("errors", ()):
        if off is not None and kind not in first:
            first[kind] = off
    for kind in ("error", "overflow", "gap"):
        n = m.get(kind, 0)
        if n:
            name = {"error": "decode error", "overflow": "overflow",
                    "gap": "gap"}[kind]
            s = f"{n:,} {name}{'s' if n > 1 else ''}"
            if kind in first:
                s += f" (first at offset {first[kind]:#x})"
            out.append(s)
    return out


def summary_line(label: str, totals: dict) -> str:
    lost = loss_parts(totals)
    tail = "; ".join(lost) if lost else "no gaps"
    if "unmatched" in totals:
        tail += f"; --function {totals['unmatched']}: no activation of it in the trace"
    return (f"hwtrace {label}: {totals['streams']} stream(s), "
            f"{totals['insns']:,} instructions, "
            f"{totals['activations']:,} activations, {tail}")


def nothing_decoded(label: str, totals: dict) -> None:
    """Exit status 1, one line, when not one instruction was decoded:
    the trace says why (errors, loss), or it holds nothing to decode."""
    if totals["insns"]:
        return
    lost = loss_parts(totals)
    samples = [s for s in totals.get("errors", ()) if s[0] != "lost"]
    if samples:
        kind, off, _idx, detail = samples[0]
        at = f" at offset {off:#x}" if off is not None else ""
        why = f"{kind}{at}: {detail}"
    elif lost:
        why = lost[0]
    elif not totals.get("bytes"):
        why = "the trace is empty"
    elif not totals.get("events"):
        why = (f"no Intel PT synchronization point (PSB) in "
               f"{totals['bytes']:,} bytes: not a trace?")
    else:
        why = "tracing never reached an instruction"
    raise CliError(f"{label}: nothing could be decoded ({why})", 1)
