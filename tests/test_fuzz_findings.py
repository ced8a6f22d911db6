"""Fuzzing findings in modules still being written by others (issue 9):
each is a minimal reproducer, marked strict-xfail so that the fix turns it
into a failure that asks for the marker to go (the owner then keeps it as
their regression test).  Findings in modules we may fix are regression
tests next to their fix (test_hostile_bundles.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import run_hwtrace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
import targets  # noqa: E402

# fuzz flow finding f65a1e985977 (60 bytes), as image + trace
IMAGE = bytes.fromhex("90eb02236106")          # at 0x1000
TRACE = bytes.fromhex("001000000001f490f40282028202820282028202820282028299017d"
                      "00100000000002233d05100d")


def test_flow_async_branch_event_without_to_api():
    """Regression: an 'async_branch' reached through this trace was an Event
    without 'to', and AttributeError escaped the decoder."""
    targets.check_flow(targets.flow_input(IMAGE, 0x1000, TRACE))


def test_flow_async_branch_event_without_to_cli(tmp_path):
    """Regression: the same finding through the CLI was a traceback."""
    (tmp_path / "img.bin").write_bytes(IMAGE)
    (tmp_path / "t.pt").write_bytes(TRACE)
    r = run_hwtrace("decode", "--insn-decoder", "--raw", f"{tmp_path / 'img.bin'}:0x1000",
                    "--pt", tmp_path / "t.pt")
    assert "Traceback" not in r.stderr
    assert r.returncode == 0
