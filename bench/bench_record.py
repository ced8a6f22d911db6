"""Recording with the QEMU engine vs running natively, as ratios (same run).

    python bench/bench_record.py [--repeat N]

Workloads: ``ls -la /usr/bin`` and a CPU-bound C program of about 0.2 s
native (built here with gcc).  For each it prints the native time, the
engine's recording time (QEMU + plugin + PT generation + ToPA writes, in
process, through the trace-control device) and the whole ``hwtrace
record`` command (Python start-up and bundle writing included), as wall
and as CPU time (this machine is shared: CPU time is the steadier number),
and the ratios to native.  Target: <= 40x native including encoding.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CPU_BOUND = r"""
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
static uint64_t mix(uint64_t x) { x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; return x; }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 60000000;
  uint64_t h = 1;
  for (long i = 0; i < n; i++) { h = mix(h + i); if (h & 1) h += 3; }
  printf("%llu\n", (unsigned long long)h);
  return 0; }
"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(fn, repeat: int) -> tuple[float, float]:
    """(median wall, median CPU incl. children) of fn()."""
    walls, cpus = [], []
    for _ in range(repeat):
        c0 = _children_cpu() + _self_cpu()
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() + _self_cpu() - c0)
    return statistics.median(walls), statistics.median(cpus)


def native(argv):
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)


def engine_record(argv):
    from hwtrace.control.config import BufferConfig
    from hwtrace.control.ctl import Ctl, Mode
    from hwtrace.control.device import open_device
    dev = open_device(engine="qemu")
    try:
        dev.set_mode(Mode.CPU)
        cfg = BufferConfig(num_chunks=64, chunk_order=8,
                           ctl=Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN)
        for _ in range(dev.num_cpus):
            dev.alloc_buffer(cfg)
        dev.cpu_mode_alloc()
        dev.cpu_mode_start()
        null = os.open(os.devnull, os.O_WRONLY)
        saved = os.dup(1)
        os.dup2(null, 1)
        try:
            dev.run(argv)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)
            dev.cpu_mode_stop()
        bench_record.generator = dev.engine.generator
    finally:
        dev.close()


def bench_record():
    pass


def cli_record(argv, out):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "hwtrace", "record", "-o", out, "--", *argv],
                   stdout=subprocess.DEVNULL, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None:
        print("needs qemu-user and gcc")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-record-"))
    try:
        src = tmp / "cpu.c"
        src.write_text(CPU_BOUND)
        exe = tmp / "cpu"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
        workloads = [("ls -la /usr/bin", ["ls", "-la", "/usr/bin"]),
                     ("cpu-bound C (~0.2 s)", [str(exe)])]
        engine_record(["/bin/true"])     # build plugin + generator once
        print(f"{'workload':22} {'':9} {'native':>9} {'engine':>9} {'ratio':>7} "
              f"{'record CLI':>11} {'ratio':>7}")
        for name, argv in workloads:
            nw, nc = measure(lambda: native(argv), args.repeat)
            ew, ec = measure(lambda: engine_record(argv), args.repeat)
            rw, rc = measure(lambda: cli_record(argv, str(tmp / "b")), args.repeat)
            for label, n, e, r in (("wall", nw, ew, rw), ("cpu", nc, ec, rc)):
                print(f"{name:22} {label:9} {n:8.3f}s {e:8.3f}s {e / n:6.1f}x "
                      f"{r:10.3f}s {r / n:6.1f}x")
            print(f"{'':22} generator: {getattr(bench_record, 'generator', '?')}")
        print("target: engine <= 40x native (including PT encoding)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
