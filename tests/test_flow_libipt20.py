"""Regression tests for what the ``libiptdiff`` fuzz target (hwtrace's
instruction decoder against libipt 2.0.5, fuzz/libiptdiff.py) found: each
trace is built by hand from packets, each expectation is libipt 2.0.5's
(``ptoracle insn``: instruction IPs and error offsets in order, with
``--error-offsets 2.0``), and both twins must give it.  Where the oracle
is built, it is asked too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import compiled_flow_core

from hwtrace.flow import batches as B
from hwtrace.flow.config import FlowConfig
from hwtrace.flow.image import Image
from hwtrace.pt.cpu import Cpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import libiptdiff  # noqa: E402

PSB = bytes([2, 0x82] * 8)
PSBEND = bytes.fromhex("0223")
MODE64 = bytes.fromhex("9901")                  # MODE.EXEC 64-bit


def fup(ip: int) -> bytes:
    return bytes([0x7d]) + ip.to_bytes(6, "little")      # FUP, IPC 3


def essentials(trace: bytes, image: Image, cfg: FlowConfig, impl: str):
    """(("insn", ip) | ("error", kind, message, offset)) in order."""
    cfg = cfg.replace(error_offsets="2.0")
    out = []
    for b in B.batches(trace, image, cfg, decoder="insn", want_insns=True,
                       impl=impl):
        ips = b.insns["ip"].tolist()
        done = 0
        for index, _off, item in b.items:
            out += [("insn", ip) for ip in ips[done:index]]
            done = max(done, index)
            if isinstance(item, B.ErrorItem):
                out.append(("error", item.kind, item.code, item.offset))
        out += [("insn", ip) for ip in ips[done:]]
    return out


def check(trace: bytes, sections, cpu: str | None, want: list,
          ptoracle_path: Path | None = None) -> None:
    compiled_flow_core()
    image = Image()
    for vaddr, data in sections:
        image.add_bytes(data, vaddr)
    cfg = FlowConfig()
    if cpu:
        cfg.set_cpu(Cpu.parse(cpu))
    for impl in ("python", "compiled"):
        assert essentials(trace, image, cfg, impl) == want, impl
    if ptoracle_path is not None:
        t = libiptdiff.Target()
        t.check(libiptdiff.make_input(trace, sections, cpu, cfg))


@pytest.fixture
def oracle():
    exe = libiptdiff.ORACLE
    return exe if exe.exists() else None


NOPS = [(0x100000, bytes.fromhex("909090909090f4"))]


def test_regression_a_packet_a_psb_plus_cannot_hold_is_out_of_context_even_cut(oracle):
    """libipt picks a PSB+ packet's decoder by its opcode alone: a PSB cut
    by the end of the trace inside a PSB+ is "unexpected packet context"
    (no PSB+ decoder for a PSB), not the end of the trace (both twins
    said nothing at all).  The sync fails at the PSB, where the decoder
    stays, and ptxed gives up."""
    trace = PSB + MODE64 + fup(0x100000) + PSB[:14]
    want = [("error", "sync error", "unexpected packet context", 0)]
    check(trace, NOPS, None, want, oracle)
    check(trace, NOPS, "6/142", want, oracle)


def test_regression_bdm70s_scan_fails_the_psb_plus_on_a_bad_packet(oracle):
    """With erratum BDM70, libipt scans the packets after a PSB+ FUP for a
    TIP.PGE with a packet decoder of its own and fails the PSB+ on a
    packet that does not decode before it decides ("unknown packet": a
    PSB with a bad payload).  The twins only failed later, reading ahead
    after the PSB+ (an "error" where libipt has a "sync error")."""
    trace = PSB + MODE64 + fup(0x100000) + PSBEND + \
        bytes.fromhex("0282 7d0000100000 0000 9901 0223") + bytes(8)
    check(trace, NOPS, "6/167",
          [("error", "sync error", "unknown packet", 0)], oracle)


def test_regression_a_tip_cut_by_the_end_does_not_answer_a_tnt_query(oracle):
    """A conditional branch asks for a TNT bit; a TIP cut by the end of
    the trace is next.  libipt looks at the opcode (a TIP that is no part
    of an event: "trace stream does not match query"); the twins took the
    cut packet for the end of the trace."""
    trace = PSB + fup(0x100000) + MODE64 + PSBEND + bytes.fromhex("2d05")
    check(trace, [(0x100000, bytes.fromhex("7500f4"))], None,
          [("insn", 0x100000),
           ("error", "error", "trace stream does not match query", 27)],
          oracle)


def test_regression_a_tsx_abort_whose_async_branch_tip_is_cut(oracle):
    """A TSX abort's FUP also starts an async branch; its TIP is cut by
    the end of the trace.  libipt fetches the async branch's event right
    after the abort (the TIP is by its opcode the next event), runs out of
    trace, and ends without an instruction; the twins took the cut TIP
    for no event and decoded on."""
    trace = PSB + fup(0x100000) + MODE64 + bytes.fromhex("9921") + PSBEND + \
        bytes.fromhex("9922 3d0000 2d")
    check(trace, NOPS, None, [], oracle)


def test_regression_apl12s_scan_fails_the_ovf_on_a_bad_packet(oracle):
    """With erratum APL12, libipt scans ahead after an OVF's FUP for
    evidence that tracing was off, and fails the OVF on a packet that does
    not decode ("unknown packet", at the FUP: 2.0 and later releases
    alike); the twins stopped the scan there and went on."""
    trace = PSB + MODE64 + fup(0x1000) + PSBEND + bytes.fromhex("02f3") + \
        fup(0x1001) + bytes.fromhex("0282 02de 02b2") + PSB
    sections = [(0x1000, bytes.fromhex("90909090f4"))]
    check(trace, sections, "6/95",
          [("error", "error", "unknown packet", 29)], oracle)


def test_regression_a_status_packet_cut_by_the_end_moves_to_the_end(oracle):
    """Reading ahead, libipt decodes a status packet (here a PSB) the end
    of the trace cuts, gives up and moves to the end: the next error is
    reported at the trace's end, where the twins stayed at the cut
    packet."""
    trace = PSB + MODE64 + bytes.fromhex("9921") + fup(0x100000) + PSBEND + \
        bytes.fromhex("210200") + PSB[:13]
    check(trace, [(0x200000, b"\x90")], None,
          [("error", "error", "no memory mapped at this address",
            len(trace))], oracle)


def test_regression_the_packet_after_skd007s_ovf(oracle):
    """SKD007: a 2-byte CYC whose second byte is the OVF's first (the CYC
    cut short by the overflow).  The OVF ends a byte later than its size
    says (it is reported at the CYC); the twins went on a byte early and
    read the OVF's second byte as a CYC of its own, so the search for
    the OVF's FUP started, and failed, there (libipt: after the OVF)."""
    trace = PSB + MODE64 + fup(0x1000) + bytes.fromhex("f702f3 00 62") + \
        bytes(12)
    sections = [(0x1000, bytes.fromhex("90909090f4"))]
    check(trace, sections, "6/166",
          [("error", "error", "unexpected packet context", 28)], oracle)


def test_regression_skz84s_invalid_tma_in_a_psb_plus_is_skipped(oracle):
    """SKZ84: a TMA with reserved bits set is corrupt; libipt skips it (a
    byte longer: 8 bytes) wherever its query decoder meets it, a PSB+ too.
    Both twins took the skipped packet for one a PSB+ may not hold and
    failed the sync ("unexpected packet context")."""
    trace = PSB + MODE64 + fup(0x100000) + \
        bytes.fromhex("0273010101010000") + PSBEND
    check(trace, NOPS, "6/143", [], oracle)
