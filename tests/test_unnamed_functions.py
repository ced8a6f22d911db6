"""Code no symbol names -- a stripped library's file-local functions -- is
named as perf names it, ``FILE+0xLINK``: the mapped file's basename and the
address's link-time address in it (what ``nm`` printed before the strip),
the same in every view; an address in no mapped file stays bare hex.

A small program calls an exported function of its own shared library,
which calls a ``static`` one; the library is stripped (``strip`` keeps
``.dynsym``: the exported function keeps its name, the static one loses
it).  One QEMU recording serves every view."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

from conftest import IN_CI, run_hwtrace

LIB = r"""
    __attribute__((noinline)) static long hidden_step(long x) {
      for (int i = 0; i < 5; i++) x = x * 7 + (x >> 3) + i;
      return x;
    }
    long visible(long n) {
      long s = 0;
      for (long i = 0; i < n; i++) s ^= hidden_step(s + i);
      return s;
    }
"""
MAIN = r"""
    #include <stdio.h>
    long visible(long n);
    int main(void) { printf("%ld\n", visible(40)); return 0; }
"""


def _need(what):
    if IN_CI:
        pytest.fail(f"{what} missing in CI")
    pytest.skip(f"{what} unavailable")


def _nm_address(path, name) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[2] == name:
            return int(f[0], 16)
    raise AssertionError(f"nm: no {name} in {path}")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """(dir, stripped library, the static function's link-time address)."""
    for tool in ("gcc", "strip", "nm"):
        if shutil.which(tool) is None:
            _need(tool)
    d = tmp_path_factory.mktemp("unnamed")
    (d / "lib.c").write_text(textwrap.dedent(LIB))
    (d / "main.c").write_text(textwrap.dedent(MAIN))
    so = d / "libunn.so"
    subprocess.run(["gcc", "-O1", "-fPIC", "-shared", "-o", str(so), str(d / "lib.c")],
                   check=True)
    hidden = _nm_address(so, "hidden_step")
    subprocess.run(["strip", str(so)], check=True)
    assert "hidden_step" not in subprocess.run(
        ["nm", "-D", str(so)], capture_output=True, text=True).stdout
    subprocess.run(["gcc", "-O1", "-o", str(d / "main"), str(d / "main.c"),
                    "-L", str(d), "-lunn", "-Wl,-rpath," + str(d)], check=True)
    return d, so, hidden


@pytest.fixture(scope="module")
def rec(lib):
    if shutil.which("qemu-x86_64") is None:
        _need("qemu-x86_64")
    d, _so, _hidden = lib
    r = run_hwtrace("record", "--mode", "thread", "-o", d / "rec", "--", d / "main")
    assert r.returncode == 0, r.stderr
    return d / "rec"


def test_symbolizer_names_unnamed_code_by_file_and_link_address(lib):
    from hwtrace.analysis.slices import NameTable
    from hwtrace.analysis.symbols import Symbolizer
    from hwtrace.analysis.symtable import AddrTable
    _d, so, hidden = lib
    bias = 0x7f0000000000
    sym = Symbolizer()
    sym.add_image(so, bias)
    want = f"libunn.so+{hidden:#x}"
    assert sym.lookup(bias + hidden) is None        # no symbol covers it ...
    assert sym.describe(bias + hidden) == want      # ... the file names it
    assert sym.describe(0x1234) == "0x1234"         # in no image: bare hex
    names = NameTable()
    table = AddrTable(sym.lookup, names)
    start, nid, known = table.resolve(np.array([bias + hidden, 0x1234], np.uint64))
    assert [names[i] for i in nid.tolist()] == [want, "0x1234"]
    assert start.tolist() == [bias + hidden, 0x1234]
    assert not known.any()                          # still no *function* known
    # a mapping names its file by the recorded name, not the copy's
    sym2 = Symbolizer()
    sym2.add_mapping(so, bias, 0, "/usr/lib/libunn.so.1")
    assert sym2.describe(bias + hidden) == f"libunn.so.1+{hidden:#x}"


def test_views_name_the_static_function(rec, lib, tmp_path):
    _d, _so, hidden = lib
    want = f"libunn.so+{hidden:#x}"
    r = run_hwtrace("calls", rec)
    assert r.returncode == 0, r.stderr
    calls = [ln.split()[0] for ln in r.stdout.splitlines() if "insns" in ln]
    i = calls.index("visible")
    assert calls[i + 1:i + 41] == [want] * 40       # the 40 calls it made
    r = run_hwtrace("summary", rec)
    assert r.returncode == 0, r.stderr
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith(want))
    assert row[1] == "40"                           # calls column
    r = run_hwtrace("export", rec, "--folded", tmp_path / "f.folded")
    assert r.returncode == 0, r.stderr
    stacks = [ln.rsplit(" ", 1)[0] for ln in (tmp_path / "f.folded").read_text().splitlines()]
    assert any(s.endswith(";visible;" + want) for s in stacks)
    r = run_hwtrace("branches", "--kinds", "call", "--format", "jsonl", rec)
    assert r.returncode == 0, r.stderr
    to = [d.get("to_sym") for d in map(json.loads, r.stdout.splitlines())]
    assert to.count(want) == 40
    # no view names code in the library by a bare address
    assert not any(s and s.startswith("0x") for s in to)
