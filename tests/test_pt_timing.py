"""Timing (SDM rules, libipt pt_time/pt_time_cal semantics), last-IP, CPU
parsing and errata, hand-computed expectations."""

from __future__ import annotations

import pytest

from hwtrace.pt.cpu import Cpu, errata
from hwtrace.pt.errors import PtError
from hwtrace.pt.lastip import LastIp, compress, sext48
from hwtrace.pt.timing import FCR_SHIFT, Time, TimeCal, TimingConfig

CFG = TimingConfig(mtc_freq=4, nom_freq=4, cpuid_0x15_eax=1,
                   cpuid_0x15_ebx=4)


def test_tsc_tma_mtc():
    t = Time()
    assert t.query_tsc() == PtError("no timing information", 0)
    t.update_tsc(0xa0000, CFG)
    assert t.query_tsc() == 0xa0000
    t.update_tma(0x18, 8, CFG)          # FC=8 ticks since the MTC edge
    assert t.query_tsc() == 0xa0000 and t.base == 0xa0000 - 8
    t.update_mtc(2, CFG)                # CTC 0x20: 8 CTC ticks * 4 = 0x20
    assert t.query_tsc() == 0xa0000 - 8 + 0x20
    t.update_mtc(3, CFG)                # one MTC period: 16 ticks * 4
    assert t.query_tsc() == 0xa0000 - 8 + 0x20 + 0x40


def test_mtc_wraps_once():
    t = Time()
    t.update_tsc(1000, CFG)
    t.update_tma(0xff0, 0, CFG)         # ctc bits [11:0] with mtc_freq 4
    t.update_mtc(0x00, CFG)             # 0x000 after 0xff0: wrapped
    assert t.query_tsc() == 1000 + 0x10 * 4


def test_cyc_needs_calibration_and_uses_fcr():
    t, cal = Time(), TimeCal()
    t.update_tsc(5000, CFG)
    assert cal.query_fcr().code == "no timing information"
    t.update_cyc(10, CFG, 0)
    assert t.lost_cyc == 1 and t.query_tsc() == 5000
    cal.header_cbr(2, CFG)              # nominal ratio 4 / current 2
    fcr = cal.query_fcr()
    assert fcr == (4 << FCR_SHIFT) // 2
    t.update_cyc(10, CFG, fcr)
    assert t.query_tsc() == 5000 + 20


def test_calibration_from_mtc():
    cal = TimeCal()
    cal.update_mtc(1, CFG)
    cal.update_cyc(32, CFG)
    cal.update_mtc(2, CFG)              # 16 CTC ticks * 4 = 64 FC in 32 cyc
    assert cal.query_fcr() == 2 << FCR_SHIFT


def test_cbr_zero_is_a_bad_packet():
    assert Time().update_cbr(0).code == "unknown packet"


def test_lastip():
    li = LastIp()
    assert li.query().code == "no ip"
    li.update(6, 0xffff800000001000)
    li.update(1, 0x2345)
    assert li.query() == 0xffff800000002345
    li.update(2, 0xdeadbeef)
    assert li.query() == 0xffff8000deadbeef
    li.update(0, 0)
    assert li.query().code == "ip has been suppressed"
    li.update(3, 0x800000000000)
    assert li.query() == 0xffff800000000000 == sext48(0x800000000000)
    assert li.update(5, 0).code == "unknown packet"
    assert compress(0x401234, 0x401000) == (1, 0x1234)
    assert compress(0x401234, None) == (3, 0x401234)


def test_cpu_parse_and_errata():
    assert Cpu.parse("6/78") == Cpu(6, 78)
    assert Cpu.parse("0x6/0x4e/3") == Cpu(6, 0x4e, 3)
    assert Cpu.parse("none") is None
    for bad in ("6", "6/x", "6/78/1/2", "6/300"):
        with pytest.raises(ValueError):
            Cpu.parse(bad)
    assert errata(Cpu(6, 78)).names() == [
        "bdm70", "skd007", "skd022", "skd010", "skl014", "skl168"]
    assert errata(Cpu(6, 85)).skz84
    assert errata(Cpu(0, 0)) == PtError("unknown cpu", 0)
    assert errata(None).names() == []
