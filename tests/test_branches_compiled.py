"""The compiled branch-record formatter (hwtrace.branches._c_format)
writes the same JSON lines as its Python twin."""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.branches import _impl
from hwtrace.branches.format import Namer, format_chunk
from hwtrace.branches.records import KINDS, dtype


def test_core_loaded_where_expected():
    st = _impl.STATUS
    assert not st.expected or st.loaded, st.reason


def _records(n, seed):
    rng = np.random.default_rng(seed)
    a = np.zeros(n, dtype())
    a["pid"] = rng.choice([-1, 0, 7, 6284, 2**40], n)
    a["tid"] = rng.choice([-1, 0, 9, 6285, 2**62], n)
    a["kind"] = rng.integers(0, len(KINDS), n)
    addrs = np.array([0, 1, 0x401000, 0x401010, 0x7fffffffe000,
                      0xffffffff81000000, 2**64 - 1], np.uint64)
    a["from"] = rng.choice(addrs, n)
    a["to"] = rng.choice(addrs, n)
    a["time"] = rng.choice([-1, 0, 1, 39770517305133, 2**63 - 1], n)
    a["depth"] = rng.choice([-(1 << 31), -5, -1, 0, 1, 2**31 - 1], n)
    return a, addrs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jsonl_compiled_matches_twin(seed):
    core = _impl.core_for(None) or pytest.importorskip("hwtrace.branches._c_format")
    assert core is not None
    a, addrs = _records(500, seed)
    syms = [None, "main", "main+0x10", "", "caf\u00e9+0x1", 'q\\"x', "k" * 300]

    def namer():
        n = Namer(None)
        for ad, s in zip(addrs.tolist(), syms):
            if ad:
                n.sym_json[ad] = s
        return n

    py = format_chunk(a, namer(), "jsonl", impl="python")
    c = format_chunk(a, namer(), "jsonl", impl="compiled")
    assert c == py
    assert format_chunk(a[:0], namer(), "jsonl", impl="compiled") == b""
    assert (format_chunk(a[:1], namer(), "jsonl", impl="compiled")
            == format_chunk(a[:1], namer(), "jsonl", impl="python"))


def test_jsonl_compiled_without_symbols():
    a, _ = _records(200, 5)
    py = format_chunk(a, Namer(None), "jsonl", impl="python")
    c = format_chunk(a, Namer(None), "jsonl", impl="compiled")
    assert c == py
