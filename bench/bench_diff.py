"""Benchmark: ``hwtrace diff`` of two recordings vs decoding them.

Records (emulated engine) ``gzip -9`` compressing two inputs of
``--input-kib`` KiB of text (default 640: ~60 M instructions each) that
differ in one byte at ``--at`` (a fraction of the input, default 0.75:
three quarters of the runs are the same, then gzip's state differs for
good), or the same input twice with ``--same``.  Then, in this process:

* decodes each recording's thread into batches the way diff does
  (``view=True``, every branch ends a record), and counts them;
* runs the whole diff (both decodes, the comparison, re-alignment,
  coverage, the records with symbols and disassembly);

and prints CPU times (less at the mercy of a shared machine than wall
times; wall times beside), the ratio diff / (decode A + decode B), and
the diff's own work (diff minus both decodes) per step.  ``--alone``
also measures that work directly, on batches decoded beforehand and held
in memory (about 40 bytes per record: a few hundred MB per run).

The batch producer is the compiled core where it has a batch decoder,
else the Python twin (``--impl`` forces one); the line ``producer:``
says which ran.

    python bench/bench_diff.py [--input-kib N] [--at F] [--same]
                               [--work DIR] [--impl compiled|python]
                               [--alone] [--max N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workloads import hwtrace, text  # noqa: E402


def record(work: Path, name: str, data: bytes) -> Path:
    # both inputs at paths of one length: argv's layout on the stack (which
    # string functions branch on) is then the same in both runs
    (work / name).mkdir(parents=True, exist_ok=True)
    inp = work / name / "input.txt"
    bundle = work / name / "bundle"
    if (bundle / "manifest.json").exists() and inp.exists() and \
            inp.read_bytes() == data:
        return bundle                       # recorded before, same input
    shutil.rmtree(bundle, ignore_errors=True)
    inp.write_bytes(data)
    gzip = shutil.which("gzip") or "/usr/bin/gzip"
    r = subprocess.run(hwtrace("record", "-o", bundle, "--", gzip, "-9",
                               "-c", inp),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"recording failed: {r.stderr.strip()[-300:]}")
    return bundle


def producer(impl: str | None) -> str:
    from hwtrace.flow import batches as B
    if impl == "python":
        return "Python twin (--impl python)"
    core = B._core(impl)
    if core is not None:
        return "compiled core (hwtrace.flow._c_flow.decode_batches)"
    return "Python twin (the compiled core has no batch decoder here)"


def clock():
    return time.process_time(), time.perf_counter()


def since(t0) -> tuple[float, float]:
    c, w = clock()
    return c - t0[0], w - t0[1]


def decode(bundle: Path, impl):
    """(cpu s, wall s, instructions, records) of the bundle's threads."""
    from hwtrace.diff.threads import all_threads, threads_of
    from hwtrace.streams import open_bundle
    ts = open_bundle(bundle)
    t0 = clock()
    insns = recs = 0
    for th in all_threads(threads_of(ts)):
        for b in th.batches(impl):
            recs += len(b.blocks)
            insns += int(b.blocks["ninsn"].sum())
    cpu, wall = since(t0)
    return cpu, wall, insns, recs


def run_diff(a: Path, b: Path, impl, max_div, cached=None):
    from hwtrace.diff import runs
    from hwtrace.diff.threads import Thread
    from hwtrace.streams import open_bundle
    ta, tb = open_bundle(a), open_bundle(b)
    orig = Thread.batches
    if cached is not None:
        Thread.batches = lambda self, impl=None: iter(cached[self.streams[0].path])
    try:
        t0 = clock()
        recs = list(runs.diff_runs(ta, tb, runs.Options(
            max_divergences=max_div, impl=impl)))
        cpu, wall = since(t0)
    finally:
        Thread.batches = orig
    steps = sum(r["a"]["insns"] for r in recs if r["type"] == "pair_end")
    return cpu, wall, recs, steps


def cache_batches(bundle: Path, impl) -> dict:
    from hwtrace.diff.threads import all_threads, threads_of
    from hwtrace.streams import open_bundle
    out = {}
    for th in all_threads(threads_of(open_bundle(bundle))):
        out[th.streams[0].path] = list(th.batches(impl))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-kib", type=int, default=640)
    ap.add_argument("--at", type=float, default=0.75,
                    help="where B's input differs (fraction of the input)")
    ap.add_argument("--same", action="store_true",
                    help="record the same input twice")
    ap.add_argument("--work", type=Path,
                    help="keep the recordings here (reused when present)")
    ap.add_argument("--impl", choices=("compiled", "python"))
    ap.add_argument("--max", type=int, default=10, help="diff --max")
    ap.add_argument("--alone", action="store_true",
                    help="also time the diff on batches decoded beforehand")
    a = ap.parse_args()

    work = a.work or Path(tempfile.mkdtemp(prefix="hwtrace-bench-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    data = text(a.input_kib)
    other = bytearray(data)
    if not a.same:
        k = int(len(other) * a.at)
        other[k] = ord("#") if other[k] != ord("#") else ord("%")
    ba = record(work, "a", data)
    bb = record(work, "c" if a.same else "b", bytes(other))

    print(f"workload: emulated-engine recordings of `gzip -9` on {a.input_kib} "
          f"KiB of text, " + ("the same input twice" if a.same else
                              f"B's input one byte different at {a.at:.0%}"))
    print(f"bundles:  {ba}  {bb}")
    print(f"producer: {producer(a.impl)}")
    da = decode(ba, a.impl)
    db = decode(bb, a.impl)
    for name, (cpu, wall, insns, recs) in (("A", da), ("B", db)):
        print(f"decode {name}: {insns:,} instructions, {recs:,} records: "
              f"cpu {cpu:.2f} s ({insns / cpu / 1e6:.2f} M insn/s), "
              f"wall {wall:.2f} s")
    dec_cpu, dec_wall = da[0] + db[0], da[1] + db[1]
    cpu, wall, recs, _ = run_diff(ba, bb, a.impl, a.max or None)
    summ = recs[-1]
    print(f"diff A B: cpu {cpu:.2f} s, wall {wall:.2f} s; "
          f"{summ['divergences']} divergence(s) reported, same={summ['same']}")
    print(f"ratio diff / (decode A + decode B): cpu {cpu / dec_cpu:.2f}, "
          f"wall {wall / dec_wall:.2f}")
    own = cpu - dec_cpu
    nrec = da[3] + db[3]
    print(f"diff's own work (diff - decodes): cpu {own:.2f} s "
          f"= {own / nrec * 1e9:.0f} ns per record")
    if a.alone:
        cached = {**cache_batches(ba, a.impl), **cache_batches(bb, a.impl)}
        cpu2, wall2, _recs, _ = run_diff(ba, bb, a.impl, a.max or None, cached)
        print(f"diff on batches decoded beforehand: cpu {cpu2:.2f} s, wall "
              f"{wall2:.2f} s = {cpu2 / nrec * 1e9:.0f} ns per record "
              f"(symbols and start-up included)")
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
