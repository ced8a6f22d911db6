"""Benchmark: a --within window deep inside a program that runs for
seconds natively.

    python bench/bench_branches.py [--iters N] [--inner K] [--repeat R]

The program spins for ~N iterations of integer work (seconds natively),
and every so often calls a chain main -> level1 -> level2 -> level3 ->
target; target does K iterations of a small loop.  Printed, in the same
run: the untraced run's time, ``hwtrace branches --within target --kinds
call,return`` on the same program (the stepper runs everything outside
the windows natively: debug-register trigger, no stepping), the ratio, and
what the windows cost (instructions stepped, per-instruction cost), plus
the time of turning the execution log into records.  Then a window that
is all branches (fib(N) --within fib): the stepping rate and the log ->
records conversion rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of  # noqa: E402

PROG = r"""
#include <stdio.h>
#include <stdlib.h>
static volatile unsigned long sink;
__attribute__((noinline)) unsigned long target(unsigned long x, long k)
{
    for (long i = 0; i < k; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}
__attribute__((noinline)) unsigned long level3(unsigned long x, long k) { return target(x, k) + 1; }
__attribute__((noinline)) unsigned long level2(unsigned long x, long k) { return level3(x, k) + 2; }
__attribute__((noinline)) unsigned long level1(unsigned long x, long k) { return level2(x, k) + 3; }
int main(int argc, char **argv)
{
    long iters = atol(argv[1]), k = atol(argv[2]), every = atol(argv[3]);
    unsigned long x = 1;
    for (long i = 0; i < iters; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        if (i % every == 0)
            x += level1(x, k);
    }
    sink = x;
    printf("%lu\n", x & 0xffff);
    return 0;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300_000_000,
                    help="outer loop iterations (~seconds natively)")
    ap.add_argument("--inner", type=int, default=200, help="loop iterations inside target")
    ap.add_argument("--windows", type=int, default=5, help="how many times target is called")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--fib", type=int, default=18,
                    help="also a window full of branches: fib(N) within fib (0: skip)")
    a = ap.parse_args()
    gcc = shutil.which("gcc")
    if gcc is None:
        print("gcc not found", file=sys.stderr)
        return 1
    from hwtrace.branches import MaskSpec, TriggerSpec, parse_kinds
    from hwtrace.branches.live import trace_live

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "spin.c"
        src.write_text(PROG)
        exe = Path(d) / "spin"
        subprocess.run([gcc, "-O1", "-static", "-no-pie", "-o", str(exe), str(src)], check=True)
        every = max(1, a.iters // a.windows)
        argv = [str(exe), str(a.iters), str(a.inner), str(every)]
        t_native, r = best_of(a.repeat, lambda: subprocess.run(argv, capture_output=True))
        expect = r.stdout

        cli = [sys.executable, "-m", "hwtrace", "branches", "--kinds", "call,return",
               "--within", "target", "--format", "jsonl", "--", *argv]
        t_cli, rc = best_of(a.repeat, lambda: subprocess.run(cli, capture_output=True))
        assert rc.returncode == 0 and rc.stdout.startswith(expect), rc.stderr
        nrec = len(rc.stdout.splitlines()) - 1

        # the same through the API, split into the run and the log -> records
        def live():
            return trace_live(argv, d, TriggerSpec(within="target"),
                              MaskSpec(parse_kinds("call,return")))
        t_run, lr = best_of(a.repeat, live)
        from hwtrace.engines.emulated import stepper
        wins = stepper.windows(lr.log)
        stepped = sum(off.ninsn - on.ninsn for on, off in zip(wins[::2], wins[1::2]))
        t0 = time.perf_counter()
        recs = list(lr.records())
        t_conv = time.perf_counter() - t0
        log_bytes = os.path.getsize(lr.log)

        # the same program with no window at all would single-step every
        # instruction: estimate from the in-window stepping rate
        total_insns_est = a.iters * 12  # ~instructions per outer iteration at -O1
        per_insn = (t_run - t_native) / stepped if stepped else float("nan")

    print(f"program: {a.iters:,} outer iterations, target called {len(wins) // 2} times "
          f"({a.inner:,} loop iterations each)")
    print(f"untraced run:                     {t_native:8.3f} s")
    print(f"hwtrace branches --within target: {t_cli:8.3f} s   "
          f"ratio {t_cli / t_native:5.2f}x   ({nrec} records)")
    print(f"  trace_live (stepper run):       {t_run:8.3f} s   "
          f"ratio {t_run / t_native:5.2f}x")
    print(f"  log -> records:                 {t_conv:8.3f} s   ({len(recs)} records, "
          f"{log_bytes:,} log bytes)")
    print(f"instructions stepped in windows:  {stepped:,}  "
          f"(~{per_insn * 1e6:.2f} us each over the native run)")
    print(f"stepping everything instead: ~{total_insns_est:,} instructions, "
          f"est. {total_insns_est * per_insn:,.0f} s")
    if a.fib:
        busy_window(gcc, a.fib)
    return 0


FIB = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { printf("%ld\n", fib(atol(argv[1]))); return 0; }
"""


def busy_window(gcc: str, n: int) -> None:
    """A window that is all branches: what stepping and the log -> records
    conversion cost per instruction."""
    from hwtrace.branches import MaskSpec, TriggerSpec, parse_kinds
    from hwtrace.branches.live import trace_live
    from hwtrace.engines.emulated import stepper

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "fib.c"
        src.write_text(FIB)
        exe = Path(d) / "fib"
        subprocess.run([gcc, "-O1", "-static", "-no-pie", "-o", str(exe), str(src)], check=True)
        t0 = time.perf_counter()
        subprocess.run([str(exe), str(n)], capture_output=True)
        t_native = time.perf_counter() - t0
        t0 = time.perf_counter()
        lr = trace_live([str(exe), str(n)], d, TriggerSpec(within="fib"),
                        MaskSpec(parse_kinds("all,cond_not_taken")))
        t_run = time.perf_counter() - t0
        w = stepper.windows(lr.log)
        stepped = w[-1].ninsn - w[0].ninsn
        t0 = time.perf_counter()
        nrec = sum(1 for _ in lr.records())
        t_conv = time.perf_counter() - t0
    print(f"\nbusy window: fib({n}) --within fib, every kind: {stepped:,} instructions, "
          f"{nrec:,} records")
    print(f"untraced run:     {t_native:8.3f} s")
    print(f"stepper run:      {t_run:8.3f} s   ({stepped / t_run:,.0f} instructions/s stepped)")
    print(f"log -> records:   {t_conv:8.3f} s   ({stepped / t_conv:,.0f} instructions/s, "
          f"{nrec / t_conv:,.0f} records/s)")


if __name__ == "__main__":
    sys.exit(main())
