"""Benchmark: edge coverage (``hwtrace coverage --edges``, the compiled
flow core's edge counts) against libipt's block decoder, ``ptoracle blk
FILE ... --summary``, timed in the same run on the same inputs (the real
captures and recordings of bench/_workloads.py).  Target (issue 15): at
least 4x libipt's block decoder.  Also the in-process edge count
(``hwtrace.flow.fast.edges``) without process start-up: the best of
``--repeat`` calls in this process (a warm heap: the memory an earlier
call freed is reused) and, apart, the first call in a fresh process (its
tables fault in fresh pages, as the command's one call does): the
difference is what a command pays for first-touch memory, not start-up.

Prints which flow core the children run and stops with an error if it is
the Python twin.  A stream from a bundle is also timed as ``hwtrace
coverage --edges DIR``.  The hwtrace children run with a warm bytecode
cache, as an installed hwtrace has it (``--cold-bytecode``: compiled in
every process); the output says which, and the start-up floor.

    python bench/bench_coverage.py [--repeat N] [--input-kib N] [--timing]
                                   [--work DIR] [--only captures|recordings]
                                   [--cold-bytecode]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _workloads as W  # noqa: E402


def api_time(w: W.Workload, repeat: int):
    """CPU seconds of fast.edges() in this process (images loaded first)."""
    from hwtrace.flow import fast
    data, image, cfg = W.load(w)
    t = None
    for _ in range(repeat):
        t0 = time.process_time()
        e = fast.edges(data, image, cfg)
        spent = time.process_time() - t0
        t = spent if t is None else min(t, spent)
    if not e.compiled:
        sys.exit("bench: FAILED -- fast.edges ran the Python twin")
    return t, e


#: the first fast.edges() call of a fresh process, its CPU seconds printed
_FIRST = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import _workloads as W
from hwtrace.flow import fast
pt, opts = json.loads(sys.argv[2])
data, image, cfg = W.load(W.Workload("", Path(pt), opts))
t0 = time.process_time()
fast.edges(data, image, cfg)
print(time.process_time() - t0)
"""


def first_call_time(w: W.Workload, repeat: int, env: dict) -> float:
    """Least CPU seconds of the first fast.edges() call of a fresh
    process (images loaded first), over ``repeat`` processes."""
    arg = json.dumps([str(w.pt), [str(o) for o in w.opts]])
    best = None
    for _ in range(repeat):
        r = subprocess.run([sys.executable, "-c", _FIRST,
                            str(Path(__file__).resolve().parent), arg],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"bench: first call: {r.stderr.strip()[-400:]}")
        t = float(r.stdout.split()[-1])
        best = t if best is None else min(best, t)
    return best


def main() -> int:
    ap = W.parser(__doc__)
    a = ap.parse_args()
    with W.session(a) as (ch, loads):
        for w in loads:
            to, ni = W.oracle_blk(w, a.repeat)
            tc, out = ch.best(W.hwtrace("coverage", "--edges", "--pt", w.pt,
                                        *w.opts, "--quiet"), a.repeat)
            summary = out.strip().splitlines()[-1]
            n = int(summary.split("insns: ")[1].rstrip("."))
            ta, e = api_time(w, a.repeat)
            tf = first_call_time(w, a.repeat, ch.env)
            print(f"{w.name}: {ni} insns (libipt 2.0.5), {summary}")
            print(f"  ptoracle blk --summary          {to:7.3f} s CPU "
                  f"{ni / to / 1e6:7.1f} M insn/s")
            print(f"  hwtrace coverage --edges        {tc:7.3f} s CPU "
                  f"{n / tc / 1e6:7.1f} M insn/s  {to / tc:5.2f}x libipt "
                  f"[compiled]")
            if w.bundle is not None:
                tb, out = ch.best(W.hwtrace("coverage", "--edges", "--quiet",
                                            w.bundle), a.repeat)
                nb = int(out.strip().splitlines()[-1].split("insns: ")[1]
                         .rstrip("."))
                vs = f"{to / tb:5.2f}x libipt" if nb == ni else \
                    "(all its streams)"
                print(f"  hwtrace coverage --edges DIR    {tb:7.3f} s CPU "
                      f"{nb / tb / 1e6:7.1f} M insn/s  {vs} [compiled]")
            print(f"  fast.edges() in process         {ta:7.3f} s CPU "
                  f"{e.insns / ta / 1e6:7.1f} M insn/s  {to / ta:5.2f}x "
                  f"libipt (no start-up)")
            print(f"  fast.edges() first call         {tf:7.3f} s CPU "
                  f"{e.insns / tf / 1e6:7.1f} M insn/s  {to / tf:5.2f}x "
                  f"libipt (fresh process, no start-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
