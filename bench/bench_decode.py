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
                                 [--repeat N] [--python] [--timing]

``--timing`` records with timing packets on (TSC, MTC every 2**3 CTC, CYC:
``--config "branch;user;tsc;retc;cyc;mtc;mtc-freq=3"``), as real hardware
traces usually are.  A bundle's timing parameters (MTC period, nominal
frequency, CPUID 0x15) are passed to both decoders.

``hwtrace decode --quiet --stat`` runs the compiled flow core
(hwtrace.flow.fast) when it decodes the trace exactly, the Python decoders
otherwise; ``--python`` also times the pure-Python path.
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


def ensure_oracle() -> None:
    if not ORACLE.exists():
        ORACLE.parent.mkdir(exist_ok=True)
        subprocess.run(["sh", str(SHARED / "oracle" / "build.sh"),
                        str(ORACLE)], check=True)


def hwtrace(*args) -> list[str]:
    return [sys.executable, "-m", "hwtrace", *map(str, args)]


TIMING_CONFIG = "branch;user;tsc;retc;cyc;mtc;mtc-freq=3"


def record_gzip(workdir: Path, kib: int, timing: bool = False) -> Path:
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
    config = ["--config", TIMING_CONFIG] if timing else []
    r = subprocess.run(hwtrace("record", "--copy-images", *config, "-o",
                               bundle, "--", gzip, "-9", "-c", text),
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
    for key, opt in (("mtc_freq", "--mtc-freq"), ("nom_freq", "--nom-freq"),
                     ("cpuid_0x15_eax", "--cpuid-0x15.eax"),
                     ("cpuid_0x15_ebx", "--cpuid-0x15.ebx")):
        if manifest.get(key):
            opts += [opt, str(manifest[key])]
    return bundle / stream, opts, f"{bundle.name}/{stream}"


def trace_for(a) -> tuple[Path, list[str], str, Path | None]:
    """(trace, decode options, description, temporary directory)."""
    if a.bundle:
        pt, opts, name = bundle_args(a.bundle, a.stream)
        return pt, opts, f"bundle {name}", None
    tmp = Path(tempfile.mkdtemp(prefix="hwtrace-bench-"))
    try:
        bundle = record_gzip(tmp, a.input_kib, a.timing)
        pt, opts, name = bundle_args(bundle, None)
        what = ("emulated-engine recording of `gzip -9` on "
                f"{a.input_kib} KiB of text ({name})" +
                (f", timing on: {TIMING_CONFIG}" if a.timing else ""))
    except Exception as e:  # no QEMU here: the small real capture
        fx = SHARED / "fixtures" / "hardware" / "drpt2trace_simple"
        pt = fx / "pt.bin"
        opts = ["--elf", str(fx / "hello"), "--cpu", "6/85/4",
                "--mtc-freq", "3", "--nom-freq", "37",
                "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "308"]
        what = f"hardware fixture drpt2trace_simple (no recording: {e})"
    return pt, opts, what, tmp


def best(cmd: list[str], repeat: int, env=None) -> tuple[float, str]:
    out = None
    t = None
    for _ in range(repeat):
        before = child_cpu()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        spent = child_cpu() - before
        if r.returncode != 0:
            sys.exit(f"bench: {' '.join(map(str, cmd[:4]))}...: "
                     f"{r.stderr.strip()[-300:]}")
        t = spent if t is None else min(t, spent)
        out = r.stdout
    return t, out


def oracle_run(pt: Path, opts: list[str], repeat: int) -> tuple[float, int]:
    to, out_o = best([str(ORACLE), "insn", str(pt), *opts, "--summary"],
                     repeat)
    return to, json.loads(out_o.splitlines()[-1])["insns"]


def line(label: str, insns: int, t: float, mb: float, ref: float) -> str:
    return (f"{label:<44}: {insns} insns, {t:.3f} s CPU, "
            f"{insns / t / 1e6:.1f} M insn/s, {mb / t:.2f} MB/s, "
            f"{ref / t:.2f}x libipt's speed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--stream")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--input-kib", type=int, default=512)
    ap.add_argument("--python", action="store_true",
                    help="also time the pure-Python path "
                         "(HWTRACE_NO_EXTENSIONS=1; slow)")
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
    runs = [("hwtrace decode --quiet --stat", [], None),
            ("hwtrace decode --insn-decoder --quiet --stat",
             ["--insn-decoder"], None)]
    if a.python:
        env = dict(os.environ, HWTRACE_NO_EXTENSIONS="1")
        runs.append(("  the same, Python twin (NO_EXTENSIONS)",
                     ["--insn-decoder"], env))
    for label, extra, env in runs:
        th, out_h = best(hwtrace("decode", "--pt", pt, *opts, *extra,
                                 "--quiet", "--stat"), a.repeat, env)
        insns_h = int(out_h.split("insn:")[1].split(".")[0])
        print(line(label, insns_h, th, mb, to) +
              ("" if insns_h == insns_o else
               f"  [instruction counts differ: {insns_h} vs {insns_o}]"))
    print("(CPU times of the child processes, process start-up included; "
          "best of --repeat)")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
