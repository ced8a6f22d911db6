"""hwtrace record's option parsing: config names to IA32_RTIT_CTL, sizes."""

import argparse
import re

import pytest

from hwtrace.cli import CliError
from hwtrace.cli.record import buffer_geometry, parse_config, parse_size
from hwtrace.control.ctl import Ctl


def test_default_and_flags():
    ctl, cr3, ranges = parse_config("branch;user;retc;tsc")
    assert ctl == Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN and cr3 == 0 and ranges == {}
    ctl, _, _ = parse_config("branch;user;tsc")
    assert ctl == Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN | Ctl.DIS_RETC
    ctl, _, _ = parse_config("branch;user;retc;noretc;cyc;cyc-thresh=3;mtc;mtc-freq=9;psb-freq=2")
    assert ctl == (Ctl.BRANCH_EN | Ctl.USER | Ctl.DIS_RETC | Ctl.CYC_EN | Ctl.MTC_EN
                   | (3 << 19) | (9 << 14) | (2 << 24))
    ctl, cr3, _ = parse_config("branch;user;retc;cr3-match=0x2000")
    assert cr3 == 0x2000 and ctl & Ctl.CR3_FILTER


def test_ranges():
    ctl, _, ranges = parse_config("branch;user;retc;addr0=filter;addr0-range=0x1000,0x1fff;"
                                  "addr1=stop;addr1-range=/bin/true,main,0x20")
    assert ctl >> 32 == 0x21
    assert ranges == {0: (None, 0x1000, 0x1fff), 1: ("/bin/true", "main", 0x20)}
    for bad in ("branch;bogus", "addr0=filter", "addr0-range=1,2", "addr0=maybe;addr0-range=1,2",
                "addr0=stop;addr0-range=foo,2", "mtc-freq=16", "cyc-thresh=x"):
        with pytest.raises(CliError):
            parse_config(bad)


def test_sizes():
    assert parse_size("4K") == 4096 and parse_size("64M") == 64 << 20 and parse_size("8192") == 8192
    ns = argparse.Namespace
    assert buffer_geometry(ns(buffer_size="8K", num_chunks=None, chunk_order=None)) == (1, 1)
    assert buffer_geometry(ns(buffer_size="3M", num_chunks=None, chunk_order=None)) == (3, 8)
    assert buffer_geometry(ns(buffer_size=None, num_chunks=None, chunk_order=None)) == (64, 8)
    assert buffer_geometry(ns(buffer_size=None, num_chunks=4, chunk_order=2)) == (4, 2)
    with pytest.raises(CliError):
        buffer_geometry(ns(buffer_size="5000", num_chunks=None, chunk_order=None))
    with pytest.raises(CliError):
        buffer_geometry(ns(buffer_size="8K", num_chunks=2, chunk_order=None))


@pytest.mark.parametrize("opts,said", [
    ({"chunk_order": 9}, "--chunk-order must be 0..8"),
    ({"chunk_order": -1}, "--chunk-order must be 0..8"),
    ({"num_chunks": 0}, "--num-chunks must be 1..4096"),
    ({"num_chunks": 5000}, "--num-chunks must be 1..4096"),
    ({"buffer_size": "0"}, "--buffer-size must be a positive multiple of 4K"),
    ({"buffer_size": "8G"}, "--buffer-size 8G: a buffer holds at most 256M"),
    ({"buffer_size": "16388K"}, "--buffer-size 16388K: more than 4096 chunks of 4K"),
])
def test_buffer_options_are_named_as_given(opts, said):
    """The control API's own words ("chunk_order must be 0..8", "a buffer
    holds at most 256 MiB") reached the user of --chunk-order and
    --buffer-size, and "--buffer-size 0" was "must be a multiple of 4K"."""
    ns = argparse.Namespace(**{"buffer_size": None, "num_chunks": None,
                               "chunk_order": None, **opts})
    with pytest.raises(CliError, match=re.escape(said)):
        buffer_geometry(ns)


def test_range_symbols_any_type_from_the_symbol_reader(tmp_path):
    """addrN-range=ELF,BEGIN,END names symbols of any type (a static
    function of .symtab, a data object), BEGIN at its first byte and END at
    its last; what can't be resolved is one --config error naming why."""
    import shutil
    import subprocess
    from conftest import _need
    from hwtrace.cli.record import _elf_relative, _symbol
    if not shutil.which("gcc"):
        _need("gcc", "builds the program whose symbols are named")
    (tmp_path / "p.c").write_text(
        "int table[4] = {1};\n"
        "static int helper(int x) { return x * 3 + table[x & 3]; }\n"
        "int main(int c, char **v) { return helper(c); }\n")
    exe = tmp_path / "p"
    subprocess.run(["gcc", "-O0", "-o", exe, tmp_path / "p.c"], check=True)
    syms = {}
    for line in subprocess.run(["readelf", "-sW", exe], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 8 and f[7] in ("helper", "table", "main"):
            syms[f[7]] = (int(f[1], 16), int(f[2]), f[3])
    assert syms["helper"][2] == "FUNC" and syms["table"][2] == "OBJECT"
    for name, (value, size, _type) in syms.items():
        assert _symbol(str(exe), name, False) == value
        assert _symbol(str(exe), name, True) == value + size - 1
    assert _elf_relative(str(exe), "table", "table") == (
        syms["table"][0], syms["table"][0] + 15, True)
    for elf, name, msg in [
            (exe, "nosuch", f"--config: no symbol 'nosuch' in {exe}"),
            (tmp_path / "p.c", "main", f"--config: {tmp_path / 'p.c'}: not a readable ELF file "
                                       f"(ELFError)"),
            (tmp_path / "none", "main", f"--config: {tmp_path / 'none'}: No such file or "
                                        f"directory")]:
        with pytest.raises(CliError) as e:
            _symbol(str(elf), name, False)
        assert str(e.value) == msg
