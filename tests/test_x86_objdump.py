"""Differential test against GNU objdump: length and branch class of every
instruction of real code, in 64-, 32- and 16-bit mode.

64-bit: libc's and a few programs' .text (objdump -d -M intel64: Intel's
near-branch semantics, as the CPU that produced an Intel PT trace).
32/16-bit: raw bytes through `objdump -D -b binary -m i386 / -m i8086`:
code compiled with gcc -m32 / -m16 when gcc can, plus libc's 64-bit code
reinterpreted in the narrower mode (a dense mix of prefixes and opcodes).

objdump's "(bad)" lines are skipped (libipt's length decoder decodes
undefined opcodes where objdump gives up), and so are the few encodings
where objdump and the architecture (or libipt) disagree; each such rule
is listed in KNOWN_OBJDUMP_DIFFERENCES with its reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, IN_CI
from hwtrace.x86 import Mode, X86Error, decoder_for

OBJDUMP = shutil.which("objdump")
LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
PROGRAMS = [Path(p) for p in ("/usr/bin/bash", "/usr/bin/gdb", "/usr/bin/qemu-x86_64")]
# the statically linked programs of the real hardware captures
PROGRAMS += [FIXTURES / "drpt2trace_simple" / "hello", FIXTURES / "hase_loopy" / "loopy"]

_PREFIX_WORDS = {
    "notrack", "bnd", "rep", "repz", "repnz", "repe", "repne", "lock",
    "data16", "data32", "addr16", "addr32", "cs", "ds", "es", "ss", "fs",
    "gs", "xacquire", "xrelease", "{vex}", "{vex3}", "{evex}", "{rex2}",
    "{load}", "{store}", "{nf}",
}

_RET = {"ret", "retq", "retw", "retl"}
_FAR_RET = {"lret", "lretq", "lretw", "lretl", "iret", "iretd", "iretq",
            "iretw", "iretl", "sysret", "sysretq", "sysretl", "sysexit",
            "sysexitl", "sysexitq", "vmlaunch", "vmresume", "eretu", "erets",
            "uiret"}
_FAR_CALL = {"lcall", "lcallw", "lcalll", "lcallq", "syscall", "sysenter",
             "int", "int3", "into", "int1", "icebp", "vmcall"}
_FAR_JMP = {"ljmp", "ljmpw", "ljmpl", "ljmpq"}
_COND = {"jcxz", "jecxz", "jrcxz", "loop", "loope", "loopne", "loopz",
         "loopnz", "loopw", "loopl", "loopq", "loopew", "loopel", "loopeq",
         "loopnew", "loopnel", "loopneq", "loopzw", "loopzl", "loopzq",
         "loopnzw", "loopnzl", "loopnzq"}


def objdump_class(mnemonic: str) -> str:
    """The libipt class objdump's mnemonic implies."""
    m = mnemonic
    if m in _RET:
        return "return"
    if m in _FAR_RET:
        return "far_return"
    if m in _FAR_CALL:
        return "far_call"
    if m in _FAR_JMP:
        return "far_jump"
    if m in _COND:
        return "cond_jump"
    if m in ("call", "callq", "callw", "calll"):
        return "call"
    if m in ("jmp", "jmpq", "jmpw", "jmpl"):
        return "jump"
    if m.startswith("j"):
        return "cond_jump"
    if m == "ptwrite" or m.startswith("ptwrite"):
        return "ptwrite"
    return "other"


_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t(.*)$")


def parse_objdump(text: str):
    """Yield (address, length, mnemonic, operands) per instruction line."""
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        addr, hexs, asm = m.groups()
        words = asm.split()
        while words and (words[0] in _PREFIX_WORDS or words[0].startswith("rex")):
            words = words[1:]
        mnem = words[0].split(",")[0] if words else ""
        yield int(addr, 16), len(hexs.split()), mnem, " ".join(words[1:])


def text_section(path: Path):
    """(vaddr, bytes) of the ELF's .text section."""
    from elftools.elf.elffile import ELFFile
    with path.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".text")
        return sec["sh_addr"], sec.data()


_LEGACY_PREFIXES = (0x66, 0x67, 0xF2, 0xF3, 0xF0, 0x26, 0x2E, 0x36, 0x3E,
                    0x64, 0x65)


# Encodings where objdump's answer is not the CPU's/libipt's. Each entry:
# (predicate on (mode, bytes at the instruction, objdump mnemonic), reason).
def _known(mode: Mode, code: bytes, mnem: str, ops: str) -> str | None:
    if "(bad)" in ops:
        return "objdump stops at an operand it cannot form (e.g. a memory "\
            "ModRM where only registers are defined) and reports fewer bytes"
    body = code.lstrip(bytes(_LEGACY_PREFIXES))
    if body[:1] == b"\x9b":
        return ("objdump fuses FWAIT (9B) with the x87 instruction after it "
                "(fstsw = 9B DD /7); the CPU executes 9B on its own")
    if mnem == "mov" and "%tr" in ops:
        return ("0F 24/0F 26 mov to/from test registers (386/486 only): "
                "libipt decodes them without ModRM")
    return None


def compare(code: bytes, base: int, listing: str, mode: Mode, limit=None):
    """Decode at every objdump address; return (count, mismatches)."""
    dec = decoder_for(mode)
    bad = []
    n = 0
    for addr, length, mnem, ops in parse_objdump(listing):
        if mnem in ("(bad)", "", ".byte"):
            continue
        off = addr - base
        try:
            insn = dec(code, off)
            got = (insn.size, insn.iclass.oracle_name)
        except X86Error as e:
            got = (e.reason, "")
        want = (length, objdump_class(mnem))
        n += 1
        if got != want:
            why = _known(mode, code[off:off + 15], mnem, ops)
            if why is None:
                bad.append((hex(addr), code[off:off + 15].hex(), mnem, ops,
                            want, got))
        if limit and n >= limit:
            break
    return n, bad


def _objdump(args):
    r = subprocess.run([OBJDUMP, "-w", "--insn-width=16", *args],
                       capture_output=True, text=True, check=True)
    return r.stdout


def _need_objdump():
    if OBJDUMP is None:
        if IN_CI:
            pytest.fail("objdump missing in CI")
        pytest.skip("objdump not installed")


_MAX_TEXT = 1_500_000


@pytest.mark.parametrize("path", [LIBC, *PROGRAMS], ids=lambda p: p.name)
def test_64bit_real_binaries_match_objdump(path, request):
    _need_objdump()
    if path.is_relative_to(FIXTURES):
        request.getfixturevalue("hardware")     # skipped (CI: failed) if missing
    elif not path.exists():
        pytest.skip(f"{path} not present")
    base, code = text_section(path)
    stop = base + min(len(code), _MAX_TEXT)   # economical (gdb: 7 MB)
    listing = _objdump(["-d", "-M", "intel64", "-j", ".text",
                        f"--stop-address={stop:#x}", str(path)])
    n, bad = compare(code, base, listing, Mode.BIT64)
    assert not bad, (len(bad), bad[:25])
    assert n > (1000 if stop - base > 100_000 else 5)


def _raw(code: bytes, arch: str, tmp: Path) -> str:
    p = tmp / "code.bin"
    p.write_bytes(code)
    return _objdump(["-D", "-b", "binary", "-m", arch, str(p)])


@pytest.mark.parametrize("mode,arch", [(Mode.BIT32, "i386"), (Mode.BIT16, "i8086")])
def test_narrow_modes_reinterpreting_libc_match_objdump(mode, arch, tmp_path):
    _need_objdump()
    if not LIBC.exists():
        pytest.skip("libc not present")
    _, code = text_section(LIBC)
    code = code[:400_000]
    n, bad = compare(code, 0, _raw(code, arch, tmp_path), mode)
    assert not bad, (len(bad), bad[:25])
    assert n > 50_000


def _random_stream(seed: int, chunks: int) -> bytes:
    """Random bytes biased towards prefixes, escapes and the opcodes whose
    length depends on prefixes or ModRM (VEX/EVEX/XOP escapes, 9A/EA,
    moffs, C7/F6/F7 groups, ENTER, rel32 branches)."""
    import random
    rng = random.Random(seed)
    pfx = [0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x64, 0xF0, 0x40, 0x48, 0x41]
    ops = [0xC4, 0xC5, 0x62, 0x8F, 0x9A, 0xEA, 0xC7, 0xF6, 0xF7, 0xA0, 0xA1,
           0xA2, 0xA3, 0xC8, 0xE8, 0xE9, 0x0F, 0xFF, 0xCD, 0xC2, 0xCA]
    buf = bytearray()
    for _ in range(chunks):
        k = rng.random()
        if k < 0.3:
            buf.append(rng.choice(pfx))
        elif k < 0.5:
            buf.append(rng.choice(ops))
        if rng.random() < 0.3:
            buf.append(0x0F)
            if rng.random() < 0.2:
                buf.append(rng.choice((0x38, 0x3A)))
        buf += rng.randbytes(8)
    return bytes(buf)


@pytest.mark.parametrize("mode,arch", [(Mode.BIT64, "i386:x86-64"),
                                       (Mode.BIT32, "i386"),
                                       (Mode.BIT16, "i8086")])
def test_random_bytes_match_objdump(mode, arch, tmp_path):
    """Dense coverage of rare opcodes: every instruction objdump can decode
    in a seeded random stream has the same length and class here."""
    _need_objdump()
    code = _random_stream(seed=5, chunks=15_000)
    p = tmp_path / "rnd.bin"
    p.write_bytes(code)
    args = ["-D", "-b", "binary", "-m", arch]
    if mode == Mode.BIT64:
        args += ["-M", "intel64"]
    n, bad = compare(code, 0, _objdump([*args, str(p)]), mode)
    assert not bad, (len(bad), bad[:25])
    assert n > 30_000


# Freestanding C (no headers needed, so no 32-bit libc is required).
_C_SOURCE = r"""
typedef unsigned long long u64; typedef unsigned int u32;
struct node { struct node *next; int key; double val; short s; char c[3]; };
static int cmp(const void *a, const void *b) { return *(int *)a - *(int *)b; }
void sort(int *v, int n, int (*f)(const void *, const void *)) {
    for (int i = 1; i < n; i++) for (int j = i; j > 0 && f(&v[j-1], &v[j]) > 0; j--)
        { int t = v[j]; v[j] = v[j-1]; v[j-1] = t; } }
u64 hash(const unsigned char *p, u32 n) { u64 h = 1469598103934665603ULL;
    while (n--) { h ^= *p++; h *= 1099511628211ULL; } return h; }
u64 divmod(u64 a, u64 b, u64 *r) { *r = a % b; return a / b; }
double poly(double x, const double *c, int n) { double y = 0;
    for (int i = n - 1; i >= 0; i--) y = y * x + c[i]; return y; }
float mixf(float a, float b, int k) { return k & 1 ? a * b : a / (b + 1.0f); }
int sw(int x) { switch (x) { case 0: return 3; case 1: return 9; case 2: return 27;
    case 3: return 81; case 5: return -1; case 8: return x * x; default: return x; } }
long list_sum(struct node *n) { long s = 0; for (; n; n = n->next) s += n->key + n->s + n->c[1];
    return s; }
static volatile int sink;
void spin(int n) { while (n-- > 0) sink += n; }
int rec(int n) { return n < 2 ? n : rec(n - 1) + rec(n - 2); }
int apply(int (*fs[])(int), int n, int x) { for (int i = 0; i < n; i++) x = fs[i](x); return x; }
u32 bits(u32 x) { return (x >> 3) ^ (x << 7) ^ __builtin_popcount(x) ^ __builtin_clz(x | 1); }
long long m64(long long a, long long b) { return a * b + (a >> 17) - (b << 5); }
void memset8(char *p, char v, int n) { while (n--) *p++ = v; }
int main_like(int argc, char **argv) { int v[8] = {5, 2, 7, 1, 9, 3, 8, 0};
    sort(v, 8, cmp); return v[argc & 7] + sw(argc) + rec(argc) + (int)hash((void *)argv, 4); }
"""


@pytest.mark.parametrize("mode,flag,arch", [(Mode.BIT32, "-m32", "i386"),
                                            (Mode.BIT16, "-m16", "i8086")])
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os"])
def test_gcc_narrow_mode_code_matches_objdump(mode, flag, arch, opt, tmp_path):
    """Compiler output for 32-bit and (gcc -m16: 32-bit code with 66/67
    prefixes, run in a 16-bit code segment) 16-bit mode."""
    _need_objdump()
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc unavailable")
    src = tmp_path / "t.c"
    src.write_text(_C_SOURCE)
    obj = tmp_path / "t.o"
    r = subprocess.run([gcc, flag, opt, "-ffreestanding", "-nostdinc",
                        "-fno-asynchronous-unwind-tables", "-fno-pic",
                        "-c", "-o", str(obj), str(src)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"gcc {flag} unavailable: {r.stderr.strip()[:200]}")
    from elftools.elf.elffile import ELFFile
    with obj.open("rb") as f:
        code = ELFFile(f).get_section_by_name(".text").data()
    n, bad = compare(code, 0, _raw(code, arch, tmp_path), mode)
    assert not bad, (len(bad), bad[:25])
    assert n > 100
