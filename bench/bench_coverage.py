"""Benchmark: edge coverage (``hwtrace coverage --edges``) vs libipt's
instruction flow decode (``ptoracle insn --summary``) on the same trace.

Edge coverage needs the whole instruction flow but no instruction records:
the compiled flow core walks cached straight-line runs and counts (branch,
next instruction) pairs.  Prints instructions/s, MB/s and the speed ratio
against libipt 2.0.5 in the same run (CPU times of the child processes,
start-up included); also the in-process API (hwtrace.flow.fast.edges) time
without process start-up.

The trace: as bench_decode.py (an emulated-engine recording of ``gzip -9``
on ``--input-kib`` KiB of text by default, or ``--bundle DIR``).

    python bench/bench_coverage.py [--input-kib N] [--bundle DIR]
                                   [--stream NAME] [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import (best, ensure_oracle, hwtrace, line,  # noqa: E402
                          oracle_run, trace_for)


def api_time(pt: Path, opts: list[str], repeat: int):
    """CPU seconds of fast.edges() in this process (images loaded first)."""
    from hwtrace.cli import build_parser
    from hwtrace.cli import decode as D
    from hwtrace.flow import fast
    args = build_parser().parse_args(["decode", "--pt", str(pt), *opts])
    cfg = D._config(args, lambda s: None)
    image = D._image(args)
    data = pt.read_bytes()
    t = None
    for _ in range(repeat):
        t0 = time.process_time()
        e = fast.edges(data, image, cfg)
        spent = time.process_time() - t0
        t = spent if t is None else min(t, spent)
    return t, e


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--stream")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--input-kib", type=int, default=512)
    ap.add_argument("--timing", action="store_true",
                    help="record with TSC/MTC/CYC packets on")
    a = ap.parse_args()
    ensure_oracle()

    pt, opts, what, tmp = trace_for(a)
    size = pt.stat().st_size
    mb = size / 1e6
    to, insns_o = oracle_run(pt, opts, a.repeat)
    print(f"trace: {what}: {size} bytes")
    print(line("ptoracle insn --summary (libipt 2.0.5)", insns_o, to, mb, to))
    tc, out = best(hwtrace("coverage", "--edges", "--pt", pt, *opts,
                           "--quiet"), a.repeat)
    summary = out.strip().splitlines()[-1]
    insns = int(summary.split("insns: ")[1].rstrip("."))
    print(line("hwtrace coverage --edges --quiet", insns, tc, mb, to) +
          ("" if insns == insns_o else
           f"  [instruction counts differ: {insns} vs {insns_o}]"))
    print(f"  {summary}")
    ta, e = api_time(pt, opts, max(a.repeat, 2))
    print(line("fast.edges() in-process, warm (no start-up)", e.insns, ta,
               mb, to) + ("" if e.compiled else "  [Python twin ran]"))
    print("(CPU times; best of --repeat)")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
