"""Benchmark: parallel decoding (``hwtrace decode --jobs N``) and memory.

1. Speed: a trace of a real program (a recording of ``gzip -9`` of
   ``--input-kib`` KiB of text by the emulated engine, ~650 KB of trace for
   the default 192 KiB; repeated to ``--mb`` MB only if that is larger)
   decoded by ``hwtrace decode --quiet`` (the block decoder) on one core
   and with ``--jobs N``; prints wall and CPU seconds, the ratio, and
   checks the outputs are identical.  The same for the instruction
   decoder (``--insn-decoder``), on the trace's first ``--insn-kib`` KiB
   (cut at a PSB) if given.  ``--repeat R`` runs each pair R times (alternating
   which goes first) and prints every run.  The load average is printed
   before and after: other processes on the machine take cores from the
   parallel decode and skew the ratio.
   (``--quiet`` without ``--stat``: the Python flow decoders on both sides.
   ``--quiet --stat`` takes the compiled flow core on one core, which is
   printed too: it is faster than the Python decoders on all cores.)
2. Memory: a ~``--rss-mb`` MB trace (the recording repeated) decoded with
   ``--quiet --stat`` and ``--quiet --stat --jobs N``; prints each run's
   peak RSS (ru_maxrss of the decode process and, for the pool, of its
   largest worker) -- the target is under 500 MB for 100 MB.

    python bench/bench_parallel.py [--input-kib N] [--mb N] [--insn-kib N]
                                   [--repeat R] [--rss-mb N] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def hwtrace(*args) -> list[str]:
    return [sys.executable, "-m", "hwtrace", *map(str, args)]


def record(work: Path, kib: int) -> tuple[Path, list[str]]:
    text = b"".join(p.read_bytes()
                    for p in sorted((SHARED / "corpus" / "libipt").glob("*/*.ptt")))
    while len(text) < kib << 10:
        text += text
    (work / "in.txt").write_bytes(text[:kib << 10])
    gzip = shutil.which("gzip") or "/usr/bin/gzip"
    # thread mode: the whole run in one stream (cpu mode splits it between
    # CPUs as the host schedules QEMU)
    r = subprocess.run(hwtrace("record", "--mode", "thread", "--copy-images",
                               "-o", work / "b",
                               "--", gzip, "-9", "-k", "-f", work / "in.txt"),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: record failed: {r.stderr.strip()[-300:]}")
    pt = max((work / "b").glob("*.pt"), key=lambda p: p.stat().st_size)
    img = subprocess.run(hwtrace("images", "--pt", pt.name, work / "b"),
                         capture_output=True, text=True, check=True).stdout
    return pt, shlex.split(img)


def repeated(src: Path, dst: Path, mb: float) -> Path:
    data = src.read_bytes()
    n = max(1, int(mb * 1e6) // len(data) + (1 if int(mb * 1e6) % len(data) else 0))
    with open(dst, "wb") as f:
        for _ in range(n):
            f.write(data)
    return dst


def run(cmd: list[str]) -> tuple[float, float, int, int, str]:
    """(wall s, cpu s of the process tree, its peak RSS KiB, largest
    worker's peak RSS KiB, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    wrapper = [sys.executable, "-c", _WRAP, *cmd]
    p = subprocess.run(wrapper, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[2:6])}...: {p.stderr.strip()[-300:]}")
    out, _, tail = p.stdout.rpartition("\n@rss ")
    own, kids = (int(x) for x in tail.split())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, own, kids, out


# Runs the command as a child, then reports its peak RSS and that of its
# largest descendant (the pool workers).
_WRAP = r"""
import os, resource, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, status, ru = os.wait4(p.pid, 0)
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stdout.flush()
print("\n@rss %d %d" % (ru.ru_maxrss, kids))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _pair(base: list[str], jobs: int, repeat: int, label: str) -> tuple:
    """Time ``base`` on one core and with ``--jobs``; print every run.
    Returns the last runs' (sequential, parallel) results."""
    for k in range(repeat):
        seq_first = k % 2 == 0
        runs = {}
        for par in ((False, True) if seq_first else (True, False)):
            runs[par] = run(base + (["--jobs", str(jobs)] if par else []))
        (s_wall, s_cpu, _, _, s_out), (p_wall, p_cpu, _, _, p_out) = \
            runs[False], runs[True]
        same = "identical" if s_out == p_out else "DIFFERENT"
        print(f"{label:13} one core {s_wall:6.2f} s wall {s_cpu:6.2f} s cpu | "
              f"--jobs {jobs} {p_wall:6.2f} s wall {p_cpu:6.2f} s cpu | "
              f"{s_wall / p_wall:.2f}x wall (target 1.7x)  output {same}")
    return runs[False], runs[True]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-kib", type=int, default=192)
    ap.add_argument("--mb", type=float, default=0.0,
                    help="repeat the recording to this size (MB)")
    ap.add_argument("--insn-kib", type=int, default=None,
                    help="trace KiB for the instruction decoder (default: "
                    "the whole trace; 0: skip)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rss-mb", type=float, default=100.0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()

    from hwtrace.flow.parallel import psb_offsets

    with tempfile.TemporaryDirectory(prefix="bench-par-") as tmp:
        work = Path(tmp)
        pt, images = record(work, a.input_kib)
        speed = repeated(pt, work / "speed.pt", a.mb) if \
            a.mb * 1e6 > pt.stat().st_size else pt
        size = speed.stat().st_size
        npsb = len(psb_offsets(speed.read_bytes()))
        print(f"trace: gzip -9 of {a.input_kib} KiB recorded "
              f"({pt.stat().st_size} bytes)"
              + (f", repeated to {size / 1e6:.1f} MB" if speed != pt else "")
              + f"; {npsb} PSBs; {os.cpu_count()} cores; load {_load()}")
        base = hwtrace("decode", "--pt", speed, *images, "--quiet")
        seq, par = _pair(base, a.jobs, a.repeat, "block decoder")
        if a.insn_kib is None:
            _pair(base + ["--insn-decoder"], a.jobs, a.repeat, "insn decoder")
        elif a.insn_kib:
            psbs = psb_offsets(speed.read_bytes())
            cut = next((p for p in psbs if p >= a.insn_kib << 10), size)
            ibase = hwtrace("decode", "--pt", f"{speed}:0-{cut:#x}", *images,
                            "--quiet", "--insn-decoder")
            print(f"instruction decoder on the first {cut} bytes:")
            _pair(ibase, a.jobs, a.repeat, "insn decoder")
        print(f"load after: {_load()}")
        s_rss, (_, _, p_rss, p_kid, _) = seq[2], par
        c_wall, c_cpu, _, _, c_out = run(base + ["--stat"])
        insns = next((int(x.split()[1].rstrip(".")) for x in c_out.splitlines()
                      if x.startswith("insn:")), 0)
        print(f"decode --quiet --stat    : {c_wall:7.2f} s wall {c_cpu:7.2f} s cpu "
              f"({insns} insns; compiled flow core where it applies)")
        print(f"peak RSS on {size / 1e6:.1f} MB: sequential {s_rss // 1024} MB, "
              f"--jobs {a.jobs} parent {p_rss // 1024} MB, largest worker "
              f"{p_kid // 1024} MB")

        if a.rss_mb > 0:
            big = repeated(pt, work / "big.pt", a.rss_mb)
            bsize = big.stat().st_size
            bbase = hwtrace("decode", "--pt", big, *images, "--quiet", "--stat")
            for extra in ([], ["--jobs", str(a.jobs)]):
                wall, cpu, own, kids, out = run(bbase + extra)
                line = " ".join(out.split())
                print(f"{bsize / 1e6:.0f} MB trace, decode --quiet --stat "
                      f"{' '.join(extra):9}: {wall:6.1f} s, peak RSS "
                      f"{own // 1024} MB (largest child {kids // 1024} MB) "
                      f"[{line}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
