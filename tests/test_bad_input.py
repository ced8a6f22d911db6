"""Bad input is named: one line on stderr naming the file and what is wrong,
exit status 2, no traceback, nothing on stdout -- where nothing could be
done.  A damaged trace that still has good parts is decoded where it can be
(its errors in the output at their offsets), exit status 0.

The checks live where traces and images are opened (hwtrace.cli._tracemap,
hwtrace.flow.loaders); these tests go through every command that reads them.
Everything here is built by the test: synthetic traces from the encoder,
a 5-byte code image, an ELF patched to another machine.
"""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from conftest import run_hwtrace
from hwtrace.pt import encoder as E

#: a trace that decodes to 4 instructions of CODE at 0x1000 (3 nops and a
#: syscall, which leaves the traced user space: TIP.PGD)
GOOD = (E.psb() + E.mode_exec(csl=1) + E.psbend() + E.tip_pge(0x1000)
        + E.tip_pgd())
CODE = bytes.fromhex("9090900f05")
#: bytes that are not Intel PT (seeded: the same in every run; no PSB)
JUNK = random.Random(18).randbytes(100_000)
assert E.psb() not in JUNK


def _one_line(r, *words):
    """Exit 2, nothing on stdout, exactly one line on stderr that says
    ``hwtrace:`` and every one of ``words``."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("hwtrace") and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture
def files(tmp_path):
    f = {
        "junk": tmp_path / "junk.bin",
        "empty": tmp_path / "empty.pt",
        "good": tmp_path / "good.pt",
        "code": tmp_path / "code.bin",
        "dir": tmp_path / "adir",
    }
    f["junk"].write_bytes(JUNK)
    f["empty"].write_bytes(b"")
    f["good"].write_bytes(GOOD)
    f["code"].write_bytes(CODE)
    f["dir"].mkdir()
    return f


def test_hwtrace_alone_prints_usage():
    r = run_hwtrace()
    assert r.returncode == 2
    assert r.stdout.startswith("usage: hwtrace")
    for cmd in ("record", "dump", "decode", "summary", "export"):
        assert f"\n    {cmd} " in r.stdout
    assert "exit status:" in r.stdout


@pytest.mark.parametrize("kind,words", [
    ("junk", ["junk.bin", "no PSB", "100,000 bytes", "not an Intel PT trace"]),
    ("empty", ["empty.pt", "empty file (0 bytes)"]),
])
def test_dump_names_a_trace_with_nothing_to_decode(files, kind, words):
    for fmt in (["--format", "ptdump"], ["--format", "jsonl"], ["--stat"]):
        _one_line(run_hwtrace("dump", files[kind], *fmt), *words)


def test_dump_no_sync_still_dumps_bytes_without_a_psb(files):
    r = run_hwtrace("dump", "--no-sync", files["junk"])
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("0000000000000000  cyc")
    assert "error decoding packet" in r.stdout


def test_dump_directory_is_one_line(files):
    _one_line(run_hwtrace("dump", files["dir"]), "adir", "directory")


def test_dump_of_a_bundle_names_its_streams(tmp_path):
    """``dump DIR`` of a bundle said only "Is a directory": it names the
    streams to dump instead."""
    b = tmp_path / "b"
    run_hwtrace("record", "--mode", "thread", "-o", b, "--", "/bin/true", check=True)
    import json
    name = json.loads((b / "manifest.json").read_text())["streams"][0]["file"]
    _one_line(run_hwtrace("dump", b), f"{b} is a trace bundle",
              f"e.g. {b / name} (its streams: {name})")


@pytest.mark.parametrize("kind,words", [
    ("junk", ["--pt", "junk.bin", "no PSB"]),
    ("empty", ["--pt", "empty.pt", "empty file"]),
])
@pytest.mark.parametrize("extra", [[], ["--format", "jsonl"],
                                   ["--quiet", "--stat"], ["--jobs", "2"]])
def test_decode_names_a_trace_with_nothing_to_decode(files, kind, words, extra):
    r = run_hwtrace("decode", "--pt", files[kind], "--raw",
                    f"{files['code']}:0x1000", *extra)
    _one_line(r, *words)


def test_decode_range_without_a_psb_is_named(files):
    both = files["dir"].parent / "both.pt"
    both.write_bytes(JUNK[:64] + GOOD)
    r = run_hwtrace("decode", "--pt", f"{both}:0x0-0x40", "--raw",
                    f"{files['code']}:0x1000")
    _one_line(r, "both.pt:0x0-0x40", "no PSB", "64 bytes")


def test_decode_directory_as_trace_or_image(files):
    raw = f"{files['code']}:0x1000"
    _one_line(run_hwtrace("decode", "--pt", files["dir"], "--raw", raw),
              "--pt", "adir", "directory")
    _one_line(run_hwtrace("decode", "--pt", files["good"], "--raw",
                          f"{files['dir']}:0x1000"),
              "--raw", "adir", "is a directory, not a file")
    _one_line(run_hwtrace("decode", "--pt", files["good"], "--elf",
                          files["dir"]),
              "--elf", "adir", "is a directory, not a file")
    _one_line(run_hwtrace("decode", "--pt", files["good"], "--pagedump",
                          f"{files['code']}:{files['dir']}"),
              "--pagedump", "adir", "is a directory, not a file")


@pytest.fixture(scope="module")
def elves(tmp_path_factory):
    """An x86-64 ELF program and the same file marked as AArch64."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc missing")
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-O1", "-o", d / "prog", d / "p.c"], check=True)
    data = bytearray((d / "prog").read_bytes())
    data[18:20] = (183).to_bytes(2, "little")        # e_machine: EM_AARCH64
    (d / "prog-arm").write_bytes(bytes(data))
    return d / "prog", d / "prog-arm"


def test_non_x86_elf_is_named_wherever_code_is_loaded(files, elves):
    prog, arm = elves
    words = ("prog-arm", "AArch64", "not x86")
    _one_line(run_hwtrace("decode", "--pt", files["good"], "--elf", arm),
              "--elf", *words)
    _one_line(run_hwtrace("coverage", "--edges", "--pt", files["good"],
                          "--elf", arm), "--elf", *words)
    jsonl = files["dir"].parent / "items.jsonl"
    jsonl.write_text('{"ip":4096,"size":1,"iclass":"other"}\n')
    for cmd in ("summary", "calls"):
        _one_line(run_hwtrace(cmd, jsonl, "--elf", arm), "--elf", *words)
    _one_line(run_hwtrace("export", jsonl, "--elf", arm, "--folded",
                          files["dir"].parent / "f.folded"), "--elf", *words)
    _one_line(run_hwtrace("branches", files["good"], "--elf", arm),
              "--elf", *words)
    # the x86-64 original loads
    r = run_hwtrace("decode", "--pt", files["good"], "--elf", prog)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("cmd", ["summary", "calls", "export"])
def test_views_name_what_their_input_is_not(files, cmd):
    extra = ["--folded", files["dir"].parent / "f.folded"] if cmd == "export" else []
    # (a file that is neither a bundle nor .jsonl is read as a raw trace)
    _one_line(run_hwtrace(cmd, files["junk"], *extra), "junk.bin",
              "no PSB packet", "not an Intel PT trace")
    _one_line(run_hwtrace(cmd, files["empty"], *extra), "empty.pt",
              "empty file")
    # a raw trace is read, with its code
    _one_line(run_hwtrace(cmd, files["good"], *extra), "good.pt",
              "a raw trace needs its code", "--elf")
    assert not (files["dir"].parent / "f.folded").exists() or cmd == "export"


def test_branches_and_coverage_name_a_trace_with_nothing_to_decode(files):
    for kind, words in (("junk", ["junk.bin", "no PSB"]),
                        ("empty", ["empty.pt", "empty file"])):
        _one_line(run_hwtrace("branches", files[kind]), *words)
        _one_line(run_hwtrace("coverage", "--edges", "--pt", files[kind],
                              "--raw", f"{files['code']}:0x1000"),
                  "--pt", *words)


def _decode(path, code, *extra):
    return run_hwtrace("decode", "--pt", path, "--raw", f"{code}:0x1000",
                       "--no-inst", *extra)


def test_damaged_trace_decodes_its_good_parts(files):
    """Good part, garbage, good part: both good parts are decoded, the
    garbage is one error at its offset, exit status 0."""
    ok = _decode(files["good"], files["code"])
    assert ok.returncode == 0 and ok.stderr == ""
    assert ok.stdout.splitlines() == ["[enabled]", "0000000000001000",
                                      "0000000000001001", "0000000000001002",
                                      "0000000000001003", "[disabled]"]
    bad = files["dir"].parent / "damaged.pt"
    bad.write_bytes(GOOD + JUNK[:4096] + GOOD)
    r = _decode(bad, files["code"])
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    errors = [ln for ln in lines if "error" in ln]
    assert lines[:6] == ok.stdout.splitlines()
    assert lines[-6:] == ok.stdout.splitlines()
    assert len(errors) == 1 and int(errors[0][1:].split(",")[0], 16) >= len(GOOD)
    # the same in the packet dump: the garbage is an error at its offset
    d = run_hwtrace("dump", bad)
    assert d.returncode == 0 and d.stderr == ""
    derr = [ln for ln in d.stdout.splitlines() if "error" in ln]
    assert derr and int(derr[0][1:].split(":")[0], 16) >= len(GOOD)


def test_garbage_before_the_first_psb_is_skipped(files):
    bad = files["dir"].parent / "late.pt"
    bad.write_bytes(JUNK[:4096] + GOOD)
    r = _decode(bad, files["code"])
    ok = _decode(files["good"], files["code"])
    assert r.returncode == 0 and r.stdout == ok.stdout and r.stderr == ""


def test_a_bundle_stream_without_data_is_not_refused(tmp_path):
    """An idle CPU's stream may be empty: a bundle decodes its other
    streams (the checks are for the traces a user names)."""
    import json
    out = tmp_path / "b"
    r = run_hwtrace("record", "--mode", "thread", "-o", out, "--", "/bin/true")
    if r.returncode != 0:
        pytest.skip(f"recording failed here: {r.stderr.strip()[-200:]}")
    m = json.loads((out / "manifest.json").read_text())
    m["streams"].append(dict(m["streams"][0], file="idle.pt", size=0,
                             capture_end=0, instructions_observed=0))
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "idle.pt").write_bytes(b"")
    want = m["streams"][0]["instructions_observed"]
    r = run_hwtrace("decode", out, "--quiet", "--stat:insn")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.count(f"insn: {want}.") == 1, r.stdout
    assert "[stream idle.pt]" in r.stdout
    r = run_hwtrace("summary", out)
    assert r.returncode == 0, r.stderr


def test_streams_open_trace_names_what_it_cannot_decode(files):
    """hwtrace.streams, where the views open a raw trace, makes the same
    checks (one StreamsError line naming the file)."""
    from hwtrace.flow.image import Image
    from hwtrace.streams import StreamsError, open_trace
    for kind, why in (("junk", "no PSB"), ("empty", "empty file"),
                      ("dir", "is a directory")):
        with pytest.raises(StreamsError, match=why) as e:
            open_trace(str(files[kind]), Image())
        assert str(files[kind]) in str(e.value) and "\n" not in str(e.value)
    assert len(open_trace(str(files["good"]), Image()).streams) == 1


@pytest.mark.parametrize("cmd", ["summary", "calls", "export"])
@pytest.mark.parametrize("opt,value", [("--insns", "50..10"), ("--time", "5ms..2ms"),
                                       ("--time", "2000..1000")])
def test_views_refuse_a_window_that_ends_before_it_begins(files, cmd, opt, value):
    """``--insns 50..10`` was taken as given: a view of some 1,000
    instructions nobody asked for (the window's edges cut activations
    oddly), exit status 0.  A window whose end comes before its start is
    a slip, said in one line."""
    extra = ["--folded", files["dir"].parent / "f.folded"] if cmd == "export" else []
    _one_line(run_hwtrace(cmd, opt, value, files["good"], *extra), opt, value,
              "A is after B")
    for ok in ("10..50", "10..10", "..10", "10.."):
        r = run_hwtrace(cmd, "--insns", ok, files["good"], *extra)
        assert "A is after B" not in r.stderr


def test_negative_jobs_on_a_bundle_is_refused_too(tmp_path):
    """``decode DIR --jobs -3`` was taken silently (only a raw --pt trace
    checked it)."""
    b = tmp_path / "b"
    run_hwtrace("record", "--mode", "thread", "-o", b, "--", "/bin/true", check=True)
    _one_line(run_hwtrace("decode", b, "--jobs", "-3"), "--jobs: bad argument: -3")
    assert run_hwtrace("decode", b, "--jobs", "0", "--quiet", "--stat").returncode == 0
