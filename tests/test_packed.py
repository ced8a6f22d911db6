"""Chunks packed while they wait (hwtrace.analysis.packed): given back bit
for bit, smaller where the columns say little."""

import pickle

import numpy as np

from hwtrace.analysis.packed import pack, unpack
from hwtrace.analysis.slices import Cols, Slices


def _same(a: Cols, b: Cols) -> None:
    assert a.n == b.n
    assert list(a.d) == list(b.d)
    for f in a.d:
        x, y = a.d[f], b.d[f]
        assert x.dtype == y.dtype, f
        assert x.tobytes() == y.tobytes(), f
        assert y.flags.c_contiguous and y.flags.writeable, f


def _chunk(n: int, seed: int = 0) -> Slices:
    rng = np.random.default_rng(seed)
    E = Cols.zeros(n)
    E["id"] = 1000 + np.arange(n)
    E["parent"] = np.where(np.arange(n) % 3 == 0, -1, 999 + np.arange(n))
    E["func"] = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    E["end_idx"] = -1
    E["xseq"] = -1
    E["pid"] = 7
    E["begin"] = rng.random(n)
    X = Cols.zeros(n)
    X["id"] = rng.integers(-(1 << 62), 1 << 62, n)       # too wide: kept
    X["eseq"] = (1 << 40) + rng.integers(0, 1 << 31, n)  # offsets
    X["end"] = -0.0                                      # one value: its bits
    X["child_time"] = np.nan
    X["begin_idx"] = rng.integers(0, 100, n)
    return Slices(E, X, [(5, "marker")])


def test_a_packed_chunk_comes_back_bit_for_bit():
    for n in (0, 1, 2, 3, 1000):
        c = _chunk(n, n)
        got = unpack(pickle.loads(pickle.dumps(pack(c), pickle.HIGHEST_PROTOCOL)))
        _same(c.enters, got.enters)
        _same(c.exits, got.exits)
        assert got.markers == c.markers
    got = unpack(pack(_chunk(50)))
    assert np.signbit(got.exits["end"]).all()
    assert np.isnan(got.exits["child_time"]).all()


def test_packing_keeps_fewer_bytes_where_columns_say_little():
    c = _chunk(10000)
    raw = len(pickle.dumps(c, pickle.HIGHEST_PROTOCOL))
    packed = len(pickle.dumps(pack(c), pickle.HIGHEST_PROTOCOL))
    assert packed < raw * 0.7


def test_a_slice_of_columns_packs_too():
    c = _chunk(100)
    part = Slices(c.enters[10:90:2], c.exits[np.arange(100) % 7 == 0], [])
    got = unpack(pack(part))
    _same(part.enters, got.enters)
    _same(part.exits, got.exits)
