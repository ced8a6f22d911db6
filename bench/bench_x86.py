"""Benchmark: x86 length/class decoding of a real binary's .text section.

    python bench/bench_x86.py [ELF] [--repeat N]

Linear sweep over .text (decode, advance by size; one byte on an error),
printed as instructions/s. Next to it, in the same run: the same sweep
with capstone (if importable: `pip install capstone`; never a dependency
of hwtrace) both as its own C-driven sweep and called once per instruction
with detail (how a flow decoder would use it: decode at an IP, get the
branch class), and GNU objdump's full disassembly (a native reference,
doing more work per instruction), as ratios.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from elftools.elf.elffile import ELFFile

from hwtrace.x86 import Mode, X86Error, decoder_for


def text_section(path: Path):
    with path.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".text")
        return sec["sh_addr"], sec.data()


def sweep_hwtrace(code: bytes) -> tuple[int, int]:
    dec = decoder_for(Mode.BIT64)
    off, n, branches, end = 0, 0, 0, len(code)
    while off < end:
        try:
            insn = dec(code, off)
        except X86Error:
            off += 1
            continue
        n += 1
        if insn.is_branch:
            branches += 1
        off += insn.size
    return n, branches


def sweep_capstone(code: bytes, base: int):
    try:
        import capstone
    except ImportError:
        return None
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.skipdata = True
    n = 0
    for _addr, size, _mn, _ops in md.disasm_lite(code, base):
        n += 1
    return n


def per_call_hwtrace(code: bytes) -> int:
    dec = decoder_for(Mode.BIT64)
    off, n, end = 0, 0, len(code)
    while off < end:
        try:
            off += dec(code, off).size
        except X86Error:
            off += 1
            continue
        n += 1
    return n


def per_call_capstone(code: bytes, base: int):
    """One capstone call per instruction at an arbitrary address, with the
    detail needed for a branch class: what a flow decoder would do."""
    try:
        import capstone
    except ImportError:
        return None
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    off, n, end = 0, 0, len(code)
    while off < end:
        insn = next(md.disasm(code[off:off + 15], base + off, 1), None)
        if insn is None:
            off += 1
            continue
        insn.groups                     # the branch class lives here
        off += insn.size
        n += 1
    return n


def time_it(fn, repeat: int):
    best = None
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("elf", nargs="?", default="/lib/x86_64-linux-gnu/libc.so.6")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    path = Path(args.elf)
    base, code = text_section(path)
    print(f"input: {path} .text, {len(code) / 1e6:.2f} MB")

    dt, (n, br) = time_it(lambda: sweep_hwtrace(code), args.repeat)
    ours = n / dt
    print(f"hwtrace.x86 (pure Python): {n} insns ({br} branches) in {dt:.3f} s"
          f" = {ours / 1e6:.3f} M insns/s, {len(code) / dt / 1e6:.2f} MB/s")

    cs = time_it(lambda: sweep_capstone(code, base), args.repeat)
    if cs[1] is None:
        print("capstone: not installed (pip install capstone to compare)")
    else:
        rate = cs[1] / cs[0]
        print(f"capstone disasm_lite: {cs[1]} insns in {cs[0]:.3f} s = "
              f"{rate / 1e6:.3f} M insns/s; hwtrace/capstone = {ours / rate:.2f}x")

    sub = code[:200_000]
    mine = time_it(lambda: per_call_hwtrace(sub), args.repeat)
    cs = time_it(lambda: per_call_capstone(sub, base), 1)
    if cs[1] is not None:
        a, b = mine[1] / mine[0], cs[1] / cs[0]
        print(f"per-call decode with class (first 200 KB): hwtrace "
              f"{a / 1e6:.3f} M insns/s, capstone (detail) {b / 1e6:.3f} M "
              f"insns/s; hwtrace/capstone = {a / b:.1f}x")

    objdump = shutil.which("objdump")
    if objdump:
        def run():
            r = subprocess.run([objdump, "-d", "-j", ".text", str(path)],
                               capture_output=True, check=True)
            return r.stdout.count(b"\n\t") or r.stdout.count(b"\n")
        od = time_it(run, 1)
        rate = od[1] / od[0]
        print(f"objdump -d (native, full text output): ~{od[1]} lines in "
              f"{od[0]:.3f} s = {rate / 1e6:.3f} M insns/s; "
              f"hwtrace/objdump = {ours / rate:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
