"""Benchmark: instruction-flow decoding, hwtrace vs libipt (ptoracle).

Runs ``hwtrace decode --quiet --stat`` and ``ptoracle insn --summary`` on the
same trace and prints instructions/s, MB/s and the ratio.  Times are CPU
times of the child processes (user+sys, less sensitive to a shared machine
than wall time); both include process start-up.

The trace: by default a fresh recording, by the emulated engine (QEMU user
mode), of a real program -- ``gzip -9`` compressing ``--input-kib`` KiB of
text (default 512: a ~1.4 MB trace of ~46 M instructions; 2048 gives ~5.7 MB
and ~185 M).  ``--bundle DIR [--stream cpu0.pt]`` uses an
existing bundle instead.  Without the emulated engine it falls back to the
hardware fixture ``drpt2trace_simple`` (tiny: a start-up measurement only).

    python bench/bench_decode.py [--input-kib N] [--bundle DIR] [--stream NAME]
                                 [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
ORACLE = REPO / "build" / "ptoracle"


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str]) -> tuple[float, str]:
    before = child_cpu()
    r = subprocess.run(cmd, capture_output=True, text=True)
    spent = child_cpu() - before
    if r.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:3])}...: {r.stderr.strip()[-300:]}")
    return spent, r.stdout


def ensure_oracle() -> None:
    if not ORACLE.exists():
        ORACLE.parent.mkdir(exist_ok=True)
        subprocess.run(["sh", str(SHARED / "oracle" / "build.sh"),
                        str(ORACLE)], check=True)


def hwtrace(*args) -> list[str]:
    return [sys.executable, "-m", "hwtrace", *map(str, args)]


def record_gzip(workdir: Path, kib: int) -> Path:
    text = workdir / "input.txt"
    chunks = []
    for p in sorted((SHARED / "corpus" / "libipt").glob("*/*.ptt")):
        chunks.append(p.read_text(errors="replace"))
    data = "".join(chunks).encode()
    while len(data) < kib << 10:
        data += data
    text.write_bytes(data[:kib << 10])
    bundle = workdir / "bundle"
    gzip = shutil.which("gzip") or "/usr/bin/gzip"
    r = subprocess.run(hwtrace("record", "--copy-images", "-o", bundle, "--",
                               gzip, "-9", "-c", text),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-300:])
    return bundle


def bundle_args(bundle: Path, stream: str | None) -> tuple[Path, list[str], str]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    streams = manifest["streams"]
    if stream is None:
        stream = max(streams, key=lambda s: s.get("size", 0))["file"]
    r = subprocess.run(hwtrace("images", "--pt", stream, bundle),
                       capture_output=True, text=True, check=True)
    cpu = manifest.get("cpu") or {}
    opts = r.stdout.split()
    if cpu.get("family"):
        opts += ["--cpu", f"{cpu['family']}/{cpu['model']}"]
    return bundle / stream, opts, f"{bundle.name}/{stream}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--stream")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--input-kib", type=int, default=512)
    a = ap.parse_args()
    ensure_oracle()

    tmp = None
    if a.bundle:
        pt, opts, name = bundle_args(a.bundle, a.stream)
        what = f"bundle {name}"
    else:
        try:
            tmp = Path(tempfile.mkdtemp(prefix="hwtrace-bench-"))
            bundle = record_gzip(tmp, a.input_kib)
            pt, opts, name = bundle_args(bundle, None)
            what = ("emulated-engine recording of `gzip -9` on "
                    f"{a.input_kib} KiB of text ({name})")
        except Exception as e:  # no QEMU here: the small real capture
            fx = SHARED / "fixtures" / "hardware" / "drpt2trace_simple"
            pt = fx / "pt.bin"
            opts = ["--elf", str(fx / "hello"), "--cpu", "6/85/4",
                    "--mtc-freq", "3", "--nom-freq", "37",
                    "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "308"]
            what = f"hardware fixture drpt2trace_simple (no recording: {e})"

    size = pt.stat().st_size
    best_h = best_o = None
    for _ in range(a.repeat):
        th, out_h = timed(hwtrace("decode", "--pt", pt, *opts,
                                  "--insn-decoder", "--quiet", "--stat"))
        to, out_o = timed([str(ORACLE), "insn", str(pt), *opts, "--summary"])
        best_h = th if best_h is None else min(best_h, th)
        best_o = to if best_o is None else min(best_o, to)
    insns_h = int(out_h.split("insn:")[1].split(".")[0])
    insns_o = json.loads(out_o.splitlines()[-1])["insns"]

    mb = size / 1e6
    print(f"trace: {what}: {size} bytes")
    print(f"hwtrace decode --quiet --stat : {insns_h} insns, {best_h:.3f} s "
          f"CPU, {insns_h / best_h / 1e6:.3f} M insn/s, {mb / best_h:.3f} MB/s")
    print(f"ptoracle insn --summary       : {insns_o} insns, {best_o:.3f} s "
          f"CPU, {insns_o / best_o / 1e6:.3f} M insn/s, {mb / best_o:.3f} MB/s")
    print(f"ratio (hwtrace time / libipt time): {best_h / best_o:.1f}x"
          + ("" if insns_h == insns_o else
             f"  [instruction counts differ: {insns_h} vs {insns_o}]"))
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
