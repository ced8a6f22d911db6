"""hwtrace record's option parsing: config names to IA32_RTIT_CTL, sizes."""

import argparse

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
