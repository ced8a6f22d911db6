"""Benchmark: edge coverage (``hwtrace coverage --edges``, the compiled
flow core's edge counts) against libipt's block decoder, ``ptoracle blk
FILE ... --summary``, timed in the same run on the same inputs (the real
captures and recordings of bench/_workloads.py).  Target (issue 15): at
least 4x libipt's block decoder.  Also the in-process edge count
(``hwtrace.flow.fast.edges``) without process start-up.

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
