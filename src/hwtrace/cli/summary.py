"""hwtrace summary: where the time went, on one screen.

    hwtrace summary BUNDLE [--top N] [--sort excl|incl|calls]

Top functions by exclusive and inclusive time and instructions, call
counts, and what was lost (overflows, decode errors, gaps).
"""

from __future__ import annotations

import sys

from hwtrace.cli import CliError
from hwtrace.cli.export import add_input_args, decode_into, summary_line


def register(sub) -> None:
    p = sub.add_parser("summary", help="top functions, call counts, lost data",
                       description=__doc__.splitlines()[0])
    add_input_args(p)
    p.add_argument("--top", type=int, default=15, metavar="N",
                   help="functions to list (default 15)")
    p.add_argument("--sort", choices=("excl", "incl", "calls"), default="excl",
                   help="order by exclusive instructions (default), "
                   "inclusive instructions or calls")
    p.set_defaults(func=run)


def _time(t: float, unit: str) -> str:
    if unit == "ns":
        for scale, u in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if t >= scale:
                return f"{t / scale:.2f}{u}"
        return f"{t:.0f}ns"
    return f"{t:,.0f}"


def render(profile, totals: dict, description: str, top: int = 15,
           sort: str = "excl") -> str:
    unit = next(iter(profile.units)) if len(profile.units) == 1 else "mixed"
    key = {"excl": "excl_insns", "incl": "incl_insns", "calls": "calls"}[sort]
    lines = [f"trace: {description}",
             f"{totals['streams']} stream(s), {totals['insns']:,} instructions, "
             f"{totals['activations']:,} activations, clock: "
             f"{'instructions' if unit == 'insns' else unit}"]
    m = profile.markers
    if m:
        parts = [f"{v} {k}" for k, v in sorted(m.items())]
        lines.append("lost data / errors: " + ", ".join(parts))
        for s in profile.marker_samples[:3]:
            off = f"offset {s.offset:#x}: " if s.offset is not None else ""
            lines.append(f"  at insn {s.idx:,}: {off}{s.kind}: {s.detail}")
    else:
        lines.append("lost data / errors: none")
    show_time = unit not in ("insns", "mixed")
    head = f"{'function':<32} {'calls':>8} {'excl insns':>12} {'excl%':>6} {'incl insns':>12}"
    if show_time:
        head += f" {'excl time':>10} {'incl time':>10}"
    lines += ["", head]
    total = max(profile.insns, 1)
    shown = profile.display_names()
    for s in profile.top(key, top):
        name = shown[(s.name, s.func)]
        name = name if len(name) <= 32 else name[:31] + "~"
        row = (f"{name:<32} {s.calls:>8,} {s.excl_insns:>12,} "
               f"{100 * s.excl_insns / total:>5.1f}% {s.incl_insns:>12,}")
        if show_time:
            row += f" {_time(s.excl_time, unit):>10} {_time(s.incl_time, unit):>10}"
        if s.truncated:
            row += f"  ({s.truncated} truncated)"
        lines.append(row)
    more = len(profile.funcs) - min(top, len(profile.funcs))
    if more > 0:
        lines.append(f"... {more} more functions")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from hwtrace.analysis.profile import Profile

    if args.top < 1:
        raise CliError("summary: --top must be at least 1")
    prof = Profile()
    src, totals, progress = decode_into(args, [prof], label="summary")
    sys.stdout.write(render(prof, totals, src.description, args.top, args.sort))
    progress.done(summary_line("summary", totals))
    return 0
