"""BufferConfig types and values, validated exactly as the spec says; the
CPUID 0x14 capability record; the Ctl flag names."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from hwtrace import BufferConfig, Ctl, Mode, TraceError
from hwtrace.control.capabilities import FULL, NONE, Capabilities, CpuInfo
from hwtrace.control.config import validate
from hwtrace.control.ctl import DEFINED_BITS, addr_cfg, describe, field, with_field

BASE = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl.BRANCH_EN | Ctl.USER)
BARE = replace(FULL, cr3_filtering=False, psb_cyc=False, ip_filtering=False, mtc=False,
               ptwrite=False, power_event_trace=False, num_address_ranges=0,
               mtc_period_mask=0, cyc_threshold_mask=0, psb_freq_mask=0)


def invalid(cfg, caps=FULL, mode=Mode.CPU, status="INVALID_ARGS"):
    with pytest.raises(TraceError) as e:
        validate(cfg, caps, mode)
    assert e.value.status == status, str(e.value)


# ---------------------------------------------------------------- types

@pytest.mark.parametrize("kw", [
    {"num_chunks": "4"}, {"num_chunks": 4.0}, {"num_chunks": True}, {"num_chunks": None},
    {"chunk_order": "0"}, {"is_circular": 1}, {"is_circular": "yes"},
    {"ctl": "branch"}, {"ctl": 1.5}, {"ctl": -1}, {"ctl": 1 << 64},
    {"cr3_match": "0"}, {"cr3_match": None},
    {"addr_ranges": "ab"}, {"addr_ranges": 5}, {"addr_ranges": [(1,)]},
    {"addr_ranges": [(1, 2, 3)]}, {"addr_ranges": [("a", 2)]}, {"addr_ranges": [1, 2]},
])
def test_wrong_types_raise_invalid_args(kw):
    with pytest.raises(TraceError) as e:
        BufferConfig(**kw)
    assert e.value.status == "INVALID_ARGS"


def test_types_are_normalised():
    c = BufferConfig(ctl=0x2008, addr_ranges=[[1, 2]])
    assert isinstance(c.ctl, Ctl) and c.ctl == Ctl.BRANCH_EN | Ctl.USER
    assert c.addr_ranges == ((1, 2),)
    assert BufferConfig.from_dict(c.to_dict()) == c
    with pytest.raises(TraceError):
        BufferConfig.from_dict([1])
    with pytest.raises(TraceError):
        BufferConfig.from_dict({"addr_ranges": 3})
    assert c.chunk_size == 4096 and replace(c, num_chunks=3, chunk_order=2).total_size == 3 * 16384


# ---------------------------------------------------------------- limits

def test_limits():
    validate(replace(BASE, num_chunks=4096, chunk_order=4), FULL)      # 256 MiB exactly
    validate(replace(BASE, num_chunks=256, chunk_order=8), FULL)
    invalid(replace(BASE, num_chunks=0))
    invalid(replace(BASE, num_chunks=4097))
    invalid(replace(BASE, chunk_order=-1))
    invalid(replace(BASE, chunk_order=9))
    invalid(replace(BASE, num_chunks=257, chunk_order=8))              # 257 MiB
    invalid(replace(BASE, num_chunks=4096, chunk_order=5))
    invalid({"num_chunks": 1})


def test_driver_and_reserved_bits():
    for bit in (Ctl.TRACE_EN, Ctl.FABRIC_EN, Ctl.TOPA):
        invalid(replace(BASE, ctl=BASE.ctl | bit))
    for bit in (18, 23, 28, 31, 48, 63):
        invalid(replace(BASE, ctl=BASE.ctl | 1 << bit))


def test_always_settable_bits():
    validate(replace(BASE, ctl=Ctl.OS | Ctl.USER | Ctl.TSC_EN | Ctl.DIS_RETC | Ctl.BRANCH_EN), BARE)


@pytest.mark.parametrize("bits,cap", [
    (Ctl.PTW_EN, "ptwrite"), (Ctl.FUP_ON_PTW, "ptwrite"),
    (Ctl.CR3_FILTER, "cr3_filtering"),
    (Ctl.MTC_EN, "mtc"), (3 << 14, "mtc"),
    (Ctl.PWR_EVT_EN, "power_event_trace"),
    (Ctl.CYC_EN, "psb_cyc"), (1 << 19, "psb_cyc"), (1 << 24, "psb_cyc"),
])
def test_capability_gated_bits(bits, cap):
    caps = replace(BARE, **{cap: True, "mtc_period_mask": 0xFFFF,
                            "cyc_threshold_mask": 0xFFFF, "psb_freq_mask": 0xFFFF})
    cfg = replace(BASE, ctl=BASE.ctl | bits)
    validate(cfg, caps)
    invalid(cfg, replace(caps, **{cap: False}))


def test_frequency_values_must_be_in_the_masks():
    caps = replace(FULL, mtc_period_mask=0b1001, cyc_threshold_mask=0b110, psb_freq_mask=0b1)
    validate(replace(BASE, ctl=with_field(Ctl.MTC_EN, "mtc_freq", 3)), caps)
    invalid(replace(BASE, ctl=with_field(Ctl.MTC_EN, "mtc_freq", 2)), caps)
    validate(replace(BASE, ctl=with_field(Ctl.CYC_EN, "cyc_thresh", 2)), caps)
    invalid(replace(BASE, ctl=with_field(Ctl.CYC_EN, "cyc_thresh", 3)), caps)
    invalid(replace(BASE, ctl=with_field(0, "psb_freq", 1)), caps)
    validate(replace(BASE, ctl=with_field(Ctl.MTC_EN, "mtc_freq", 0)), caps)   # 0: default


def test_cr3_match():
    validate(replace(BASE, ctl=BASE.ctl | Ctl.CR3_FILTER, cr3_match=0x1234000), FULL)
    invalid(replace(BASE, cr3_match=0x1234001))
    invalid(replace(BASE, cr3_match=0x10))
    invalid(replace(BASE, cr3_match=-32))
    invalid(replace(BASE, cr3_match=1 << 64))


def test_address_ranges():
    caps = replace(FULL, num_address_ranges=2)
    two = ((0x1000, 0x2000), (0x3000, 0x3000))
    validate(replace(BASE, ctl=BASE.ctl | 1 << 32 | 2 << 36, addr_ranges=two), caps)
    invalid(replace(BASE, addr_ranges=two + ((5, 6),)), caps)          # n >= range count
    invalid(replace(BASE, addr_ranges=((5, 4),)), caps)                # a > b
    invalid(replace(BASE, addr_ranges=((-1, 4),)), caps)
    invalid(replace(BASE, addr_ranges=((0, 1 << 64),)), caps)
    invalid(replace(BASE, ctl=BASE.ctl | 1 << 40, addr_ranges=two), caps)   # ADDR2_CFG, 2 ranges
    invalid(replace(BASE, ctl=BASE.ctl | 3 << 32, addr_ranges=two), caps)   # cfg 3 reserved
    invalid(replace(BASE, ctl=BASE.ctl | 1 << 36, addr_ranges=two[:1]), caps)  # no range 1
    invalid(replace(BASE, ctl=BASE.ctl | 1 << 32, addr_ranges=two[:1]),
            replace(caps, ip_filtering=False))
    invalid(replace(BASE, addr_ranges=two[:1]), replace(caps, num_address_ranges=0))
    # more than 4 reported ranges still means at most 4 ADDRn_CFG fields
    validate(replace(BASE, addr_ranges=two * 2), replace(caps, num_address_ranges=7))


def test_multi_entry_topa():
    caps = replace(FULL, topa_multiple_entries=False)
    validate(BASE, caps)
    invalid(replace(BASE, num_chunks=2), caps, status="NOT_SUPPORTED")


def test_thread_mode_has_no_cr3_control():
    invalid(replace(BASE, ctl=BASE.ctl | Ctl.CR3_FILTER), FULL, Mode.THREAD)
    invalid(replace(BASE, cr3_match=0x1000), FULL, Mode.THREAD)
    validate(replace(BASE, ctl=BASE.ctl | 1 << 32, addr_ranges=((1, 2),)), FULL, Mode.THREAD)


@settings(max_examples=300, deadline=None)
@given(ctl=st.integers(0, (1 << 64) - 1), n=st.integers(-2, 5000), order=st.integers(-1, 10),
       cr3=st.integers(0, (1 << 64) - 1),
       ranges=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20)), max_size=5),
       mode=st.sampled_from([Mode.CPU, Mode.THREAD]))
def test_validation_never_fails_otherwise_and_accepts_only_legal(ctl, n, order, cr3, ranges, mode):
    cfg = BufferConfig(num_chunks=n, chunk_order=order, ctl=ctl, cr3_match=cr3, addr_ranges=ranges)
    try:
        validate(cfg, FULL, mode)
    except TraceError as e:
        assert e.status in ("INVALID_ARGS", "NOT_SUPPORTED")
        return
    assert 1 <= n <= 4096 and 0 <= order <= 8 and n << (12 + order) <= 256 << 20
    assert not ctl & ~DEFINED_BITS and not ctl & (Ctl.TRACE_EN | Ctl.TOPA | Ctl.FABRIC_EN)
    assert not cr3 & 0x1F and len(ranges) <= 2
    assert all(a <= b for a, b in ranges)
    assert all(addr_cfg(ctl, k) in (0, 1, 2) for k in range(4))
    assert all(addr_cfg(ctl, k) == 0 for k in range(len(ranges), 4))
    if mode == Mode.THREAD:
        assert not ctl & Ctl.CR3_FILTER and cr3 == 0


# ---------------------------------------------------------------- ctl and capabilities

def test_ctl_fields_and_names():
    c = with_field(Ctl.BRANCH_EN | Ctl.MTC_EN, "mtc_freq", 9)
    assert field(c, "mtc_freq") == 9 and c >> 14 & 0xF == 9
    c = with_field(c, "addr1_cfg", 2)
    assert addr_cfg(c, 1) == 2 and c & Ctl.ADDR1_CFG == 2 << 36
    assert describe(c) == "mtc_en;branch_en;mtc_freq=9;addr1_cfg=2"
    with pytest.raises(ValueError):
        with_field(c, "psb_freq", 16)


def test_capabilities_cpuid_round_trip():
    regs = (1, 0b1_1111_1111, 0x8000_0007, 0x0249_0002, 0x003F_3FFF)
    caps = Capabilities.from_cpuid(*regs)
    assert caps.cr3_filtering and caps.psb_cyc and caps.ip_filtering and caps.mtc
    assert caps.ptwrite and caps.power_event_trace and caps.tnt_disable and caps.lip
    assert caps.topa_output and caps.topa_multiple_entries and caps.single_range_output
    assert not caps.trace_transport_output
    assert (caps.num_address_ranges, caps.mtc_period_mask, caps.cyc_threshold_mask,
            caps.psb_freq_mask) == (2, 0x249, 0x3FFF, 0x3F)
    assert caps.to_cpuid() == regs
    assert Capabilities.from_dict(caps.to_dict()) == caps
    assert Capabilities.from_cpuid(0, 0, 1).num_address_ranges == 0   # no sub-leaf 1
    assert not NONE.pt and not NONE.topa_output
    with pytest.raises(ValueError):
        Capabilities.from_dict({"mtc": 1})
    with pytest.raises(ValueError):
        Capabilities.from_dict({"num_address_ranges": "2"})


def test_cpu_info():
    c = CpuInfo(family=6, model=0x55, stepping=4)
    assert c.cpu_arg == "6/85/4" and CpuInfo.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError):
        CpuInfo.from_dict({"model": -1})
    with pytest.raises(ValueError):
        CpuInfo.from_dict({"vendor": 5})
