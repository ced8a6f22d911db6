"""Workloads of the decode and coverage benchmarks, and how they are timed.

A workload is a trace with the options both decoders need (images, CPU,
timing parameters): the real captures in ../shared/fixtures/hardware that
come with their code, and emulated-engine recordings (``hwtrace record``)
of programs nobody here wrote -- ``gzip -9`` of a few hundred KiB, ``python3
-c 'print(sum(range(100000)))'``, ``sqlite3`` running a recursive query --
made once per run (or kept in ``--work DIR`` for the next one).

Times are CPU seconds (user + sys) of the child processes, best of
``--repeat``, process start-up included: a shared, loaded machine changes
wall time far more than CPU time.  The hwtrace children run with a warm
bytecode cache, as an installed hwtrace has it, unless ``--cold-bytecode``
(:class:`Children`; the output says which).  The reference, libipt's block decoder
(``ptoracle blk FILE ... --summary``, Debian's libipt 2.0.5), is timed in
the same run on the same input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from _common import best_cpu, bytecode_note, child_env, hwtrace_command, \
    startup_floor, warm_up

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
ORACLE = REPO / "build" / "ptoracle"
FX = SHARED / "fixtures" / "hardware"
TIMING_CONFIG = "branch;user;tsc;mtc;cyc"


class Workload(NamedTuple):
    name: str
    pt: Path
    opts: list          # decode options (images, --cpu, timing)
    bundle: Path | None = None      # the bundle the stream is from


def hwtrace(*args) -> list[str]:
    """The command line ``hwtrace ARGS`` as a user runs it
    (:func:`_common.hwtrace_command`)."""
    return [*hwtrace_command(), *map(str, args)]


def ensure_oracle() -> None:
    if not ORACLE.exists():
        ORACLE.parent.mkdir(exist_ok=True)
        subprocess.run(["sh", str(SHARED / "oracle" / "build.sh"),
                        str(ORACLE)], check=True)


def best(cmd, repeat: int, env=None, warm: bool = False) -> tuple[float, str]:
    """Best CPU time of ``repeat`` runs of ``cmd`` and its stdout; ``warm``:
    after an untimed run that fills the bytecode cache of ``env``
    (:func:`_common.child_env`)."""
    if warm:
        warm_up(cmd, env)
    return best_cpu(repeat, cmd, env)


class Children:
    """How the timed hwtrace processes run: :func:`_common.child_env`
    (``cold``: as this environment says; else a warm bytecode cache in
    ``work``/pycache)."""

    def __init__(self, cold: bool, work: Path):
        self.cold = cold
        self.env = child_env(cold, work / "pycache")
        self.note = bytecode_note(cold)

    def best(self, cmd, repeat: int, **env) -> tuple[float, str]:
        """:func:`best` of ``cmd`` in this environment (plus ``env``)."""
        return best(cmd, repeat, dict(self.env, **env), warm=not self.cold)

    def floor(self, repeat: int) -> str:
        return startup_floor(self.env, repeat)


def oracle_blk(w: Workload, repeat: int) -> tuple[float, int]:
    """libipt's block decoder: (CPU seconds, instructions)."""
    t, summary = oracle_blk_summary(w, repeat)
    return t, summary["insns"]


def oracle_blk_summary(w: Workload, repeat: int) -> tuple[float, dict]:
    """libipt's block decoder: (CPU seconds, ``ptoracle blk --summary``'s
    JSON: insns, blocks, events, errors)."""
    t, out = best([ORACLE, "blk", w.pt, *w.opts, "--summary"], repeat)
    return t, json.loads(out.splitlines()[-1])


def compiled_path_or_die() -> str:
    """Which flow core the hwtrace children will run, as this
    interpreter's environment selects it; exits if it is the Python twin
    (the benchmarks measure the compiled core)."""
    r = subprocess.run([sys.executable, "-c",
                        "from hwtrace.flow import fast; "
                        "print(fast.STATUS.describe()); "
                        "raise SystemExit(fast.CORE is None)"],
                       capture_output=True, text=True)
    desc = r.stdout.strip()
    if r.returncode != 0:
        sys.exit(f"bench: FAILED -- the Python twin would run, not the "
                 f"compiled core: {desc or r.stderr.strip()[-300:]}")
    return desc


# -- the real captures -------------------------------------------------------

def captures(work: Path) -> list[Workload]:
    """The real captures that come with their code."""
    out = []
    drpt = FX / "drpt2trace_simple"
    if drpt.is_dir():
        out.append(Workload("drpt2trace_simple (Skylake-SP, CYC/MTC)",
                            drpt / "pt.bin",
                            ["--elf", drpt / "hello", "--cpu", "6/85/4",
                             "--mtc-freq", "3", "--nom-freq", "37",
                             "--cpuid-0x15.eax", "2",
                             "--cpuid-0x15.ebx", "308"]))
    lldb = FX / "lldb_intelpt"
    mc = lldb / "intelpt-multi-core-trace"
    for core in ("45", "51"):
        pt = mc / "cores" / f"{core}.intelpt_trace"
        if pt.is_file():
            out.append(Workload(f"lldb multi-core cpu {core} (Skylake-SP)", pt,
                                ["--elf", f"{mc}/modules/m.out:0x400000",
                                 "--cpu", "6/85/4"]))
    one = lldb / "intelpt-trace"
    if one.is_dir():
        out.append(Workload("lldb single thread (Broadwell)",
                            one / "3842849.trace",
                            ["--elf", f"{one}/a.out:0x400000",
                             "--cpu", "6/79/1"]))
    mf = lldb / "intelpt-trace-multi-file"
    if mf.is_dir():
        out.append(Workload("lldb multi-file (Broadwell)",
                            mf / "multi-file.trace",
                            ["--elf", f"{mf}/a.out:0x400000",
                             "--elf", f"{mf}/libfoo.so:0x7ffff7bd9000",
                             "--elf", f"{mf}/libbar.so:0x7ffff79d7000",
                             "--cpu", "6/79/1"]))
    hase = FX / "hase_loopy"
    if hase.is_dir():
        b = work / "hase"
        if not (b / "manifest.json").is_file():
            subprocess.run(hwtrace("import", "-o", b, "--image",
                                   hase / "loopy",
                                   hase / "loopy-20180404T162955.perf"),
                           check=True, capture_output=True)
        pt, _images = _bundle_stream(b)
        out.append(Workload("hase_loopy (Skylake, perf import)", pt,
                            ["--elf", hase / "loopy"] + _manifest_opts(b),
                            b))
    return out


# -- recordings ----------------------------------------------------------------

def text(kib: int) -> bytes:
    """``kib`` KiB of text: the libipt corpus's .ptt sources, repeated."""
    chunks = [p.read_text(errors="replace")
              for p in sorted((SHARED / "corpus" / "libipt").glob("*/*.ptt"))]
    data = "".join(chunks).encode() or b"hwtrace benchmark text\n"
    while len(data) < kib << 10:
        data += data
    return data[:kib << 10]


PROGRAMS = {
    "gzip": lambda work, kib: ["gzip", "-9", "-c", str(work / "in.txt")],
    # the interpreter itself (this one's binary), not a launcher on PATH:
    # pyenv's python3 is a bash script that runs a dozen processes first
    "python3": lambda work, kib: [os.path.realpath(sys.executable), "-c",
                                  "print(sum(range(100000)))"],
    "sqlite3": lambda work, kib: [
        "sqlite3", ":memory:",
        "with recursive c(x) as (select 1 union all select x+1 from c "
        "limit 100000) select sum(x), count(*) from c;"],
}


def record(work: Path, program: str, kib: int, timing: bool) -> Path | None:
    """A thread-mode bundle of ``program`` (made once in ``work``); None if
    the program or the emulated engine is not there."""
    argv = PROGRAMS[program](work, kib)
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    argv[0] = exe
    if program == "gzip":
        (work / "in.txt").write_bytes(text(kib))
    name = f"{program}-{kib if program == 'gzip' else 0}" \
           f"{'-timing' if timing else ''}"
    b = work / name
    if (b / "manifest.json").is_file():
        return b
    config = ["--config", TIMING_CONFIG] if timing else []
    r = subprocess.run(hwtrace("record", "--mode", "thread",
                               "--copy-images", *config, "-o", b, "--",
                               *argv),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        sys.stderr.write(f"bench: cannot record {program}: "
                         f"{r.stderr.strip()[-300:]}\n")
        shutil.rmtree(b, ignore_errors=True)
        return None
    return b


def _manifest_opts(bundle: Path) -> list:
    m = json.loads((bundle / "manifest.json").read_text())
    opts = []
    cpu = m.get("cpu") or {}
    if cpu.get("family"):
        opts += ["--cpu", f"{cpu['family']}/{cpu['model']}"]
    for key, opt in (("mtc_freq", "--mtc-freq"), ("nom_freq", "--nom-freq"),
                     ("cpuid_0x15_eax", "--cpuid-0x15.eax"),
                     ("cpuid_0x15_ebx", "--cpuid-0x15.ebx")):
        if m.get(key):
            opts += [opt, str(m[key])]
    return opts


def _bundle_stream(bundle: Path) -> tuple[Path, list]:
    m = json.loads((bundle / "manifest.json").read_text())
    stream = max(m["streams"], key=lambda s: s.get("size", 0))["file"]
    r = subprocess.run(hwtrace("images", "--pt", stream, bundle),
                       capture_output=True, text=True, check=True)
    return bundle / stream, r.stdout.split()


def recordings(work: Path, kib: int, timing: bool,
               programs=("gzip", "python3", "sqlite3")) -> list[Workload]:
    out = []
    for p in programs:
        b = record(work, p, kib, timing)
        if b is None:
            continue
        pt, images = _bundle_stream(b)
        what = f"gzip -9 of {kib} KiB" if p == "gzip" else p
        out.append(Workload(f"recording: {what}" +
                            (" (TSC/MTC/CYC)" if timing else ""), pt,
                            images + _manifest_opts(b), b))
    return out


def workdir(given: Path | None) -> tuple[Path, bool]:
    """(directory, whether to remove it at the end)."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return given, False
    return Path(tempfile.mkdtemp(prefix="hwtrace-bench-")), True


def load(w: Workload):
    """(data, image, FlowConfig) of a workload, as decode builds them."""
    from hwtrace.cli import build_parser
    from hwtrace.cli import decode as D
    args = build_parser().parse_args(["decode", "--pt", str(w.pt),
                                      *map(str, w.opts)])
    return w.pt.read_bytes(), D._image(args), D._config(args, lambda s: None)


def environment() -> str:
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return f"load average {' '.join(load)} on {os.cpu_count()} CPUs"


# -- the frame of a workload bench --------------------------------------------

def parser(doc: str) -> argparse.ArgumentParser:
    """The options of a bench over these workloads (add its own)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--input-kib", type=int, default=300)
    ap.add_argument("--timing", action="store_true",
                    help="record with TSC/MTC/CYC packets on")
    ap.add_argument("--work", type=Path,
                    help="keep the recordings here (made on first use)")
    ap.add_argument("--only", choices=("captures", "recordings"))
    ap.add_argument("--cold-bytecode", action="store_true",
                    help="hwtrace children compile their modules every "
                         "time (as this environment says) instead of "
                         "running with a warm bytecode cache")
    return ap


@contextmanager
def session(a: argparse.Namespace):
    """Run a bench over the workloads ``a`` (:func:`parser`) selects:
    make sure of the oracle and of the compiled flow core (exits if the
    Python twin would run), print the environment, the children's bytecode
    cache and the start-up floor; give ``(children, workloads)``; then say
    how the times were taken and remove a working directory made here."""
    ensure_oracle()
    print(f"flow core: {compiled_path_or_die()}")
    print(environment())
    work, remove = workdir(a.work)
    ch = Children(a.cold_bytecode, work)
    print(ch.note)
    print(ch.floor(max(a.repeat, 5)))
    try:
        loads = []
        if a.only != "recordings":
            loads += captures(work)
        if a.only != "captures":
            loads += recordings(work, a.input_kib, a.timing)
        yield ch, loads
        print("(CPU seconds of the child processes, start-up included, best "
              f"of {a.repeat}; " + environment() + "; bytecode cache "
              f"{'cold' if a.cold_bytecode else 'warm'})")
    finally:
        if remove:
            shutil.rmtree(work, ignore_errors=True)
