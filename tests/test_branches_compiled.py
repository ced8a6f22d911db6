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
    st.check()          # raises if expected (REQUIRE or built) but unusable
    if st.disabled:
        assert _impl.CORE is None
    elif st.expected:
        assert _impl.CORE is not None


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


class _FakeNamer(Namer):
    """Names from a dict: address -> (name, offset) or absent."""

    def __init__(self, table):
        super().__init__(None)
        self.fake = table

    def names_of(self, addr, ok):
        nid = np.zeros(len(addr), np.int64)
        off = np.zeros(len(addr), np.int64)
        known = np.zeros(len(addr), bool)
        for j, ad in enumerate(addr.tolist()):
            if ad in self.fake and ok[j]:
                name, o = self.fake[ad]
                nid[j], off[j], known[j] = self.names.id(name), o, True
        return nid, off, known


SYMS = [None, ("main", 0), ("main", 0x10), ("", 0), ("caf\u00e9", 1),
        ('q\\"x', 0), ("k" * 300, 0xfff), ("neg", -3)]


def _namer(addrs):
    return _FakeNamer({ad: s for ad, s in zip(addrs.tolist(), SYMS) if s})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jsonl_compiled_matches_twin(seed):
    a, addrs = _records(500, seed)
    py = format_chunk(a, _namer(addrs), "jsonl", impl="python")
    c = format_chunk(a, _namer(addrs), "jsonl", impl="compiled")
    assert c == py
    assert format_chunk(a[:0], _namer(addrs), "jsonl", impl="compiled") == b""
    assert (format_chunk(a[:1], _namer(addrs), "jsonl", impl="compiled")
            == format_chunk(a[:1], _namer(addrs), "jsonl", impl="python"))


def test_jsonl_compiled_matches_twin_on_runs():
    """Rows whose pid, tid and time stay for a while (as a thread's
    branches do), -1 (null) runs among them: the core's text made once
    per run is the twin's."""
    a, addrs = _records(3000, 4)
    rng = np.random.default_rng(4)
    for col in ("pid", "tid", "time"):
        starts = np.sort(rng.choice(np.arange(1, len(a)), 40, replace=False))
        a[col] = np.repeat(a[col][np.r_[0, starts]], np.diff(np.r_[0, starts, len(a)]))
    py = format_chunk(a, _namer(addrs), "jsonl", impl="python")
    assert format_chunk(a, _namer(addrs), "jsonl", impl="compiled") == py


def test_jsonl_compiled_across_chunks():
    """The index of addresses persists on the namer: chunks that share
    addresses and bring new ones give the twin's lines."""
    a, addrs = _records(3000, 7)
    a2, _ = _records(3000, 8)
    a2["from"][::3] = np.arange(1000, 2000, dtype=np.uint64) * 64
    npy, nc = _namer(addrs), _namer(addrs)
    for chunk in (a[:10], a[10:2000], a2, a[2000:], a2[::-1]):
        assert (format_chunk(chunk, nc, "jsonl", impl="compiled")
                == format_chunk(chunk, npy, "jsonl", impl="python"))


def test_jsonl_compiled_reads_fields_in_place():
    """The compiled core reads the record fields where they are (a step
    of records, any sign) and sizes each line's text exactly: every
    count of digits of every number, nulls, symbols or none."""
    from hwtrace.branches.format import _col
    a, addrs = _records(2000, 9)
    tens = np.array([0] + [10 ** k for k in range(19)] + [2 ** 63 - 1], np.int64)
    a["time"][:len(tens)] = tens
    a["pid"][:len(tens)] = tens
    a["depth"][:20] = np.array([-(10 ** k) for k in range(10)] + [10 ** k for k in range(10)],
                               np.int32)
    for part in (a, a[::3], a[::-2], a[5:6]):
        assert np.shares_memory(_col(part, "depth", np.int32), part)    # no copy
        assert (format_chunk(part, _namer(addrs), "jsonl", impl="compiled")
                == format_chunk(part, _namer(addrs), "jsonl", impl="python"))


def test_jsonl_compiled_without_symbols():
    a, _ = _records(200, 5)
    py = format_chunk(a, Namer(None), "jsonl", impl="python")
    c = format_chunk(a, Namer(None), "jsonl", impl="compiled")
    assert c == py


def _history(impl, switches, hold=1 << 14, binary=False, names=None):
    import io

    from hwtrace.analysis.records import Activation, Enter, Flag, StreamInfo
    from hwtrace.branches.calls import CallHistory
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, "utf-8", "surrogateescape") if binary else io.StringIO()
    h = CallHistory(out=out, hold=hold)
    h.impl = impl
    h.begin_stream(StreamInfo(cpu=0, switches=switches), "insns")
    rng = np.random.default_rng(3)
    names = names or ["main", "f", "caf\u00e9", "g" * 70, "x\udcff"]
    flags = [Flag.NONE, Flag.BEGIN_UNKNOWN, Flag.TRUNCATED, Flag.TAIL_CALL,
             Flag.BEGIN_UNKNOWN | Flag.TRUNCATED]
    h.add(Enter(0x10, "main", 0, 0, 0, Flag.BEGIN_UNKNOWN, 1))
    at = 1
    for k in range(600):
        d = 1 + int(rng.integers(0, 30))
        nm = names[k % len(names)]
        fl = flags[int(rng.integers(0, len(flags)))]
        tid = [None, 1, 2, -1][k % 4] if k % 7 else 3
        n = int(rng.choice([0, 5, 999, 1000, 123456789, 10 ** 12]))
        h.add(Enter(0x20 + k, nm, d, at, at, fl, tid))
        h.add(Activation(0x20 + k, nm, d, at, at + n, at, at + n, 0, 0, fl, tid))
        at += n + 1
    h.close()
    return raw.getvalue().decode("utf-8", "surrogateescape") if binary \
        else out.getvalue()


@pytest.mark.parametrize("switches", [(), ((0, 1, 2),)])
@pytest.mark.parametrize("hold", [8, 1 << 14])
def test_calls_counts_compiled_matches_twin(switches, hold):
    py = _history("python", switches, hold)
    assert py.count("\n") > 600
    assert _history("compiled", switches, hold) == py


def test_calls_counts_compiled_sorted_heads_match_twin(monkeypatch):
    """Past the dense head table's size the compiled line writer looks
    heads up among sorted keys: the same lines."""
    from hwtrace.branches import calls
    py = _history("python", (), 8)
    monkeypatch.setattr(calls._StrTable, "DENSE_MAX", 1)
    assert _history("compiled", (), 8) == py


@pytest.mark.parametrize("names", [None, ["main", "f", "caf\u00e9", "g" * 70]])
def test_calls_counts_compiled_to_a_binary_stream(names):
    """Lines the compiled core writes go to a UTF-8 stream's buffer as
    bytes (or through its text layer where a surrogate needs its error
    handler): the same text, in the same order as the headers."""
    py = _history("python", (), 8, names=names)
    assert _history("compiled", (), 8, binary=True, names=names) == py


def test_calls_counts_compiled_heads_by_numpy_match_twin(monkeypatch):
    """The line writer's head table read by numpy (no analysis core)
    gives the same lines as read by hwtrace.analysis._c_runs."""
    from hwtrace.analysis import _runs_impl
    py = _history("python", (), 8)
    monkeypatch.setattr(_runs_impl, "CORE", None)
    assert _history("compiled", (), 8) == py
