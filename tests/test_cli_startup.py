"""What the command line imports: the paths that print counts, usage or an
error load none of the heavy modules (numpy, capstone, pyelftools: most of
a small trace's decode was their import) and nothing of the listing.

Each command line runs in a fresh interpreter (``python -c``) that calls
:func:`hwtrace.cli.main` in process and then reports ``sys.modules``: a
module present is one the command imported.  No timing: what a later
import would cost shows up as a module here (one the interpreter's own
start-up already imported -- site, a .pth file -- is in ``before`` and
goes unchecked: run these under an interpreter like the README's venv,
whose start-up imports no typing, pathlib or shutil).  The inputs are
made here: a synthetic trace of 4 instructions of a 5-byte code image,
and a thread-mode bundle holding them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hwtrace.bundle import BundleWriter, Mmap, Process
from hwtrace.pt import encoder as E

#: 3 nops and a syscall at 0x1000 (the syscall leaves user space: TIP.PGD)
TRACE = (E.psb() + E.mode_exec(csl=1) + E.psbend() + E.tip_pge(0x1000)
         + E.tip_pgd())
CODE = bytes.fromhex("9090900f05")

#: never on a path that prints counts, usage or errors
HEAVY = ("numpy", "capstone", "elftools", "hwtrace.listing",
         "hwtrace.analysis.symbols")

DRIVER = r"""
import contextlib, io, json, sys
before = sorted(sys.modules)
from hwtrace.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        status = main(sys.argv[1:])
    except SystemExit as e:         # argparse's --help and --version
        status = e.code
fast = sys.modules.get("hwtrace.flow.fast")
print(json.dumps({"status": status, "stdout": out.getvalue(),
                  "stderr": err.getvalue(), "modules": sorted(sys.modules),
                  "before": before,
                  "core": None if fast is None else fast.CORE is not None}))
"""


def imports_of(*argv) -> dict:
    r = subprocess.run([sys.executable, "-c", DRIVER, *map(str, argv)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def heavy(run: dict) -> list[str]:
    return [m for m in run["modules"]
            if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("startup")
    (d / "t.pt").write_bytes(TRACE)
    (d / "code.bin").write_bytes(CODE)
    with BundleWriter(d / "rec", engine="testing", mode="thread") as w:
        w.add_stream(TRACE, tid=11, pid=10, instructions_observed=4)
        w.add_image(d / "code.bin", path="/opt/code.bin")
        w.sideband.add(Process(pid=10, cr3=0x2000, comm="code", time=1))
        w.sideband.add(Mmap(pid=10, start=0x1000, size=len(CODE), offset=0,
                            file="/opt/code.bin", time=2))
    switching_bundle(d / "cpu")
    elf_bundle(d / "elf")
    return d


def elf_bundle(b):
    """A thread-mode bundle of TRACE whose code is an ELF file (no section
    headers, so no symbols: its code is named FILE+0xOFF)."""
    from test_flow_image import _elf64
    b.mkdir()
    (b / "code").write_bytes(_elf64([(0x1000, CODE)]))
    with BundleWriter(b / "rec", engine="testing", mode="thread") as w:
        w.add_stream(TRACE, tid=11, pid=10, instructions_observed=4)
        w.add_image(b / "code", path="/opt/code")
        w.sideband.add(Process(pid=10, cr3=0x2000, comm="code", time=1))
        # the code's file offset: after the ELF header and one program
        # header (64 + 56 bytes)
        w.sideband.add(Mmap(pid=10, start=0x1000, size=len(CODE),
                            offset=120, file="/opt/code", time=2))


def switching_bundle(b):
    """A cpu-mode bundle whose one stream runs two processes that map
    different code at 0x1000: process 1 (CODE: 4 instructions) from time
    100, process 2 (nop; syscall) from 150; the trace enables at 0x1000
    twice, at time 100 and 155.  Decoded in the right address space each
    time: 6 instructions and one edge (process 1's syscall to where
    tracing resumes); without the switch, 8."""
    from hwtrace.bundle import Switch
    b.mkdir()
    other = bytes.fromhex("900f05")
    (b / "one.bin").write_bytes(CODE)
    (b / "two.bin").write_bytes(other)
    trace = (E.psb() + E.tsc(100) + E.cbr(22) + E.mode_exec(csl=1)
             + E.psbend() + E.tip_pge(0x1000) + E.tsc(101) + E.tip_pgd()
             + E.tsc(155) + E.tip_pge(0x1000) + E.tsc(156) + E.tip_pgd())
    ctl = (1 << 13) | (1 << 3) | (1 << 2) | (1 << 10) | (1 << 9)
    with BundleWriter(b / "rec", engine="testing", mode="cpu",
                      config={"ctl": ctl}) as w:
        w.add_stream(trace, cpu=0, instructions_observed=6)
        for pid, code in ((1, "one"), (2, "two")):
            w.add_image(b / f"{code}.bin", path=f"/opt/{code}.bin")
            w.sideband.add(Process(pid=pid, cr3=pid << 12, comm=code, time=1))
            w.sideband.add(Mmap(pid=pid, start=0x1000, size=3 + pid % 2 * 2,
                                offset=0, file=f"/opt/{code}.bin", time=2))
        for t, prev, nxt in ((100, -1, 1), (150, 1, 2)):
            w.sideband.add(Switch(cpu=0, time=t, prev_pid=prev, prev_tid=prev,
                                  next_pid=nxt, next_tid=nxt))
    return b / "rec"


def _core_or_skip(run: dict) -> None:
    """The counts paths are the compiled flow core's: without it the
    listing's walk counts (numpy and all), as it should."""
    from hwtrace.flow import fast
    fast.STATUS.check()             # expected here and unusable: a failure
    if not run["core"]:
        pytest.skip(f"no compiled flow core: {fast.STATUS.reason}")


@pytest.mark.parametrize("argv,expect", [
    (["decode", "--quiet", "--stat", "--pt", "{d}/t.pt",
      "--raw", "{d}/code.bin:0x1000"], "insn: 4."),
    (["decode", "--quiet", "--stat", "--insn-decoder", "--pt", "{d}/t.pt",
      "--raw", "{d}/code.bin:0x1000"], "insn: 4."),
    (["decode", "--quiet", "--stat", "{d}/rec"], "insn: 4."),
    (["decode", "-q", "--stat:insn", "--resync-on-error", "{d}/rec"],
     "insn: 4."),
    (["coverage", "--edges", "--pt", "{d}/t.pt",
      "--raw", "{d}/code.bin:0x1000"], "insns: 4."),
    (["coverage", "--edges", "--quiet", "{d}/rec"], "insns: 4."),
    # a bundle whose code is an ELF file (its program headers read)
    (["coverage", "--edges", "--quiet", "{d}/elf/rec"], "insns: 4."),
    # a stream switching processes: the core switches the address space
    # (no batches, no numpy edge counter)
    (["decode", "--quiet", "--stat", "{d}/cpu/rec"], "insn: 6."),
    (["coverage", "--edges", "{d}/cpu/rec"],
     "0000000000001003 0000000000001000 1\nedges: 1, taken: 1, insns: 6."),
])
def test_counts_paths_import_nothing_heavy(inputs, argv, expect):
    run = imports_of(*(a.format(d=inputs) for a in argv))
    _core_or_skip(run)
    assert run["status"] == 0, run["stderr"]
    assert expect in run["stdout"]
    assert heavy(run) == []
    # the core fills its instruction cache from the image's bytes (every
    # instruction here decodes in C): the twin's x86 decoder and its
    # instruction cache are not loaded
    assert {"hwtrace.x86.decoder", "hwtrace.x86.tables",
            "hwtrace.flow.fetch"} & set(run["modules"]) == set()
    # nor the Python packet decoder (30 NamedTuple packet types): the core
    # reads the packets, and a switcher asks the core for the time ahead
    assert {"hwtrace.pt.decoder", "hwtrace.pt.packets"} & \
        set(run["modules"]) == set()
    # the records made before the core runs (config, image, bundle,
    # sideband, streams) are NamedTuples and plain classes: importing
    # dataclasses (inspect, ast, dis, tokenize) and creating dataclasses
    # was most of these commands' own start-up (hwtrace._records)
    new = set(run["modules"]) - set(run["before"])
    assert {"dataclasses", "inspect"} & new == set()
    # nor typing (hwtrace.pt.errors' PtError is a collections.namedtuple)
    # or shutil (argparse's formatters get their width from
    # hwtrace.cli.terminal_columns); nor pathlib, whose import (urllib.parse,
    # ipaddress) was half of what a bundle added to these commands: the
    # staleness check of hwtrace._ext and a bundle's reader (hwtrace.bundle,
    # its images and streams) work on path strings
    assert {"typing", "shutil", "bz2", "lzma", "pathlib"} & new == set()
    # the compiled cores' staleness check is answered by their builds'
    # stamps: no SHA-256 module loaded (hwtrace._ext.sources hashes the
    # sources only where a stamp does not match)
    assert {"_sha256", "_sha2", "hashlib"} & new == set()
    # nor struct: the flow core's records and ELF program headers are
    # read without it (fast._struct, loaders._le)
    assert {"struct", "_struct"} & new == set()


def test_dump_stat_imports_only_the_packet_scan(inputs):
    run = imports_of("dump", "--stat", inputs / "t.pt")
    assert run["status"] == 0, run["stderr"]
    assert run["stdout"].startswith("packets: ")
    assert heavy(run) == []
    assert "hwtrace.pt.ptdump_format" not in run["modules"]
    assert "hwtrace.flow" not in run["modules"]
    # the packet records (hwtrace.pt.packets, which the compiled scanner's
    # module imports) are collections.namedtuple classes: no typing
    new = set(run["modules"]) - set(run["before"])
    assert {"typing", "pathlib", "shutil", "dataclasses"} & new == set()


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["--version"], ["frobnicate"], ["--no-such-option"],
    ["decode", "--help"], ["coverage", "--help"], ["dump", "--help"],
    ["decode", "--no-such-option"], ["import", "--help"],
])
def test_usage_and_errors_import_only_the_command_line(argv):
    run = imports_of(*argv)
    assert run["status"] in (0, 2), run["stderr"]
    assert run["stdout"] or run["stderr"]
    assert heavy(run) == []
    # help is formatted to the terminal's width without shutil (and the
    # compression modules it imports): hwtrace.cli.terminal_columns
    new = set(run["modules"]) - set(run["before"])
    assert {"shutil", "bz2", "lzma"} & new == set()
    # the parsers only: nothing that decodes, records or reads a bundle
    assert [m for m in run["modules"] if m.startswith("hwtrace.")
            and not m.startswith("hwtrace.cli")] == []
    # and of the commands only the one named first: a command line that
    # names none (usage, --help, --version, a bad command or option)
    # lists the commands from hwtrace.cli.COMMANDS and builds no parser
    # (coverage takes decode's image and timing options from its module)
    named = {"decode": ["decode"], "coverage": ["coverage", "decode"],
             "dump": ["dump"], "import": ["import_perf"]}.get(
                 argv[0] if argv else "", [])
    assert commands_of(run) == [f"hwtrace.cli.{m}" for m in named]


def commands_of(run: dict) -> list[str]:
    return [m for m in run["modules"] if m.startswith("hwtrace.cli.")
            and not m.startswith("hwtrace.cli._")]


@pytest.mark.parametrize("columns", [None, "50", "132", "0", "-3", "wide",
                                     " 90 "])
def test_help_width_is_shutils(monkeypatch, columns):
    """hwtrace.cli.terminal_columns (the width argparse's formatters get,
    so that they do not import shutil) is what shutil.get_terminal_size
    says: COLUMNS when a positive integer, else the terminal's, else 80;
    whatever LINES says."""
    import shutil
    from hwtrace import cli
    for lines in (None, "40"):
        for name, value in (("COLUMNS", columns), ("LINES", lines)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert cli.terminal_columns() == shutil.get_terminal_size().columns


def test_views_read_symbols_without_pyelftools(inputs):
    """summary and calls name functions from ELF files read by
    hwtrace.analysis.elfraw: pyelftools (~35 ms of imports) is imported
    only for a file that reader does not understand, a debug file it does
    not read or DWARF lines; c++filt's subprocess only for C++ names."""
    for command in ("summary", "calls"):
        run = imports_of(command, inputs / "elf" / "rec")
        assert run["status"] == 0, run["stderr"]
        assert "code+0x1000" in run["stdout"]
        assert [m for m in run["modules"]
                if m == "elftools" or m.startswith("elftools.")] == []
        new = set(run["modules"]) - set(run["before"])
        assert {"subprocess", "shutil"} & new == set()


def test_a_command_reached_later_is_parsed_by_its_own_parser():
    """A command line whose first word is an option still reaches the
    command it names: its parser is built then, and parses as when the
    command comes first (here: both options unknown, said together)."""
    run = imports_of("--no-such-option", "decode", "--bogus")
    assert run["status"] == 2
    assert run["stderr"] == \
        "hwtrace: unrecognized arguments: --no-such-option --bogus\n"
    assert commands_of(run) == ["hwtrace.cli.decode"]


def test_the_command_table_is_what_the_modules_register():
    """hwtrace.cli.COMMANDS names every command module of the package, in
    order, and each module registers its command with the table's help
    (what ``hwtrace --help`` lists without importing them)."""
    import os
    from hwtrace import cli
    here = os.path.dirname(cli.__file__)
    modules = sorted(f[:-3] for f in os.listdir(here)
                     if f.endswith(".py") and not f.startswith("_"))
    assert sorted(m for m, _help in cli.COMMANDS.values()) == modules
    assert list(cli.COMMANDS) == sorted(cli.COMMANDS)
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert [(a.dest, a.help) for a in sub._choices_actions] == \
        [(name, h) for name, (_m, h) in cli.COMMANDS.items()]


def test_a_named_command_builds_only_its_own_parser():
    run = imports_of("decode", "--help")
    assert run["status"] == 0 and "--quiet" in run["stdout"]
    assert commands_of(run) == ["hwtrace.cli.decode"]


LAZY = r"""
import json, sys
import hwtrace, hwtrace.pt, hwtrace.analysis
before = sorted(sys.modules)
out = {"dir": "PacketDecoder" in dir(hwtrace.pt)
              and "CallStackBuilder" in dir(hwtrace.analysis)
              and "Mode" in dir(hwtrace)}
for pkg, name in [(hwtrace.pt, "PacketDecoder"), (hwtrace.analysis, "reconstruct"),
                  (hwtrace, "Mode")]:
    value = getattr(pkg, name)
    out[name] = [value.__module__, vars(pkg).get(name) is value]
try:
    hwtrace.pt.no_such_name
except AttributeError as e:
    out["error"] = str(e)
out["before"] = [m for m in before if m in (
    "hwtrace.pt.decoder", "hwtrace.analysis.callstack", "hwtrace.control.ctl")]
print(json.dumps(out))
"""


def test_lazy_reexports_import_on_first_use_and_stay():
    """The packages' re-exports (one helper, ``hwtrace._lazy_exports``):
    importing a package loads none of them; the first use imports the
    module holding the name and caches it in the package."""
    r = subprocess.run([sys.executable, "-c", LAZY], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {
        "dir": True, "before": [],
        "PacketDecoder": ["hwtrace.pt.decoder", True],
        "reconstruct": ["hwtrace.analysis.callstack", True],
        "Mode": ["hwtrace.control.ctl", True],
        "error": "module 'hwtrace.pt' has no attribute 'no_such_name'"}


def test_a_listing_loads_capstones_library_not_its_package(inputs):
    """Printing instructions needs capstone's text: its shared library is
    called through hwtrace.listing.cslib, not through ``import capstone``
    (whose ``__init__`` imports the modules of all its architectures,
    ~110 ms here), where the installed capstone is the major version
    whose C layout cslib knows."""
    from hwtrace.listing import cslib
    if not cslib.available():
        pytest.skip("capstone is not installed")
    if not cslib._load():
        pytest.skip("not capstone 5's library: the package is used")
    run = imports_of("decode", "--pt", inputs / "t.pt", "--raw",
                     f"{inputs / 'code.bin'}:0x1000")
    assert run["status"] == 0, run["stderr"]
    assert "syscall" in run["stdout"] and "nop" in run["stdout"]
    assert not [m for m in run["modules"] if m == "capstone" or m.startswith("capstone.")]


@pytest.mark.parametrize("bits", [16, 32, 64])
@pytest.mark.parametrize("att", [False, True], ids=["intel", "att"])
def test_cslib_gives_the_capstone_packages_text(bits, att):
    """The same (address, size, mnemonic, operands) as the capstone
    package's disasm_lite, over code of every kind of operand and a byte
    that is no instruction (where both stop)."""
    capstone = pytest.importorskip("capstone")
    from hwtrace.listing import cslib
    code = bytes.fromhex(
        "554889e54883ec10897dfc8b45fc0fafc0c9c3"        # push/mov/sub/imul/leave/ret
        "488d0501000000ff2425100000000f1f440000"          # lea rip, jmp [abs], nopl
        "e8fbffffff7405ebf9cc66900f05f30f1efa"            # call, je, jmp, int3, xchg, syscall, endbr64
        "c5fd6fc1f20f10442408"                            # vmovdqa, movsd
        "06")                                             # push es (invalid in 64-bit)
    ours = cslib.engine(bits, att).disasm_lite(code, 0x401000, 0)
    m = {16: capstone.CS_MODE_16, 32: capstone.CS_MODE_32, 64: capstone.CS_MODE_64}[bits]
    cs = capstone.Cs(capstone.CS_ARCH_X86, m)
    if att:
        cs.syntax = capstone.CS_OPT_SYNTAX_ATT
    theirs = list(cs.disasm_lite(code, 0x401000, 0))
    assert ours == theirs and len(ours) > 5
    assert cslib.engine(bits, att).disasm_lite(code[:3], 0x10, 1) == \
        list(cs.disasm_lite(code[:3], 0x10, 1))
