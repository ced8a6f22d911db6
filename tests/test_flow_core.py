"""The compiled flow core (hwtrace.flow._c_flow, flow/core/) against its
Python twin, and regression tests for what fuzzing the pair found
(fuzz/flowdiff.py): each names the behaviour."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CORPUS

from hwtrace.flow import batches as B
from hwtrace.flow import fast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import flowdiff  # noqa: E402


def _core():
    fast.STATUS.check()
    if fast.CORE is None:
        probe = __import__("hwtrace._ext", fromlist=["probe"]).probe(
            fast.NAME, fast.ABI)
        if probe.module is None:
            pytest.skip(f"compiled flow core unavailable: {probe.reason}")
    return True


def _both(data: bytes):
    """Both producers over a flowdiff input: (python, compiled) collections
    (records, insns, items, complete); raises if they differ."""
    trace, image, cfg, block, resync = flowdiff.parse(data)
    dec = "block" if block else "insn"
    cap = flowdiff.flow_items(data)
    py = flowdiff.collect(B.batches(trace, image, cfg, decoder=dec,
                                    resync=resync, want_insns=True,
                                    impl="python"), cap)
    c = flowdiff.collect(B.batches(trace, image, cfg, decoder=dec,
                                   resync=resync, want_insns=True,
                                   max_records=7, impl="compiled"), cap)
    flowdiff.compare(py, c)
    return py, c


def test_core_loaded():
    _core()
    assert hasattr(fast.CORE or fast._core("compiled"), "decode_batches")


def test_regression_resync_does_not_repeat_a_failed_event():
    """A disable event that cannot be applied (tracing already off:
    unexpected packet context) while resynchronizing on errors: resync
    handed the same event out again, which failed again -- for ever (both
    twins).  Now the event that failed is dropped and resync looks on."""
    _core()
    from hwtrace.flow.config import Errata, FlowConfig
    cfg = FlowConfig(errata=Errata(bdm70=True, skd022=True, skz84=True))
    trace = bytes.fromhex(
        "028202820282028202820282028202827d0000100000ffffff7f0000009901"
        "022302730101010100003d01000101022302730101010100003d010001")
    data = flowdiff.make_input(trace, [(0x100000, b"\x00\x00")], cfg,
                               block=True, resync=True)
    py, c = _both(data)
    assert py[3] and c[3]                       # both ended
    errors = [i for i in py[2] if i[2][0] == "ErrorItem"]
    assert 1 <= len(errors) < 10


def test_regression_resync_does_not_restart_at_a_failed_status_update():
    """A PSB+ status update that cannot be applied (bad status update)
    while resynchronizing on errors: resync started over at that PSB,
    delivering the same status update, which failed again -- for ever
    (both twins).  The failed event is dropped instead.  (The fuzz input,
    fuzz/flowdiff.py's format: block decoder, resync on error.)"""
    _core()
    data = bytes.fromhex(
        "030029000000000000000000001000000000007e02909090f402820282028202"
        "820282028202820282990199217d0000000001060000000099017d0000100000"
        "0099210223710000100000003d010001001000000000007e02909090f4028202"
        "82028202820282028202820282990199217d0000100000000223210200028202"
        "8202820282028202820282028299")
    py, c = _both(data)
    assert py[3] and c[3]
    errors = [i[2] for i in py[2] if i[2][0] == "ErrorItem"]
    assert errors[0][-1] == ("str", "bad status update")
    assert len(errors) < 10
