"""Benchmark: the compiled core's segment jobs on several cores
(hwtrace.flow.fast_parallel, run by hwtrace.jobs) against the sequential
compiled decode and libipt.

The trace: a recording of ``gzip -9`` by the emulated engine (``--timing``:
with TSC/MTC/CYC), repeated to ``--mb`` MB.  Prints, on that same file in
the same run:

- the sequential compiled count (``fast.count``: what ``hwtrace decode
  --quiet --stat`` runs on one core), wall time;
- ``jobs.count(jobs=N)``: wall time, the ratio to the sequential one
  (target 1.7x on 2 cores) and whether the counts are identical;
- ``jobs.batches(jobs=N)``: the same for batches (flatten()-equal);
- ``ptoracle blk --summary`` (libipt 2.0.5's block decoder) on the same
  input, wall time, for reference.

Times are best of ``--repeat`` (the machine is shared).  Both hwtrace
figures include what the command pays: reading the trace (the sequential
one from the page cache into memory, the parallel one through each job's
read-only map) and loading the images; the parallel one also its process
pool and every job's cold block cache.

    python bench/bench_fast_parallel.py [--mb 30] [--jobs 2] [--timing]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workloads as W  # noqa: E402
from _common import ptoracle  # noqa: E402
from bench_parallel import repeated  # noqa: E402


def _config(manifest: dict):
    from hwtrace.flow.config import FlowConfig
    return FlowConfig(mtc_freq=manifest.get("mtc_freq", 0),
                      nom_freq=manifest.get("nom_freq", 0),
                      cpuid_0x15_eax=manifest.get("cpuid_0x15_eax", 0),
                      cpuid_0x15_ebx=manifest.get("cpuid_0x15_ebx", 0))


def _cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def best(n: int, fn):
    """(best wall s, CPU s of that run -- this process and its finished
    children, e.g. the pool's workers --, last result)."""
    t, cpu, r = float("inf"), 0.0, None
    for _ in range(n):
        c0 = _cpu()
        t0 = time.perf_counter()
        r = fn()
        w = time.perf_counter() - t0
        if w < t:
            t, cpu = w, _cpu() - c0
    return t, cpu, r


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def cores_available(jobs: int, n: int = 10_000_000) -> float:
    """How many cores the scheduler gives ``jobs`` busy processes right now
    (1 on a machine whose other cores are taken)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    t0 = time.perf_counter()
    _spin(n)
    one = time.perf_counter() - t0
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as p:
        t0 = time.perf_counter()
        list(p.map(_spin, [n] * jobs))
        many = time.perf_counter() - t0
    return jobs * one / many


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-kib", type=int, default=256)
    ap.add_argument("--mb", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--segments", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timing", action="store_true")
    a = ap.parse_args()

    from hwtrace import jobs
    from hwtrace.flow import batches as B
    from hwtrace.flow import fast, fast_parallel
    if fast.CORE is None:
        sys.exit(f"bench: FAILED -- no compiled flow core "
                 f"({fast.STATUS.reason})")
    print(f"flow core: {fast.STATUS.describe()}")

    with tempfile.TemporaryDirectory(prefix="bench-fpar-") as tmp:
        work = Path(tmp)
        bundle = W.record(work, "gzip", a.input_kib, a.timing)
        if bundle is None:
            sys.exit("bench: cannot record gzip")
        manifest = json.loads((bundle / "manifest.json").read_text())
        stream = max(manifest["streams"], key=lambda s: s.get("size", 0))
        src = bundle / stream["file"]
        img = subprocess.run([sys.executable, "-m", "hwtrace", "images",
                              "--pt", src.name, bundle], capture_output=True,
                             text=True, check=True).stdout
        opts = shlex.split(img)
        pairs = [(opts[i].lstrip("-"), opts[i + 1])
                 for i in range(0, len(opts), 2)]
        cfg = _config(manifest)
        big = repeated(src, work / "big.pt", a.mb)
        size = big.stat().st_size
        print(f"trace: gzip -9 of {a.input_kib} KiB{' (timing on)' if a.timing else ''}"
              f", {src.stat().st_size} bytes repeated to {size / 1e6:.1f} MB; "
              f"{os.cpu_count()} cores, jobs={a.jobs}")

        def sequential():
            image = jobs.load_image(pairs)
            return fast.count(big.read_bytes(), image, cfg, "block")

        def par():
            return jobs.count_stats(str(big), 0, None, pairs, cfg, True,
                                    a.jobs, segments=a.segments)

        def digest(batches):
            """(records, items, a digest of the records): the stream,
            without holding it"""
            import hashlib
            h = hashlib.blake2b(digest_size=16)
            n = m = 0
            for b in batches:
                h.update(b.blocks.tobytes())
                n += len(b.blocks)
                m += len(b.items)
            return n, m, h.hexdigest()

        def seq_batches():
            image = jobs.load_image(pairs)
            return digest(B.batches(big.read_bytes(), image, cfg,
                                    impl="compiled"))

        def par_batches():
            return digest(jobs.batches(str(big), 0, None, pairs, cfg,
                                       jobs=a.jobs, segments=a.segments))

        t_seq, u_seq, c_seq = best(a.repeat, sequential)
        t_par, u_par, (c_par, st) = best(a.repeat, par)
        same = "identical" if c_par == c_seq else f"DIFFERENT ({c_par})"
        print(f"sequential compiled count : {t_seq:7.3f} s ({u_seq:6.2f} s CPU)  "
              f"{c_seq.insns / t_seq / 1e6:7.1f} M insn/s  "
              f"({c_seq.insns} insns, {c_seq.blocks} blocks)")
        print(f"fast_parallel jobs={a.jobs}     : {t_par:7.3f} s ({u_par:6.2f} s CPU)  "
              f"{c_seq.insns / t_par / 1e6:7.1f} M insn/s  counts {same}; "
              f"{st['segments']} segments, {len(st['reruns'])} re-runs")
        tb_seq, _, b_seq = best(a.repeat, seq_batches)
        tb_par, _, b_par = best(a.repeat, par_batches)
        bsame = "identical records" if b_seq == b_par else "DIFFERENT"
        print(f"batches sequential / jobs : {tb_seq:7.3f} s / {tb_par:7.3f} s "
              f"({tb_seq / tb_par:.2f}x), {b_seq[0]} records, {bsame}")
        print(f"parallel speed-up (wall)  : {t_seq / t_par:.2f}x "
              f"(target 1.7x); load average {os.getloadavg()[0]:.1f}, "
              f"cores {a.jobs} busy processes get now: "
              f"{cores_available(a.jobs):.2f}")
        # On a shared machine the wall ratio is what the scheduler grants;
        # the work itself: each job's CPU time, run one after the other.
        jobs_cpu = []
        import mmap
        with open(big, "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            cuts = fast_parallel.cut_points(mm, 0, size, st["segments"])
        for s, e in zip([None] + cuts, cuts + [None]):
            t0 = time.process_time()
            jobs.run_segment(jobs.SegmentJob(
                str(big), 0, size, tuple(pairs), cfg, True, s, e))
            jobs_cpu.append(time.process_time() - t0)
        print(f"job CPU seconds           : "
              f"{' '.join(f'{t:.2f}' for t in jobs_cpu)} (sum "
              f"{sum(jobs_cpu):.2f}); sequential CPU / slowest job: "
              f"{u_seq / max(jobs_cpu):.2f}x (the speed-up on idle cores)")
        exe = ptoracle()
        if exe is None:
            print("ptoracle: unavailable (no compiler or libipt)")
            return 0
        oopts = opts + W._manifest_opts(bundle)
        argv = [str(exe), "blk", str(big), *oopts, "--summary"]
        t_ora, _, r = best(1, lambda: subprocess.run(argv, capture_output=True,
                                                   text=True))
        if r.returncode != 0:
            print(f"ptoracle failed: {r.stderr.strip()[-200:]}")
            return 0
        o_insns = json.loads(r.stdout.splitlines()[-1])["insns"]
        print(f"ptoracle blk --summary    : {t_ora:7.3f} s  "
              f"{o_insns / t_ora / 1e6:7.1f} M insn/s  ({o_insns} insns)")
        print(f"fast_parallel vs libipt   : {t_ora / t_par:.1f}x  "
              f"(sequential compiled: {t_ora / t_seq:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
