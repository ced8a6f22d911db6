"""``hwtrace dump`` as a user runs it: bad input never gives a traceback;
decode errors are reported at their offsets and decoding resumes at the
next PSB; a missing file or an unknown option is one line on stderr and
exit status 2."""

from __future__ import annotations

import json
import random

import pytest

from conftest import run_hwtrace
from hwtrace.pt import encoder as enc

PSB = enc.psb()


def _one_line_error(r):
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_missing_file(tmp_path):
    r = run_hwtrace("dump", tmp_path / "nope.pt")
    _one_line_error(r)
    assert "nope.pt" in r.stderr


@pytest.mark.parametrize("args", [
    ["--bogus"], ["--cpu", "haswell"], ["--mtc-freq", "x"],
    ["--mtc-freq", "300"], ["--time", "--tcal"], ["--format", "xml"],
    ["--cpu"], [],
])
def test_bad_options(args, tmp_path):
    f = tmp_path / "t.pt"
    f.write_bytes(PSB)
    r = run_hwtrace("dump", *args, *([f] if args else []))
    _one_line_error(r)


def test_errors_reported_at_offset_and_resync(tmp_path):
    data = (PSB + enc.psbend() + b"\xc9" + enc.tnt8("tt") + PSB
            + enc.fup(0x1000, 6) + enc.psbend() + b"\x02\x73\x00\x00\x05"
            + b"\x00\x00" + PSB + enc.psbend())
    f = tmp_path / "bad.pt"
    f.write_bytes(data)
    r = run_hwtrace("dump", f)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines() == [
        "0000000000000000  psb",
        "0000000000000010  psbend",
        "[12: error decoding packet: unknown opcode]",
        "0000000000000014  psb",
        "0000000000000024  fup        6: 0000000000001000",
        "000000000000002d  psbend",
        "[2f: error decoding packet: unknown packet]",
        "0000000000000036  psb",
        "0000000000000046  psbend",
    ]
    r = run_hwtrace("dump", "--format", "jsonl", f)
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o.get("error") for o in objs if "error" in o] == [
        "unknown opcode", "unknown packet"]
    assert [o["offset"] for o in objs if "error" in o] == [0x12, 0x2f]
    r = run_hwtrace("dump", "--stat", f)
    assert r.stdout.splitlines() == ["packets: 7", "bytes: 72", "errors: 2"]


def _all_packets() -> bytes:
    """One of every packet the encoder makes (a PSB+ first, STOP last)."""
    E = enc
    return (E.psb() + E.mode_exec(csl=1) + E.tsc(0x1234567) + E.cbr(22)
            + E.tma(0x12, 0x34) + E.psbend() + E.pad() + E.tip_pge(0x401000)
            + E.tnt8("tnt") + E.tnt64("tn" * 20) + E.tip(0x402000, ipc=1)
            + E.fup(0x401005, ipc=3) + E.mode_tsx(intx=1) + E.pip(0x1000)
            + E.mtc(7) + E.cyc(0x1f) + E.vmcs(0x5000) + E.mnt(0x99)
            + E.exstop(1) + E.mwait(1, 2) + E.pwre(1, 2) + E.pwrx(1, 2)
            + E.ptw(0xabcd, ip=1) + E.cfe(1, ip=1) + E.evd(0, 0x10)
            + E.trig(1, 5) + E.ovf() + E.tip_pgd() + E.stop())


def test_truncated_and_empty_and_random(tmp_path):
    src = _all_packets()
    r = run_hwtrace("dump", "--format", "jsonl", _write(tmp_path / "all.pt", src))
    assert r.returncode == 0 and '"error"' not in r.stdout, r.stdout
    assert r.stdout.count("\n") == 29
    rng = random.Random(7)
    inputs = [b"", b"\x02", src[:1], src[:37], src[:-1],
              bytes(rng.randrange(256) for _ in range(4096)),
              PSB * 3 + bytes(rng.randrange(256) for _ in range(500))]
    for i, data in enumerate(inputs):
        f = tmp_path / f"in{i}.pt"
        f.write_bytes(data)
        for args in ([], ["--no-sync"], ["--no-sync", "--format", "jsonl"],
                     ["--no-sync", "--time", "--lastip", "--raw",
                      "--exec-mode", "--cpu", "6/78"],
                     ["--no-sync", "--tcal", "--nom-freq", "4"]):
            r = run_hwtrace("dump", *args, f)
            if not data or (PSB not in data and "--no-sync" not in args):
                # nothing to dump: one line saying why, exit 2
                why = "empty file" if not data else "no PSB"
                assert r.returncode == 2 and r.stdout == "", (i, args)
                assert r.stderr.count("\n") == 1 and why in r.stderr, r.stderr
                continue
            assert r.returncode == 0, (i, args, r.stderr)
            assert r.stderr == "", (i, args, r.stderr)


def test_unknown_cpu_is_reported_and_decoding_goes_on(tmp_path):
    f = tmp_path / "t.pt"
    f.write_bytes(PSB + enc.psbend())
    r = run_hwtrace("dump", "--cpu", "0/0", f)
    assert r.stdout.splitlines() == [
        "[0: failed to determine errata: unknown cpu]",
        "0000000000000000  psb", "0000000000000010  psbend"]


def test_file_range_suffix(tmp_path):
    f = tmp_path / "t.pt"
    f.write_bytes(b"\x00" * 4 + PSB + enc.psbend())
    r = run_hwtrace("dump", "--no-offset", f"{f}:4")
    assert r.stdout.splitlines() == ["psb", "psbend"]
    r = run_hwtrace("dump", "--no-sync", f"{f}:0-2")
    assert r.stdout.splitlines() == ["0000000000000000  pad",
                                     "0000000000000001  pad"]
