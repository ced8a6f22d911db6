"""Symbolizer: ELF symbols with load bias, PLT stubs, separate debug files
found by build-id, DWARF lines, assembly labels."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import _need

from hwtrace.analysis.symbols import Image, Symbolizer, SymbolError

PROG = r"""
#include <stdio.h>
__attribute__((noinline)) int twice(int x)
{
    return 2 * x;
}
int main(void)
{
    puts("hi");
    return twice(21);
}
"""


def tools():
    for t in ("gcc", "objcopy", "objdump", "strip"):
        if not shutil.which(t):
            _need(t, "binutils/gcc")


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    tools()
    d = tmp_path_factory.mktemp("sym")
    (d / "p.c").write_text(PROG)
    exe = d / "p"
    subprocess.run(["gcc", "-g", "-O1", "-Wl,--build-id", "-o", exe, d / "p.c"],
                   check=True, capture_output=True)
    dis = subprocess.run(["objdump", "-d", exe], capture_output=True, text=True,
                         check=True).stdout
    return d, exe, dis


def link_addr(dis: str, label: str) -> int:
    m = re.search(rf"^([0-9a-f]+) <{re.escape(label)}>:", dis, re.M)
    return int(m.group(1), 16)


def test_pie_with_bias(prog):
    d, exe, dis = prog
    bias = 0x555555554000
    s = Symbolizer()
    img = s.add_image(exe, bias)
    assert img.is_pie
    twice = link_addr(dis, "twice") + bias
    assert s.lookup(twice) == (twice, "twice")
    assert s.lookup(twice + 3) == (twice, "twice")
    assert s.describe(twice + 3) == "twice+0x3"
    assert img.address_of("main") == link_addr(dis, "main") + bias
    assert s.line(twice)[0] == str(d / "p.c")
    assert s.line(twice)[1] in (3, 4, 5)
    assert s.lookup(0x1000) is None
    assert s.describe(0x1000) == "0x1000"


def test_plt_stub_named(prog):
    d, exe, dis = prog
    # objdump names the stub puts@plt: our synthesized symbol must agree
    plt = link_addr(dis, "puts@plt")
    s = Symbolizer()
    s.add_image(exe, 0)
    assert s.lookup(plt) == (plt, "puts@plt")


def test_mapping_bias_from_file_offset(prog):
    d, exe, dis = prog
    probe = Image(exe)
    # the executable segment as the loader maps it
    vaddr, memsz, off, filesz = next(seg for seg in probe.segments if seg[2] > 0)
    page_off = off & ~0xFFF
    start = 0x7F0000000000 + (vaddr & ~0xFFF)
    s = Symbolizer()
    img = s.add_mapping(exe, start, page_off)
    assert img.bias == 0x7F0000000000
    main = link_addr(dis, "main") + img.bias
    assert s.lookup(main) == (main, "main")


def test_separate_debug_file_by_build_id(prog, tmp_path):
    d, exe, dis = prog
    img = Image(exe)
    bid = img.build_id
    assert bid and len(bid) == 40
    root = tmp_path / "debug"
    dbg = root / ".build-id" / bid[:2] / (bid[2:] + ".debug")
    dbg.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", exe, dbg], check=True)
    stripped = tmp_path / "p.stripped"
    subprocess.run(["strip", "-o", stripped, exe], check=True)
    twice = link_addr(dis, "twice")
    # stripped, no debug file: the static function is unknown
    s0 = Symbolizer(debug_roots=())
    s0.add_image(stripped)
    assert s0.lookup(twice) is None
    assert s0.line(twice) is None
    # with the debug file: names and lines are back
    s = Symbolizer(debug_roots=(str(root),))
    im = s.add_image(stripped)
    assert im.debug_file == str(dbg)
    assert s.lookup(twice) == (twice, "twice")
    assert s.line(twice)[0] == str(d / "p.c")


def test_assembly_labels(tmp_path):
    tools()
    src = tmp_path / "a.s"
    src.write_text(""".globl _start
.text
_start:
    nop
    nop
again:
    dec %rax
    jne again
done:
    mov $60, %eax
    syscall
""")
    exe = tmp_path / "a"
    subprocess.run(["gcc", "-nostdlib", "-static", "-o", exe, src], check=True,
                   capture_output=True)
    dis = subprocess.run(["objdump", "-d", exe], capture_output=True, text=True).stdout
    s = Symbolizer()
    s.add_image(exe)
    start, again, done = (link_addr(dis, x) for x in ("_start", "again", "done"))
    assert s.lookup(start + 1) == (start, "_start")
    assert s.lookup(again + 3) == (again, "again")
    assert s.lookup(done + 5) == (done, "done")


def test_not_an_elf(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"not an elf at all")
    with pytest.raises(SymbolError):
        Image(p)
    with pytest.raises(SymbolError):
        Image(tmp_path / "missing")


ALIASES = r"""
__attribute__((noinline)) int twice(int x) { return 2 * x; }
int doubled(int x) __attribute__((alias("twice")));
static int hidden_twice(int x) __attribute__((alias("twice"), used));
int main(void) { return doubled(21); }
"""


def test_function_under_another_name(tmp_path):
    """A function the symbolizer names once is found under each of its
    names (a --within or trigger NAME): the file's own symbol tables are
    read for it -- through the raw reader, or pyelftools where that one
    does not understand the file -- with the same rules as the symbolizer's
    (functions defined in a section, not undefined ones like ``puts``)."""
    from hwtrace.analysis import elfraw, symbols
    from hwtrace.branches import resolve
    tools()
    (tmp_path / "a.c").write_text(ALIASES)
    exe = tmp_path / "a"
    subprocess.run(["gcc", "-O1", "-o", exe, tmp_path / "a.c"], check=True,
                   capture_output=True)
    nm = subprocess.run(["nm", exe], capture_output=True, text=True, check=True).stdout
    at = {p[2]: int(p[0], 16) for p in (x.split() for x in nm.splitlines()) if len(p) == 3}
    twice = at["twice"]
    assert at["doubled"] == at["hidden_twice"] == twice
    s = Symbolizer()
    img = s.add_image(exe, 0x10000)
    shown = s.lookup(twice + 0x10000)[1]
    for name in ("twice", "doubled", "hidden_twice"):
        got = symbols.function_symbol(str(exe), name)
        assert got is not None and got[0] == twice, name
        if name != shown:
            assert resolve._alias(img, name) == (twice + 0x10000, got[1])
    assert resolve.function(s, "hidden_twice")[0] == twice + 0x10000
    assert symbols.function_symbol(str(exe), "no_such_function") is None
    assert symbols.function_symbol(str(tmp_path / "missing"), "twice") is None

    # the pyelftools route gives the same answers
    def refuse(data):
        raise elfraw.RawElfError("not understood")
    orig = symbols.RawElf
    symbols.RawElf = refuse
    try:
        for name in ("twice", "doubled", "hidden_twice", "no_such_function"):
            assert symbols.function_symbol(str(exe), name) == \
                (None if name == "no_such_function" else (twice, got[1])), name
    finally:
        symbols.RawElf = orig


def test_one_load_bias_for_mappings_and_live_symbols(prog):
    """A mapping's load bias, one formula (symbols.load_bias) for the
    symbolizer's mappings and the live runs' (livesyms.mapping_bias): the
    segment holding the file offset places it; else the first segment."""
    from hwtrace.analysis.symbols import load_bias
    from hwtrace.branches.livesyms import mapping_bias
    segs = [(0x400000, 0, 0x1000), (0x401000, 0x1000, 0x2000)]
    assert load_bias(segs, 0x7f0000001000, 0x1000) == 0x7f0000001000 - 0x401000
    assert load_bias(segs, 0x7f0000002800, 0x2800) == 0x7f0000000000 - 0x400000
    assert load_bias(segs[1:], 0x7f0000000000, 0) == 0x7f0000001000 - 0x401000
    assert load_bias([], 0x5000, 0x1000) == 0x4000
    # lld's layout (a Rust program here): the code segment is not
    # page-aligned in the file, its first page ends the read-only segment
    # before it, which lies a page nearer its address; the loader maps the
    # code from that page: the code's segment places it, not the one that
    # holds the offset too (every name was a page off: apply_match's
    # instructions named decompress)
    lld = [(0x0, 0x0, 0x13f64), (0x14f70, 0x13f70, 0x3f660),
           (0x555d0, 0x535d0, 0x2a30), (0x58000, 0x56000, 0x9c8)]
    assert load_bias(lld, 0x4000014000, 0x13000) == 0x4000000000
    assert load_bias(lld, 0x4000000000, 0x0) == 0x4000000000
    assert load_bias(lld, 0x4000055000, 0x53000) == 0x4000000000
    d, exe, dis = prog
    segments = Image(exe).segments
    first = next(seg for seg in segments if seg[2] > 0)    # as test_mapping_bias_...
    for vaddr, _memsz, off, _filesz in segments:
        for pgoff in (off & ~0xFFF, off + 0x10000):     # as mapped; past every segment
            start = 0x7F0000000000 + (vaddr & ~0xFFF)
            bias = Symbolizer().add_mapping(exe, start, pgoff).bias
            assert mapping_bias(str(exe), start, pgoff) == bias
            if (vaddr, off) == first[::2] and pgoff == off & ~0xFFF:
                assert bias == 0x7F0000000000


def test_dwarf5_relative_comp_dir_not_doubled(tmp_path):
    """DWARF 5's directory 0 *is* the compilation directory: a file named
    in it is not joined to DW_AT_comp_dir a second time.  Debian's glibc is
    built with comp_dir ``./elf`` (its directory 0 also ``./elf``): lcov,
    --lines and diff named its files ``elf/elf/dl-load.c``."""
    tools()
    sub = tmp_path / "src"
    sub.mkdir()
    (sub / "p.c").write_text(PROG)
    exe = tmp_path / "p"
    subprocess.run(["gcc", "-gdwarf-5", "-O1", f"-fdebug-prefix-map={sub}=./src",
                    "-o", exe, "p.c"], cwd=sub, check=True, capture_output=True)
    dis = subprocess.run(["objdump", "-d", exe], capture_output=True, text=True,
                         check=True).stdout
    s = Symbolizer()
    s.add_image(exe, 0)
    twice = link_addr(dis, "twice")
    assert s.line(twice)[0] == "src/p.c"
