"""hwtrace decode: the command line contract, the hardware fixture, bad input."""

import json
import os
import random

import pytest

from conftest import CORPUS, FIXTURES, run_hwtrace

SIMPLE = FIXTURES / "drpt2trace_simple"
SIMPLE_OPTS = ["--cpu", "6/85/4", "--mtc-freq", "3", "--nom-freq", "37",
               "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "308"]
HELLO_INSNS = [0x401000, 0x401005, 0x40100a, 0x401014, 0x401019,
               0x40101b, 0x401020, 0x401025]


@pytest.mark.parametrize("decoder", ["--insn-decoder", "--block-decoder"])
def test_drpt2trace_simple_is_exactly_the_8_instructions(decoder, hardware):
    r = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                    SIMPLE / "hello", *SIMPLE_OPTS, decoder, "--no-inst")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    insns = [int(x, 16) for x in lines if not x.startswith("[")]
    assert insns == HELLO_INSNS
    # tracing is enabled at _start, disabled at each syscall, and resumes
    # after it
    assert lines == ["[enabled]", "[exec mode: 64-bit]", "[disabled]",
                     "[resumed]"] + [f"{i:016x}" for i in HELLO_INSNS[:5]] + \
        ["[disabled]", "[resumed]"] + \
        [f"{i:016x}" for i in HELLO_INSNS[5:]] + ["[disabled]"]


HELLO_LISTING = [
    "0000000000401000  _start                        mov eax, 1",
    "0000000000401005  _start+0x5                    mov edi, 1",
    "000000000040100a  _start+0xa                    movabs rsi, 0x402000",
    "0000000000401014  _start+0x14                   mov edx, 0xe",
    "0000000000401019  _start+0x19                   syscall",
    "000000000040101b  _start+0x1b                   mov eax, 0x3c",
    "0000000000401020  _start+0x20                   mov edi, 0",
    "0000000000401025  _start+0x25                   syscall"]


@pytest.mark.parametrize("decoder", ["--insn-decoder", "--block-decoder"])
def test_drpt2trace_simple_listing(decoder, hardware):
    """Without --no-inst: each instruction with its function and
    disassembly (drpt2trace's expected.templatex: mov, mov, mov of
    0x402000 to rsi, mov, syscall, mov, mov, syscall), the events as in
    ptxed."""
    r = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                    SIMPLE / "hello", *SIMPLE_OPTS, decoder)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["[enabled]", "[exec mode: 64-bit]", "[disabled]",
                     "[resumed]"] + HELLO_LISTING[:5] + \
        ["[disabled]", "[resumed]"] + HELLO_LISTING[5:] + ["[disabled]"]
    att = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                      SIMPLE / "hello", *SIMPLE_OPTS, decoder, "--att")
    assert [x.split(None, 2)[2] for x in att.stdout.splitlines()
            if x[0] != "["] == ["movl $1, %eax", "movl $1, %edi",
                                "movabsq $0x402000, %rsi", "movl $0xe, %edx",
                                "syscall", "movl $0x3c, %eax", "movl $0, %edi",
                                "syscall"]


def test_drpt2trace_simple_jsonl_annotate(hardware):
    r = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                    SIMPLE / "hello", *SIMPLE_OPTS, "--format", "jsonl",
                    "--annotate")
    assert r.returncode == 0, r.stderr
    insns = [json.loads(x) for x in r.stdout.splitlines() if '"iclass"' in x]
    assert [(o["ip"], o["function"], o["function_offset"], o["disasm"])
            for o in insns] == [
        (int(x[:16], 16), "_start", int(x[16:].split()[0][7:] or "0", 16),
         x.split(None, 2)[2]) for x in HELLO_LISTING]


def test_drpt2trace_simple_jsonl_and_stat(hardware):
    r = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                    SIMPLE / "hello", *SIMPLE_OPTS, "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(x) for x in r.stdout.splitlines()]
    insns = [o for o in objs if "iclass" in o]
    assert [o["ip"] for o in insns] == HELLO_INSNS
    assert [o["iclass"] for o in insns] == ["other"] * 4 + ["far_call"] + \
        ["other"] * 2 + ["far_call"]
    assert all(o["mode"] == "64bit" and not o["speculative"] for o in insns)
    r = run_hwtrace("decode", "--pt", SIMPLE / "pt.bin", "--elf",
                    SIMPLE / "hello", *SIMPLE_OPTS, "--quiet", "--stat")
    words = r.stdout.split()
    assert words[:3] == ["insn:", "8.", "blocks:"]
    # two straight-line runs, each ended by a syscall
    assert words[3] == "2."


def test_unreadable_trace_is_one_line_exit_2(tmp_path):
    r = run_hwtrace("decode", "--pt", tmp_path / "nope.pt", "--raw",
                    f"{tmp_path / 'nope.bin'}:0x1000")
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_missing_image_is_one_line_exit_2(tmp_path):
    pt = tmp_path / "t.pt"
    pt.write_bytes(b"\x02\x82" * 8)
    r = run_hwtrace("decode", "--pt", pt, "--raw", f"{tmp_path / 'x'}:0x10")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_hwtrace("decode", "--pt", pt, "--elf", pt)   # not an ELF
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


def test_no_trace_given_is_exit_2():
    r = run_hwtrace("decode")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_garbage_and_truncation_become_errors_not_crashes(tmp_path, corpus):
    """Corrupt streams: errors are reported with offsets, decoding goes on,
    nothing escapes."""
    src = CORPUS / "call_direct-ret_compressed"
    data = (src / "call_direct-ret_compressed.pt").read_bytes()
    rnd = random.Random(1234)
    for seed in range(12):
        buf = bytearray(data * 3)
        for _ in range(1 + seed % 5):
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        if seed % 3 == 0:
            buf = buf[:rnd.randrange(1, len(buf))]
        pt = tmp_path / f"m{seed}.pt"
        pt.write_bytes(bytes(buf))
        for fmt in ("text", "jsonl"):
            r = run_hwtrace("decode", "--pt", pt, "--raw",
                            f"{src / 'call_direct-ret_compressed.bin'}:0x1000",
                            "--format", fmt)
            if b"\x02\x82" * 8 not in buf:     # cut before the first PSB
                assert r.returncode == 2 and "no PSB" in r.stderr
                assert r.stderr.count("\n") == 1 and r.stdout == ""
                continue
            assert r.returncode == 0, r.stderr
            assert r.stderr == ""
            if fmt == "jsonl":
                for line in r.stdout.splitlines():
                    json.loads(line)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    r = run_hwtrace("decode", "--pt", junk, "--raw", f"{junk}:0x1000")
    # no PSB in it: nothing to decode, said in one line (test_bad_input.py)
    assert r.returncode == 2 and "no PSB" in r.stderr and r.stdout == ""


def test_not_a_bundle_is_one_line_exit_2(tmp_path):
    r = run_hwtrace("decode", tmp_path)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    r = run_hwtrace("decode", tmp_path, "--pt", tmp_path / "x.pt")
    assert r.returncode == 2


@pytest.mark.parametrize("opt,value", [("--mtc-freq", "99999999999"), ("--nom-freq", "256"),
                                       ("--cpuid-0x15.eax", "0x100000000"),
                                       ("--cpuid-0x15.ebx", "4294967296")])
@pytest.mark.parametrize("cmd", [["decode"], ["decode", "--quiet", "--stat"],
                                 ["coverage", "--edges"]])
def test_timing_option_too_big_is_one_line(opt, value, cmd, hardware):
    """A timing parameter wider than the register or field it stands for
    (MTCFreq and the bus ratio are read as 8 bits, CPUID 0x15 as 32, as
    ptxed and ``dump`` read them): one line, status 2, for the compiled and
    the listing paths alike (the compiled core used to raise out of its
    range check with a traceback)."""
    r = run_hwtrace(*cmd, "--pt", SIMPLE / "pt.bin", "--elf", SIMPLE / "hello",
                    opt, value)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"hwtrace: {opt}: value too big: {value}\n"
