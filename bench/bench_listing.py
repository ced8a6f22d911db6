"""Benchmark: ``hwtrace decode`` printing every instruction (the text
listing with functions and disassembly, and ``--format jsonl``) against
libipt printing every instruction as JSON (``ptoracle insn``), over the
same streams, measured in the same run.

    python bench/bench_listing.py [--bundle DIR]... [--input-kib N]
                                  [--python-program] [--repeat N]
                                  [--no-fixtures] [--end-to-end]

Inputs: a fresh emulated recording of ``gzip -9`` over ``--input-kib``
KiB of text (default 200; a program nobody here wrote), each ``--bundle``
given, with ``--python-program`` a recording of ``python3 -c
'print(sum(range(100000)))'`` (~150 M instructions: only sensible with
the compiled producer), and the real hardware captures of
``../shared/fixtures/hardware`` that come with their binaries
(drpt2trace_simple, lldb_intelpt; decoded as ``--pt`` traces with
``--elf``).

For each input and each output it prints CPU seconds (user+sys, best of
``--repeat``) of

* ``ptoracle insn STREAM IMAGES > /dev/null`` summed over the streams;
* ``hwtrace decode ... > /dev/null`` end to end (a child process: start-up,
  symbols, decoding, formatting); run where the compiled core makes the
  batches, or with ``--end-to-end``;
* the formatting alone: the same output made in this process from
  batches decoded beforehand (fresh caches each time: symbols read,
  instructions disassembled), i.e. the listing's own cost;

and the ratios ptoracle / hwtrace (>= 1: hwtrace is at least as fast).
It says which producer made the batches (``compiled`` core or ``python``
twin) and fails loudly if the Python twin ran where the compiled core
should have (compiled core built, ``HWTRACE_NO_EXTENSIONS`` unset, and it
has a batch decoder).  Until the compiled producer has landed the
end-to-end figures are the twin's, and the formatting figures are the
ones that say whether the listing keeps up.
"""

from __future__ import annotations

import argparse
import json
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
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
from _common import SHARED, ptoracle  # noqa: E402

HW = SHARED / "fixtures" / "hardware"

# The child: hwtrace decode, reporting which batch producer ran.
CHILD = r"""
import sys
from hwtrace.flow import batches as B
used = set()
real_py = B.python_batches
import functools
@functools.wraps(real_py)
def py(*a, **k):
    used.add("python")
    return real_py(*a, **k)
B.python_batches = py
try:
    from hwtrace.flow import fast
    import functools
    real_c = fast.compiled_batches
    @functools.wraps(real_c)      # its signature says what it supports
    def comp(*a, **k):
        used.add("compiled")
        return real_c(*a, **k)
    fast.compiled_batches = comp
except AttributeError:
    pass
from hwtrace.cli import main
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(",".join(sorted(used)))
sys.exit(rc)
"""


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cpu(argv, env=None) -> float:
    """CPU seconds of one child run, its stdout to /dev/null."""
    t0 = child_cpu()
    with open(os.devnull, "wb") as null:
        r = subprocess.run(argv, stdout=null, stderr=subprocess.PIPE,
                           env=env)
    if r.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(map(str, argv))}\n"
                         f"{r.stderr.decode()[-2000:]}")
    return child_cpu() - t0


def compiled_expected() -> bool:
    """Whether the compiled core should produce the batches here."""
    if os.environ.get("HWTRACE_NO_EXTENSIONS"):
        return False
    from hwtrace.flow import batches as B
    return B._core(None) is not None


# -- inputs ------------------------------------------------------------------

class Case:
    """One input: ``hwtrace decode`` arguments and the ptoracle runs of
    its streams (each an argv without the output redirection)."""

    def __init__(self, name, decode_args, oracle_runs, insns=0):
        self.name = name
        self.decode_args = decode_args
        self.oracle_runs = oracle_runs
        self.insns = insns


def bundle_case(name: str, bundle: Path, exe: Path) -> Case:
    man = json.loads((bundle / "manifest.json").read_text())
    cpu = man.get("cpu") or {}
    runs, insns = [], 0
    for s in man["streams"]:
        img = subprocess.run([sys.executable, "-m", "hwtrace", "images",
                              "--pt", s["file"], str(bundle)],
                             capture_output=True, text=True, check=True,
                             env=_env()).stdout.split()
        argv = [str(exe), "insn", str(bundle / s["file"]), *img]
        if cpu.get("family"):
            argv += ["--cpu", f"{cpu['family']}/{cpu.get('model', 0)}"]
        for key, opt in (("mtc_freq", "--mtc-freq"),
                         ("nom_freq", "--nom-freq"),
                         ("cpuid_0x15_eax", "--cpuid-0x15.eax"),
                         ("cpuid_0x15_ebx", "--cpuid-0x15.ebx")):
            if man.get(key):
                argv += [opt, str(man[key])]
        runs.append(argv)
        insns += s.get("instructions_observed", 0)
    return Case(name, [str(bundle)], runs, insns)


def pt_case(name, pt: Path, images: list, cpu: str, exe: Path) -> Case:
    args = ["--pt", str(pt)]
    for kind, arg in images:
        args += [f"--{kind}", str(arg)]
    args += ["--cpu", cpu]
    oracle = [str(exe), "insn", str(pt)]
    for kind, arg in images:
        oracle += [f"--{kind}", str(arg)]
    oracle += ["--cpu", cpu]
    return Case(name, args, [oracle])


def fixture_cases(exe: Path) -> list:
    out = []
    s = HW / "drpt2trace_simple"
    if (s / "pt.bin").exists():
        c = pt_case("hw drpt2trace_simple", s / "pt.bin",
                    [("elf", s / "hello")], "6/85/4", exe)
        extra = ["--mtc-freq", "3", "--nom-freq", "37", "--cpuid-0x15.eax",
                 "2", "--cpuid-0x15.ebx", "308"]
        c.decode_args += extra
        c.oracle_runs[0] += extra
        out.append(c)
    lldb = HW / "lldb_intelpt"
    mc = lldb / "intelpt-multi-core-trace"
    for core in (45, 51):
        pt = mc / "cores" / f"{core}.intelpt_trace"
        if pt.exists():
            out.append(pt_case(f"hw lldb core {core}", pt,
                               [("elf", mc / "modules" / "m.out")],
                               "6/85/4", exe))
    t = lldb / "intelpt-trace"
    if (t / "3842849.trace").exists():
        out.append(pt_case("hw lldb intelpt-trace", t / "3842849.trace",
                           [("elf", t / "a.out")], "6/79/1", exe))
    m = lldb / "intelpt-trace-multi-file"
    if (m / "multi-file.trace").exists():
        out.append(pt_case("hw lldb multi-file", m / "multi-file.trace",
                           [("elf", m / "a.out"),
                            ("elf", f"{m / 'libfoo.so'}:0x7ffff7bd9000"),
                            ("elf", f"{m / 'libbar.so'}:0x7ffff79d7000")],
                           "6/79/1", exe))
    return out


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO / "src") + (
        os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def record(work: Path, name: str, argv: list) -> Path:
    out = work / name
    r = subprocess.run([sys.executable, "-m", "hwtrace", "record", "--mode",
                        "thread", "-o", str(out), "--", *argv],
                       capture_output=True, text=True, env=_env())
    if r.returncode != 0:
        raise SystemExit(f"recording {name} failed: {r.stderr[-1000:]}")
    return out


# -- measuring ---------------------------------------------------------------

def hwtrace_run(case: Case, extra: list, repeat: int) -> tuple:
    """(best CPU seconds, producers used) of ``hwtrace decode``."""
    best, used = None, ""
    with tempfile.NamedTemporaryFile("r") as rep:
        for _ in range(repeat):
            t = run_cpu([sys.executable, "-c", CHILD, rep.name, "decode",
                         *case.decode_args, *extra], env=_env())
            best = t if best is None else min(best, t)
            used = Path(rep.name).read_text()
    return best, used


def oracle_run(case: Case, repeat: int) -> float:
    best = None
    for _ in range(repeat):
        t = sum(run_cpu(argv) for argv in case.oracle_runs)
        best = t if best is None else min(best, t)
    return best


def make_batches(case: Case) -> list:
    """[(stream, [batches])]: the case decoded once, with every
    instruction, for the formatting-only measurements."""
    from hwtrace import streams
    from hwtrace.cli import build_parser
    from hwtrace.cli import decode as D
    args = build_parser().parse_args(["decode", *case.decode_args])
    if args.bundle:
        ts = streams.open_bundle(args.bundle,
                                 config=lambda o: D._config(args, str, o))
    else:
        from hwtrace.flow.loaders import split_range
        path, off, size = split_range(args.pt)
        ts = streams.open_trace(path, D._image(args), D._config(args, str),
                                offset=off, length=size)
    return [(st, list(st.batches("block", want_insns=True)))
            for st in ts.streams]


def format_only(case: Case, made: list, extra: list, repeat: int) -> tuple:
    """(best CPU seconds of making the output from ready batches,
    instructions): the listing's own cost."""
    from hwtrace.cli import build_parser
    from hwtrace.cli import decode as D
    from hwtrace.listing.walk import Walker
    args = build_parser().parse_args(["decode", *case.decode_args, *extra])
    fmt = D.listing_format(args)
    block = args.decoder != "insn"
    best, n = None, 0
    with open(os.devnull, "wb") as null:
        for _ in range(repeat):
            ctx = D.contexts(args, fmt)
            t0 = time.process_time()
            n = 0
            for st, bs in made:
                w = Walker(fmt, null.write,
                           lambda sp, st=st: ctx.for_space(sp, st.image),
                           block=block)
                for b in bs:
                    w.batch(b)
                n += w.insns
            t = time.process_time() - t0
            best = t if best is None else min(best, t)
    return best, n


OUTPUTS = (("text", []), ("jsonl", ["--format", "jsonl"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", action="append", default=[], type=Path)
    ap.add_argument("--input-kib", type=int, default=200)
    ap.add_argument("--no-record", action="store_true",
                    help="no fresh gzip recording")
    ap.add_argument("--python-program", action="store_true")
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--end-to-end", action="store_true",
                    help="time hwtrace decode as a whole even when the "
                         "Python twin makes the batches (slow)")
    a = ap.parse_args(argv)

    exe = ptoracle()
    if exe is None:
        raise SystemExit("ptoracle unavailable (../shared/oracle)")
    want_compiled = compiled_expected()
    print(f"batch producer expected: "
          f"{'compiled' if want_compiled else 'python twin'}"
          + ("" if want_compiled else
             " (no compiled batch decoder on this branch or "
             "HWTRACE_NO_EXTENSIONS set: end-to-end figures are the "
             "twin's; the formatting-only figures measure the listing)"))
    work = Path(tempfile.mkdtemp(prefix="bench-listing-"))
    try:
        cases = []
        if not a.no_record and shutil.which("gzip"):
            text = b"".join(p.read_bytes() for p in sorted(
                (SHARED / "corpus" / "libipt").glob("*/*.ptt")))
            src = work / "in.txt"
            src.write_bytes((text * (1 + (a.input_kib << 10) // max(
                1, len(text))))[:a.input_kib << 10])
            b = record(work, "gzip", [shutil.which("gzip"), "-9", "-k",
                                      "-f", str(src)])
            cases.append(bundle_case(f"gzip -9 {a.input_kib} KiB", b, exe))
        if a.python_program:
            b = record(work, "py", [sys.executable, "-c",
                                    "print(sum(range(100000)))"])
            cases.append(bundle_case("python3 sum(range(100000))", b, exe))
        for i, b in enumerate(a.bundle):
            cases.append(bundle_case(f"bundle {b}", b.resolve(), exe))
        if not a.no_fixtures:
            cases += fixture_cases(exe)
        print(f"{'input':28} {'output':6} {'insns':>11} {'ptoracle':>9} "
              f"{'hwtrace':>9} {'ratio':>6} {'format':>8} {'ratio':>6}  "
              f"producer")
        bad = []
        whole = want_compiled or a.end_to_end
        for c in cases:
            ref = oracle_run(c, a.repeat)
            made = make_batches(c)
            for out, extra in OUTPUTS:
                if whole:
                    t, used = hwtrace_run(c, extra, a.repeat)
                    e2e = f"{t:9.3f} {ref / t:6.2f}"
                else:
                    used, e2e = "", f"{'-':>9} {'-':>6}"
                f, n = format_only(c, made, extra, a.repeat)
                print(f"{c.name[:28]:28} {out:6} {n:11,d} {ref:9.3f} "
                      f"{e2e} {f:8.3f} {ref / f:6.2f}  "
                      f"{used or 'not run'}", flush=True)
                if want_compiled and "python" in used:
                    bad.append(f"{c.name} {out}")
        print("CPU seconds, best of", a.repeat, "; ratio = ptoracle insn "
              "(every instruction as JSON, to /dev/null) / hwtrace; "
              "'format' = the listing alone from ready batches")
        if bad:
            print("FAIL: the Python twin made the batches where the "
                  "compiled core should have: " + ", ".join(bad),
                  file=sys.stderr)
            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
