"""hwtrace branches: the calls, returns and branches a process took.

    hwtrace branches [--kinds K,...] [--pid P] [--tid T] [--range A-B|SYM]
                     [--within FUNC | --start X --stop Y] [--format text|jsonl]
                     (BUNDLE | -- PROGRAM ARGS... | --attach PID)

From a live process (launched, or attached to) through the ptrace stepper:
code outside the trigger windows runs natively; the program's output and
exit status pass through (records are written after it ends).  From a
bundle (or a raw .pt / flow-items .jsonl with --elf): the decoded trace,
with the same windows and mask.  --lines adds DWARF file:line.

An end in untraced code (the kernel side of a syscall or interrupt, where
tracing starts) is unknown: jsonl ``null``, text ``?``
(hwtrace.branches.records explains which records have one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from hwtrace.cli import CliError, help_of, warn


def register(sub) -> None:
    p = sub.add_parser("branches", help=help_of("branches"),
                       description=__doc__.splitlines()[0])
    p.add_argument("--kinds", metavar="K,...",
                   help="kinds to keep: all (default; every kind but cond_not_taken), "
                        "call, return, jump, cond, cond_not_taken, indirect_call, "
                        "indirect_jump, far, syscall, sysret, interrupt, iret")
    p.add_argument("--pid", type=int, action="append", default=[], metavar="P",
                   help="only this process (repeatable)")
    p.add_argument("--tid", type=int, action="append", default=[], metavar="T",
                   help="only this thread (repeatable)")
    p.add_argument("--range", action="append", default=[], metavar="A-B|SYM",
                   help="only branches from [A, B) or from function SYM (repeatable)")
    p.add_argument("--within", metavar="FUNC",
                   help="on at FUNC's entry, off when that activation returns")
    p.add_argument("--start", metavar="X", help="on when execution reaches X (symbol or address)")
    p.add_argument("--stop", metavar="Y", help="off when execution reaches Y")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--lines", action="store_true",
                   help="add source file:line (DWARF) of from and to where known")
    p.add_argument("-o", "--output", metavar="FILE", help="write records here (default stdout)")
    p.add_argument("--attach", type=int, metavar="PID", help="trace this running process")
    p.add_argument("--duration", type=float, metavar="S",
                   help="with --attach: detach after S seconds (default: on Ctrl-C or exit)")
    p.add_argument("--elf", action="append", default=[], metavar="FILE[:BIAS]",
                   help="BUNDLE: symbols (and code) of FILE loaded at BIAS")
    p.add_argument("--image-path", action="append", default=[], metavar="DIR",
                   help="BUNDLE: look for the recorded executables in DIR too")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="BUNDLE | -- PROGRAM ARGS",
                   help="a trace bundle (or a .pt / flow-items .jsonl with --elf), "
                        "or the program to run")
    p.set_defaults(func=run, _parser=p)


def _specs(args):
    from hwtrace.branches import MaskSpec, TriggerSpec, parse_kinds
    if args.within is not None and (args.start is not None or args.stop is not None):
        raise CliError("branches: --within excludes --start/--stop")
    try:
        kinds = parse_kinds(args.kinds)
    except ValueError as e:
        raise CliError(f"branches: {e}") from None
    mask = MaskSpec(kinds, frozenset(args.pid), frozenset(args.tid), tuple(args.range))
    trig = TriggerSpec(args.start, args.stop, args.within)
    return trig, mask


class _Names:
    """Cached address -> 'func+0xoff', 'FILE+0xLINK' in an image but no
    function, None in no image: one record at a time, the reference the
    vectorized :class:`hwtrace.branches.format.Namer` is checked against."""

    def __init__(self, symbolizer):
        self.sym = symbolizer
        self.cache: dict[int, str | None] = {}

    def __call__(self, addr: int) -> str | None:
        c = self.cache
        if addr in c:
            return c[addr]
        img = self.sym.image_for(addr) if self.sym is not None else None
        r = img.lookup(addr) if img is not None else None
        s = None
        if r is not None:
            start, name = r
            s = name if start == addr else f"{name}+{addr - start:#x}"
        elif img is not None:
            s = img.unnamed(addr)
        if len(c) < 1 << 20:
            c[addr] = s
        return s


def _end(addr, names, lines) -> str:
    """One end of a text record: ``0x... sym (file:line)``, or ``?`` for
    an end in untraced code (None)."""
    if addr is None:
        return "?"
    n = names(addr)
    if lines is not None:
        ln = lines(addr)
        n = f"{n or ''} ({ln})".strip() if ln else n
    return f"{addr:#x}{' ' + n if n else ''}"


def format_text(rec, names, lines=None) -> str:
    d = "" if rec.depth is None else f"{rec.depth:>3} "
    who = f"{rec.pid}/{rec.tid}" if rec.pid is not None else (
        str(rec.tid) if rec.tid is not None else "-")
    return (f"{who:>13} {d}{rec.kind:<14} {_end(rec.from_, names, lines)}"
            f" -> {_end(rec.to, names, lines)}")


def _open_out(path):
    if path is None:
        return sys.stdout.buffer, False
    try:
        return open(path, "wb", buffering=1 << 20), True
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}") from None


def _emit(chunks, symbolizer, args, traces=None) -> int:
    """Write record chunks (numpy, records.dtype) as they come (``traces``:
    the bundle's TraceSet, whose processes may need names of their own)."""
    from hwtrace.branches.format import Namer, SpaceNamers, format_chunk, format_spaced
    from hwtrace.branches.records import concat
    out, close = _open_out(args.output)
    namer = Namer(symbolizer, lines=args.lines)
    spaced = traces.space_lookup() if traces is not None else None
    if spaced is None:
        def text(a):
            return format_chunk(a, namer, args.format)
    else:
        namers = SpaceNamers(traces.spaces, spaced, namer, lines=args.lines)

        def text(a):
            return format_spaced(a, namers, args.format)
    n = 0
    try:
        sys.stdout.flush()
        held, nheld, first = [], 0, True
        for a in chunks:
            if len(a):
                held.append(a)
                nheld += len(a)
                # the first records at once; then a few thousand at a time
                if first or nheld >= 1 << 15:
                    out.write(text(concat(held)))
                    out.flush() if first else None
                    n += nheld
                    held, nheld, first = [], 0, False
        if held:
            out.write(text(concat(held)))
            n += nheld
        out.flush()
    finally:
        if close:
            out.close()
    return n


def run(args) -> int:
    from hwtrace.branches.resolve import SymbolNotFound

    target = list(args.target)
    if len(target) > 1 and target[0] != "--" and getattr(args, "_parser", None):
        # options after the BUNDLE (REMAINDER swallowed them): parse them too
        args.target = []
        args._parser.parse_args(target[1:], namespace=args)
        if args.target:
            raise CliError(f"branches: one BUNDLE expected, got {' '.join(target)!r} "
                           "(a program goes after --)")
        target = target[:1]
    trig, mask = _specs(args)
    is_prog = bool(target) and target[0] == "--"
    if is_prog:
        target = target[1:]
        if not target:
            raise CliError("branches: no program given after --")
    given = sum((bool(target), args.attach is not None))
    if given == 0:
        raise CliError("branches: give a BUNDLE, -- PROGRAM ARGS..., or --attach PID")
    if given > 1:
        raise CliError("branches: give one of BUNDLE, -- PROGRAM ARGS..., --attach PID")
    if args.duration is not None and args.attach is None:
        raise CliError("branches: --duration goes with --attach")
    try:
        if is_prog or args.attach is not None:
            return _live(args, target if is_prog else args.attach, trig, mask)
        if len(target) != 1:
            raise CliError(f"branches: one BUNDLE expected, got {' '.join(target)!r} "
                           "(a program goes after --)")
        return _decoded(args, target[0], trig, mask)
    except SymbolNotFound as e:
        raise CliError(f"branches: {e}") from None
    except ValueError as e:
        raise CliError(f"branches: {e}") from None


def _live(args, target, trig, mask) -> int:
    from hwtrace.branches.live import LiveError, trace_live
    from hwtrace.engines.emulated.execlog import ExecLogError

    with tempfile.TemporaryDirectory(prefix="hwtrace-branches-") as d:
        try:
            lr = trace_live(target, d, trig, mask, timeout=args.duration)
        except LiveError as e:
            raise CliError(f"branches: {e}") from None
        try:
            from hwtrace.branches import iter_arrays
            _emit(iter_arrays(lr.records()), lr.symbolizer, args)
        except ExecLogError as e:
            raise CliError(f"branches: {e}") from None
    note = stepping_note(lr.info)
    if note:
        print(f"hwtrace branches: note: {note}", file=sys.stderr)
    status = lr.status
    return 128 - status if status < 0 else status


def stepping_note(info: dict) -> str | None:
    """The spec's "clear note" when block-stepping could not be used."""
    if info.get("block_step") == "ignored":
        return ("this machine ignores DEBUGCTL.BTF (PTRACE_SINGLEBLOCK stops after "
                "every instruction): single-stepped instead "
                f"({info.get('steps', 0):,} stops)")
    return None


def _decoded(args, path, trig, mask) -> int:
    from hwtrace.branches.decoded import open_decoded
    from hwtrace.cli._inputs import open_input
    from hwtrace.streams import StreamsError
    inp = open_input(path, args.elf, args.image_path)
    if any(s.branches is not None for s in inp.streams):
        raise CliError(f"branches: {path}: holds branch records already")
    tr = open_decoded(inp, trig, mask)
    try:
        _emit(tr.arrays(), tr.symbolizer, args, inp.traces)
    except StreamsError as e:
        raise CliError(f"branches: {e}") from None
    except (CliError, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as e:      # the decoder is another team's: no traceback
        raise CliError(f"branches: decoding failed: {type(e).__name__}: {e}") from None
    # what the recorders lost (the records just stop there), as decode says it
    for s in inp.streams:
        e = getattr(s, "entry", None)
        if e is not None and e.lossy:
            sys.stdout.flush()
            warn(f"{s.info.label()}: recorded with loss: {e.loss()}")
    return 0
