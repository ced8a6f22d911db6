"""hwtrace summary: where the time went, on one screen.

    hwtrace summary BUNDLE [--top N] [--sort excl|incl|calls] [--function NAME]

Top functions by exclusive ("excl": in the function itself) and inclusive
("incl": with everything it called; a recursive function counted once)
instructions and time, and how many activations each had (an activation
is one run of a function, from its call to its return).  The program's
own functions (``main`` and what it calls, and threads) come first; what
ran outside ``main`` -- the dynamic loader, libc's start-up, exit
handlers -- is listed apart below.  Lost data and decode errors are
listed first, with their trace offsets.
"""

from __future__ import annotations

import sys

from hwtrace.cli import CliError, help_of


def register(sub) -> None:
    from hwtrace.cli._filters import add_filter_args
    from hwtrace.cli._views import add_input_args
    p = sub.add_parser("summary", help=help_of("summary"),
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    p.add_argument("--top", type=int, default=15, metavar="N",
                   help="functions to list (default 15)")
    p.add_argument("--sort", choices=("excl", "incl", "calls"), default="excl",
                   help="order by exclusive instructions (default), "
                   "inclusive instructions or calls")
    add_filter_args(p)
    p.set_defaults(func=run)


def _time(t: float, unit: str) -> str:
    if unit == "ns":
        for scale, u in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if t >= scale:
                return f"{t / scale:.2f}{u}"
        return f"{t:.0f}ns"
    return f"{t:,.0f}"


_CLOCKS = {"insns": "instructions (no timing in the trace: times are instruction counts)",
           "ns": "ns (TSC)", "tsc": "TSC ticks (frequency unknown)",
           "none": "none (nothing in the view)"}


_NAME_MAX = 72


def render(profile, totals: dict, description: str, top: int = 15,
           sort: str = "excl", legend: bool = False, timebase: str = "",
           narrowed: str = "", same: dict | None = None, place=None) -> str:
    from hwtrace.cli._views import loss_parts
    unit = next(iter(profile.units)) if len(profile.units) == 1 else \
        "mixed" if profile.units else "none"
    key = {"excl": "excl_insns", "incl": "incl_insns", "calls": "calls"}[sort]
    counts_insns = unit == "tsc" and timebase.startswith("instruction count")
    clock = _CLOCKS.get(unit, unit)
    if unit == "insns":
        clock = "instructions"
    if counts_insns:
        clock = "TSC, which counts instructions in this recording (same as the insns columns)"
    lines = [f"trace: {description}",
             f"{totals['streams']} stream(s), {totals['insns']:,} instructions, "
             f"{totals['activations']:,} activations, clock: {clock}"]
    m = profile.markers
    lost = loss_parts(totals) if "lost" in totals or "errors" in totals else []
    if not lost and m:
        lost = [f"{v} {k}" for k, v in sorted(m.items()) if k != "lost"]
    if lost:
        lines.append("lost data / errors: " + "; ".join(lost))
        for s in [s for s in profile.marker_samples if s.kind != "lost"][:3]:
            off = f"offset {s.offset:#x}: " if s.offset is not None else ""
            lines.append(f"  at insn {s.idx:,}: {off}{s.kind}: {s.detail}")
    else:
        lines.append("lost data / errors: none")
    if narrowed:
        lines.append(f"narrowed to: {narrowed}")
    procs = {p: n for p, n in profile.pid_insns.items() if n}
    if len(procs) > 1:
        # each by the program it ran last (a fork's child that exec'd: the new one)
        lines.append("processes: " + ", ".join(
            f"{(profile.programs.get(p) or 'pid').split(' -> ')[-1]} {p} "
            f"{100 * n / max(profile.insns, 1):.1f}%" if p >= 0 else
            f"unknown {100 * n / max(profile.insns, 1):.1f}%"
            for p, n in sorted(procs.items(), key=lambda x: -x[1])))
    show_time = unit not in ("insns", "mixed", "none") and not counts_insns
    tu = "" if unit == "ns" else f" ({unit})"
    total = max(profile.insns, 1)
    split = profile.has_startup
    funcs = profile.part("program") if split else profile.funcs
    every = profile.funcs
    start = profile.part("startup") if split else {}
    if same:
        funcs, every = profile.merged(funcs, same), profile.merged(every, same)
        start = profile.merged(start, same)
    shown = profile.display_names(every, label=None if place is None else (
        lambda n, f: (place(n, f) or (None,))[0]))
    k = max(3, min(5, top // 3))
    tops = [profile.top(key, top, funcs), profile.top(key, k, start) if split else []]
    # the name column as wide as the names shown (C++ and Rust names are
    # long), from 32 to 72 characters; a longer one is cut with "~"
    width = max([32] + [min(len(shown[(s.name, s.func)]), _NAME_MAX)
                        for t in tops for s in t])
    head = (f"{'function':<{width}} {'calls':>8} {'excl insns':>12} {'excl%':>6} "
            f"{'incl insns':>12}")
    if show_time:
        head += f" {'excl time':>10} {'incl time':>10}"
    lines += ["", head + (tu if show_time else "")]

    def rows(ss):
        out = []
        for s in ss:
            name = shown[(s.name, s.func)]
            name = name if len(name) <= width else name[:width - 1] + "~"
            row = (f"{name:<{width}} {s.calls:>8,} {s.excl_insns:>12,} "
                   f"{100 * s.excl_insns / total:>5.1f}% {s.incl_insns:>12,}")
            if show_time:
                row += f" {_time(s.excl_time, unit):>10} {_time(s.incl_time, unit):>10}"
            if s.truncated:
                row += f"  ({s.truncated} truncated)"
            out.append(row)
        return out

    lines += rows(tops[0])
    more = len(funcs) - min(top, len(funcs))
    if more > 0:
        lines.append(f"... {more} more functions")
    if split:
        n = sum(s.excl_insns for s in start.values())
        lines.append(f"--- outside main (dynamic loader, libc start-up, exit): "
                     f"{n:,} instructions, {100 * n / total:.1f}% ---")
        lines += rows(tops[1])
        more = len(start) - min(k, len(start))
        if more > 0:
            lines.append(f"... {more} more functions")
    if legend:
        if lost:
            lines += ["", "incomplete: the counts cover what could be decoded; "
                      "activations cut by a loss are marked truncated."]
        lines += ["",
                  "calls: activations (runs of the function, from call to return); "
                  "excl: in the function itself;",
                  "incl: with everything it called (a recursive function counted once); "
                  "excl%: of all instructions."]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from hwtrace.analysis.profile import Profile
    from hwtrace.cli._filters import describe, window_of
    from hwtrace.cli._views import decode_into, nothing_decoded, summary_line

    if args.top < 1:
        raise CliError("summary: --top must be at least 1")
    prof = Profile()
    inp, totals, progress = decode_into(args, [prof], label="summary",
                                        window=window_of(args))
    prof.close()
    nothing_decoded("summary", totals)
    # one function loaded by several processes at their own bases: one row
    place = inp.traces.function_places() if inp.traces is not None else None
    sys.stdout.write(render(prof, totals, inp.description, args.top, args.sort,
                            legend=True, timebase=inp.timebase,
                            narrowed=describe(args),
                            same=prof.same_functions(place) if place else None,
                            place=place))
    progress.done(summary_line("summary", totals))
    return 0
