"""Benchmark: peak memory vs trace size, and what decoding from a file
mapping costs in speed.

The trace is an emulated recording of ``gzip -9`` (``hwtrace record``),
repeated to each size, as bench_parallel.py builds it.

1. **Peak RSS vs size** (VmHWM of the ``hwtrace`` process; the CLI
   maps the trace read-only and drops the pages behind the decode, see
   hwtrace.cli._tracemap), each command on ``--sizes`` MB:

   - ``dump --stat`` (compiled packet scan, windowed count),
   - ``decode --quiet --stat`` (the compiled flow core: it calls the
     mapping's release hook at PSBs as it moves on),
   - ``decode --quiet`` without images (the Python query/block decoders
     walking the whole trace: an error and a resync at every PSB),

   then on smaller sizes (``--small-sizes``; they run ~25 s/MB and ~1 s/MB)
   ``decode --quiet`` with the images (the Python flow decoders) and
   ``dump --quiet`` (the ptdump formatter).  With ``--before``, each is
   also run with the trace read into bytes (how the CLI read it before
   mapping) for comparison.

2. **Speed, bytes vs mapped** (in-process, best of ``--repeat``) on a
   ``--speed-mb`` trace: ``PacketDecoder.count()`` and ``packets()`` (both
   implementations) and the compiled flow count (``fast.count``), and on a
   ``--flow-mb`` trace the Python block decoder's counts, each on the trace
   as bytes and as a releasing file mapping; prints the ratio (mapped /
   bytes time: 1.00 = no change).

    python bench/bench_memory.py [--sizes 10,25,50,100] [--small-sizes 0.25,0.5,1]
                                 [--speed-mb 8] [--flow-mb 0.1] [--repeat 5]
                                 [--before]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parallel import record, repeated  # noqa: E402

# Runs hwtrace's CLI in this child and prints its own peak RSS (KiB) last:
# VmHWM, the high-water mark of this process image's memory (ru_maxrss
# would carry over the parent's peak through fork/vfork + exec).
# argv[1] == "bytes": read the trace into bytes as before (no mapping).
_WRAP = r"""
import sys
mode = sys.argv.pop(1)
if mode == "bytes":
    from hwtrace.cli import _tracemap
    def _read(path, offset=0, size=None):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read() if size is None else f.read(size)
    _tracemap.map_trace = _read
from hwtrace.cli import main
try:
    rc = main(sys.argv[1:])
finally:
    sys.stdout.flush()
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]
    print("\n@rss %d" % int(hwm[0].split()[1]))
sys.exit(rc)
"""


def peak(args: list, mode: str = "mapped") -> tuple[float, int, str]:
    """(wall s, peak RSS KiB, stdout) of ``hwtrace ARGS``."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _WRAP, mode, *map(str, args)],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out, _, tail = p.stdout.rpartition("\n@rss ")
    if p.returncode != 0 or not tail:
        sys.exit(f"bench: hwtrace {' '.join(map(str, args[:3]))}...: "
                 f"{p.stderr.strip()[-300:]}")
    return wall, int(tail), out


def rss_table(title, argv_of, paths, before: bool) -> None:
    print(f"\n{title}")
    for path in paths:
        size = path.stat().st_size
        wall, rss, out = peak(argv_of(path))
        last = " ".join(out.split()[-4:])
        line = (f"  {size / 1e6:7.2f} MB: peak RSS {rss / 1024:6.1f} MB "
                f"({wall:6.1f} s)")
        if before:
            bwall, brss, bout = peak(argv_of(path), "bytes")
            same = "same output" if bout == out else "OUTPUT DIFFERS"
            line += (f"   read into bytes: {brss / 1024:6.1f} MB "
                     f"({bwall:6.1f} s, {same})")
        print(f"{line}   [{last}]")


def speed(trace: Path, small: Path, images: list[str], repeat: int) -> None:
    from hwtrace.cli._tracemap import map_trace
    from hwtrace.flow import fast
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_raw
    from hwtrace.pt import _impl
    from hwtrace.pt.decoder import PacketDecoder

    image = Image()
    for i in range(0, len(images), 2):
        load_raw(image, images[i + 1])

    def timed(fn):
        t0 = time.perf_counter()
        r = fn()
        return time.perf_counter() - t0, r

    def drain(it):
        k = 0
        for _ in it:
            k += 1
        return k

    rows = []
    impls = ["compiled", "python"] if _impl.STATUS.module else ["python"]
    for impl in impls:
        rows.append((f"count()   {impl:8}", trace, lambda b, i=impl:
                     PacketDecoder(b, impl=i).count()))
        rows.append((f"packets() {impl:8}", trace, lambda b, i=impl:
                     drain(PacketDecoder(b, impl=i).packets())))
    if fast.CORE is not None:
        rows.append(("fast.count block (compiled flow)", trace, lambda b:
                     fast.count(b, image, FlowConfig(), decoder="block")[:3]))
    rows.append(("Python block decoder counts", small, lambda b:
                 fast.count(b, image, FlowConfig(), decoder="block",
                            impl="python")[:3]))
    print(f"\nspeed, best of {repeat} runs alternating bytes and mapped "
          "(mapped: a fresh releasing TraceMap per run)")
    for label, path, fn in rows:
        data = path.read_bytes()
        n = len(data)
        tb = tm = float("inf")
        for _ in range(repeat):
            t, rb = timed(lambda: fn(data))
            tb = min(tb, t)
            t, rm = timed(lambda: fn(map_trace(path)))
            tm = min(tm, t)
        same = "same" if rb == rm else f"DIFFERENT {rb} {rm}"
        print(f"  {label:28} {n / 1e6:5.2f} MB: bytes {n / tb / 1e6:7.2f} "
              f"MB/s  mapped {n / tm / 1e6:7.2f} MB/s  ratio {tm / tb:5.2f}"
              f"  ({same})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-kib", type=int, default=12)
    ap.add_argument("--sizes", default="10,25,50,100")
    ap.add_argument("--small-sizes", default="0.25,0.5,1")
    ap.add_argument("--speed-mb", type=float, default=8)
    ap.add_argument("--flow-mb", type=float, default=0.1,
                    help="trace size for the Python flow decoders' speed")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", action="store_true",
                    help="also run each command reading the trace into bytes")
    a = ap.parse_args()
    sizes = [float(x) for x in a.sizes.split(",") if x]
    small = [float(x) for x in a.small_sizes.split(",") if x]

    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        work = Path(tmp)
        pt, images = record(work, a.input_kib)
        print(f"trace: gzip -9 of {a.input_kib} KiB recorded "
              f"({pt.stat().st_size} bytes), repeated; "
              f"{os.cpu_count()} cores")
        big = [repeated(pt, work / f"t{s:g}.pt", s) for s in sizes]
        rss_table("dump --stat (compiled packet count)",
                  lambda p: ["dump", "--stat", p], big, a.before)
        rss_table("decode --quiet --stat (compiled flow core, release hook "
                  "at PSBs)",
                  lambda p: ["decode", "--pt", p, *images, "--quiet",
                             "--stat"], big, a.before)
        rss_table("decode --quiet, no images (Python query/block decoders: "
                  "error + resync at every PSB)",
                  lambda p: ["decode", "--pt", p, "--raw",
                             f"{pt}:0x7f0000000000", "--quiet"], big,
                  a.before)
        few = [repeated(pt, work / f"s{s:g}.pt", s) for s in small]
        rss_table("decode --quiet (Python flow decoders, with images)",
                  lambda p: ["decode", "--pt", p, *images, "--quiet"], few,
                  a.before)
        rss_table("dump --quiet (ptdump formatter over the compiled scan)",
                  lambda p: ["dump", "--quiet", p], big[:1] + few, a.before)
        sp = repeated(pt, work / "speed.pt", a.speed_mb)
        speed(sp, repeated(pt, work / "flow.pt", a.flow_mb), images,
              a.repeat)
        print(f"\nimages: {shlex.join(images)[:120]}...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
