"""The options that narrow a view (``calls``, ``summary``, ``export``):
``--function``, ``--max-depth``, ``--min-duration``, ``--insns``,
``--time``, parsed into a :class:`hwtrace.analysis.window.ViewFilter`."""

from __future__ import annotations

from hwtrace.cli import CliError


def add_filter_args(p) -> None:
    g = p.add_argument_group("narrowing the view")
    g.add_argument("--function", metavar="NAME",
                   help="only activations of NAME and what they call (depths "
                        "count from NAME)")
    g.add_argument("--max-depth", type=int, metavar="N",
                   help="leave out activations deeper than N (0 = outermost only)")
    g.add_argument("--min-duration", metavar="D",
                   help="leave out activations shorter than D: a time (10us, 2ms, "
                        "1s) or an instruction count (5000, 5000insns)")
    g.add_argument("--insns", metavar="A..B",
                   help="only instructions A to B of each stream (activations "
                        "cut at the edges)")
    g.add_argument("--time", metavar="A..B",
                   help="only from time A to B after the trace's start (10ms..20ms; "
                        "activations cut at the edges)")


def window_of(args):
    """A factory ``f(builder) -> filter`` for the pipeline, or None."""
    from hwtrace.analysis.window import ViewFilter
    md = getattr(args, "max_depth", None)
    if md is not None and md < 0:
        raise CliError(f"{args.func.__module__.rsplit('.', 1)[-1]}: "
                       "--max-depth must be 0 or more")
    fn = getattr(args, "function", None)
    mind = _duration(getattr(args, "min_duration", None))
    ins = _range("--insns", getattr(args, "insns", None), _count)
    tim = _range("--time", getattr(args, "time", None), _time)
    if ins and tim:
        raise CliError("give --insns or --time, not both")
    if fn is None and md is None and mind is None and ins is None and tim is None:
        return None
    origin: dict = {}           # the first stream's start, for --time
    found: list = []            # an activation of --function began
    f = lambda b: ViewFilter(b, function=fn, max_depth=md, min_duration=mind,  # noqa: E731
                             insns=ins, time=tim, origin=origin, found=found)
    f.function, f.found = fn, found
    # a --time window counts from the first stream's start: its streams
    # are taken one after the other (hwtrace.export.interleave)
    f.by_time = tim is not None
    return f


_UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def _count(text: str, opt: str):
    t = text.strip().replace("_", "").replace(",", "")
    if t.endswith("insns"):
        t = t[:-5]
    try:
        v = int(t, 0)
    except ValueError:
        raise CliError(f"{opt}: bad instruction count: {text}") from None
    if v < 0:
        raise CliError(f"{opt}: negative: {text}")
    return v


def _time(text: str, opt: str):
    """(value, unit): unit "ns" for a time with a unit, None for a bare
    number (the clock's own unit)."""
    t = text.strip()
    for u in ("ns", "us", "ms", "s"):
        if t.endswith(u) and (u != "s" or not t.endswith(("ns", "us", "ms"))):
            try:
                v = float(t[:-len(u)])
            except ValueError:
                raise CliError(f"{opt}: bad time: {text}") from None
            if v < 0:
                raise CliError(f"{opt}: negative: {text}")
            return (v * _UNITS[u], "ns")
    try:
        v = float(t)
    except ValueError:
        raise CliError(f"{opt}: bad time: {text} (give a unit: ns, us, ms, s)") from None
    if v < 0:
        raise CliError(f"{opt}: negative: {text}")
    return (v, None)


def _duration(text):
    if text is None:
        return None
    t = text.strip()
    if t.endswith("insns") or t.replace("_", "").replace(",", "").isdigit():
        return (float(_count(t, "--min-duration")), "insns")
    return _time(t, "--min-duration")


def _range(opt: str, text, one):
    if text is None:
        return None
    a, sep, b = text.partition("..")
    if not sep:
        raise CliError(f"{opt}: give A..B (either side may be empty)")
    lo = one(a, opt) if a.strip() else None
    hi = one(b, opt) if b.strip() else None
    # an empty window is a slip, not a question (a time with a unit and a
    # bare clock count are not compared: the clock's rate says later)
    if lo is not None and hi is not None and (
            lo > hi if one is _count else lo[1] == hi[1] and lo[0] > hi[0]):
        raise CliError(f"{opt}: {text}: A is after B")
    return (lo, hi)


def describe(args) -> str:
    """The narrowing options in words ('' if none)."""
    parts = []
    if getattr(args, "function", None):
        parts.append(f"activations of {args.function} and what they call")
    if getattr(args, "max_depth", None) is not None:
        parts.append(f"depth at most {args.max_depth}")
    if getattr(args, "min_duration", None):
        parts.append(f"at least {args.min_duration} long")
    for opt in ("insns", "time"):
        v = getattr(args, opt, None)
        if v:
            what = "instructions" if opt == "insns" else "time"
            parts.append(f"{what} {v} (activations cut at its edges)")
    return "; ".join(parts)
