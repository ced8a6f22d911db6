"""Event trace (CFE/EVD) binding, libipt 2.3's error offsets and its
resynchronization, on small hand-made traces (flow.evtrace,
flow.evtrace_insn, flow.evtpos).  The corpus covers the same ground in
tests/test_corpus_ptxed.py; these pin each rule down on its own."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from hwtrace.cli import main
from hwtrace.pt import encoder as P

HEAD = P.psb() + P.fup(0x1000, ipc=3) + P.mode_exec(csl=1) + P.psbend()
NOPS = b"\x90" * 16


@pytest.fixture(params=["insn", "block"])
def decoder(request):
    return request.param


def decode(tmp_path, trace: bytes, code: bytes = NOPS, *opts,
           decoder: str = "insn") -> list[dict]:
    pt = tmp_path / "t.pt"
    pt.write_bytes(trace)
    raw = tmp_path / "c.bin"
    raw.write_bytes(code)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["decode", f"--{decoder}-decoder", "--raw",
                   f"{raw}:0x1000", "--pt", str(pt), "--format", "jsonl",
                   *opts])
    assert rc == 0
    return [json.loads(x) for x in out.getvalue().splitlines()]


def summary(items) -> list:
    out = []
    for it in items:
        if "error" in it:
            out.append(("error", it["error"], it["offset"], it["ip"]))
        elif "iclass" in it:
            out.append(("insn", it["ip"]))
        elif "event" in it and not it.get("status_update"):
            out.append(("event", it["event"]))
    return out


def test_error_offset_is_after_the_tnt_fetched_ahead(tmp_path, decoder):
    # call rax -> TIP 0x2000 (unmapped); the TNT after it is what libipt
    # 2.3 holds when the error strikes: the offset is after it (and after
    # the PAD that follows).
    trace = HEAD + P.tip(0x2000, ipc=3) + P.tnt8([1, 0]) + P.pad() + P.stop()
    got = summary(decode(tmp_path, trace, b"\xff\xd0" + NOPS,
                         decoder=decoder))
    assert got == [("insn", 0x1000),
                   ("error", "no memory mapped at this address",
                    len(HEAD) + 7 + 1 + 1, 0x2000)]


def test_error_offset_stays_at_the_psbend_of_a_held_status(tmp_path, decoder):
    # A direct jump out of the image; the next PSB+ (FUP elsewhere) is
    # already fetched: the offset is its PSBEND.
    psb2 = P.psb() + P.fup(0x3000, ipc=3) + P.mode_exec(csl=1)
    trace = HEAD + psb2 + P.psbend() + P.tnt8([1]) + P.stop()
    jmp = b"\xe9" + (0x1000).to_bytes(4, "little")    # jmp 0x2005
    got = summary(decode(tmp_path, trace, jmp, decoder=decoder))
    assert got == [("insn", 0x1000),
                   ("error", "no memory mapped at this address",
                    len(HEAD) + len(psb2), 0x2005)]


def test_resync_restarts_at_the_psb_of_a_held_status(tmp_path, decoder):
    psb2 = P.psb() + P.fup(0x1005, ipc=3) + P.mode_exec(csl=1) + P.psbend()
    trace = HEAD + psb2 + P.fup(0x1006, ipc=3) + P.tip_pgd()
    jmp = b"\xe9" + (0x1000).to_bytes(4, "little")
    got = summary(decode(tmp_path, trace, jmp + NOPS, "--resync-on-error",
                         decoder=decoder))
    assert got == [("insn", 0x1000),
                   ("error", "no memory mapped at this address",
                    len(HEAD) + len(psb2) - 2, 0x2005),
                   ("insn", 0x1005), ("event", "async_disabled")]


def test_psb_contradicting_the_mode_is_a_deferred_bad_status(tmp_path,
                                                             decoder):
    # 64-bit, then a PSB+ claiming 32-bit: reported after the branch, at
    # the MODE.EXEC packet; resync fails the same way.
    psb2 = P.psb() + P.fup(0x1003, ipc=3)
    trace = HEAD + P.tnt8([1]) + psb2 + P.mode_exec(csd=1) + P.psbend()
    jz = b"\x74\x01"                                  # jz 0x1003
    got = summary(decode(tmp_path, trace, jz + NOPS, "--resync-on-error",
                         decoder=decoder))
    at = len(HEAD) + 1 + len(psb2)
    assert got == [("insn", 0x1000),
                   ("error", "bad status update", at, 0x1003),
                   ("error", "bad status update", at, 0x1003)]


def test_ip_less_interrupt_happens_at_the_fup_of_its_branch(tmp_path, decoder):
    trace = HEAD + P.evd(0, 0xf00) + P.cfe(1, 14) + P.fup(0x1002, ipc=3) \
        + P.tip(0x1008, ipc=3) + P.fup(0x1009, ipc=3) + P.tip_pgd()
    items = decode(tmp_path, trace, decoder=decoder)
    assert summary(items) == [
        ("insn", 0x1000), ("insn", 0x1001), ("event", "interrupt"),
        ("event", "async_branch"), ("insn", 0x1008),
        ("event", "async_disabled")]
    intr = next(x for x in items if x.get("event") == "interrupt")
    assert intr["vector"] == 14 and intr["cr2"] == 0xf00
    assert intr["ip_suppressed"] is False and intr["ip"] == 0x1002


def test_ip_less_iret_binds_to_the_branch_that_needs_the_tip(tmp_path,
                                                             decoder):
    code = b"\x90\x48\xcf" + NOPS                     # nop; iretq
    trace = HEAD + P.cfe(2) + P.tip(0x1005, ipc=3) + P.fup(0x1006, ipc=3) \
        + P.tip_pgd()
    assert summary(decode(tmp_path, trace, code, decoder=decoder)) == [
        ("insn", 0x1000), ("insn", 0x1001), ("event", "iret"),
        ("insn", 0x1005), ("event", "async_disabled")]


def test_cfe_with_ip_uses_up_its_fup(tmp_path, decoder):
    # SMI at 0x1001 (before the instruction there), then a plain FUP+TIP.
    trace = HEAD + P.cfe(3, ip=1) + P.fup(0x1001, ipc=3) \
        + P.fup(0x1002, ipc=3) + P.tip_pgd()
    items = decode(tmp_path, trace, decoder=decoder)
    assert summary(items) == [("insn", 0x1000), ("event", "smi"),
                              ("insn", 0x1001), ("event", "async_disabled")]
    smi = next(x for x in items if x.get("event") == "smi")
    assert smi["ip"] == 0x1001


def test_evd_not_taken_by_its_cfe_is_bad_context(tmp_path, decoder):
    # CR2 then VMX qualification: the second EVD is the bad one.
    trace = HEAD + P.evd(0, 1) + P.evd(1, 2) + P.cfe(8) + P.stop()
    assert summary(decode(tmp_path, trace, decoder=decoder)) == [
        ("error", "unexpected packet context", len(HEAD) + 11, 0)]
    # CR2 before an IRET: the CFE is.
    trace = HEAD + P.evd(0, 1) + P.cfe(2) + P.stop()
    assert summary(decode(tmp_path, trace, decoder=decoder)) == [
        ("error", "unexpected packet context", len(HEAD) + 11, 0)]
