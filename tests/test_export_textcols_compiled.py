"""The compiled column assembler (hwtrace.export._c_textcols) gives the
bytes of its Python twin (Lines.render / Lines.text)."""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.export import _textcols_impl
from hwtrace.export.textcols import Lines


def test_core_loaded_where_expected():
    st = _textcols_impl.STATUS
    st.check()          # raises if expected (REQUIRE or built) but unusable
    if st.disabled:
        assert _textcols_impl.CORE is None
    elif st.expected:
        assert _textcols_impl.CORE is not None


def _lines(n, seed):
    rng = np.random.default_rng(seed)
    t = Lines(n)
    v = rng.integers(-10 ** 12, 10 ** 12, n)
    show = rng.random(n) < 0.7
    t.lit(b'{"a":')
    t.int(v, 12, commas=True).only(show).when(~show, b"null")
    t.lit(b",")
    t.strs([b"", b"x", b"caf\xc3\xa9", b"k" * 90], rng.integers(0, 4, n), 8)
    t.strs([b"r", b"rr"], rng.integers(0, 2, n), 5, right=True)
    t.hex(rng.integers(0, 2 ** 40, n).astype(np.uint64))
    t.spaces(rng.integers(0, 7, n))
    t.frac(rng.integers(0, 10 ** 9, n), 10)
    t.when(rng.random(n) < 0.5, b" [note]")
    t.zeros(rng.integers(0, 1000, n), 2).only(rng.random(n) < 0.5)
    t.int(rng.integers(0, 2 ** 64, n, dtype=np.uint64), 3)
    t.int(rng.integers(-99, 99, n).astype(np.int8))
    t.frac(rng.integers(-10 ** 6, 10 ** 6, n), 4)
    t.strs([b"", b"z"], np.zeros(n, np.int64)).only(rng.random(n) < 0.5)
    t.spaces(np.zeros(n, np.int64)).only(rng.random(n) < 0.5)
    u = Lines(n)
    u.int(rng.integers(0, 999, n), 3).lit(b"|")
    t.extend(u)
    t.lit(b"}\n")
    return t


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_text_compiled_matches_twin(n):
    assert _lines(n, n).text(impl="compiled") == _lines(n, n).text(impl="python")


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_lengths_compiled_matches_twin(n):
    a = _lines(n, n).lengths(impl="compiled")
    assert np.array_equal(a, _lines(n, n).lengths(impl="python"))
    assert int(a.sum()) == len(_lines(n, n).render(impl="compiled"))


@pytest.mark.parametrize("n", [1, 300])
def test_render_compiled_matches_twin(n):
    rng = np.random.default_rng(n)

    def build():
        t = Lines(n)
        t.lit(b"\x00\x08")                  # binary: NUL bytes are kept
        t.varint(rng.integers(0, 2 ** 50, n))
        t.when(rng.random(n) < 0.5, b"\x10\x00")
        return t
    state = rng.bit_generator.state
    a = build().render(impl="python")
    rng.bit_generator.state = state
    b = build().render(impl="compiled")
    assert a == b and b"\x00" in a


@pytest.mark.parametrize("width", [0, 1, 3, 4, 5, 8, 13, 19, 20, 24])
def test_twin_digits_are_the_low_digits(width):
    """The twin's digit matrix: the low ``width`` digits of any uint64,
    zero-padded, as Python formats them (and a writable matrix: callers
    squeeze and overwrite it).  The compiled rows are checked against the
    twin's columns above."""
    from hwtrace.export.textcols import _digits
    rng = np.random.default_rng(width)
    v = np.concatenate((rng.integers(0, 2 ** 64, 2000, dtype=np.uint64),
                        np.array([0, 1, 9, 10, 9999, 10000, 2 ** 64 - 1], np.uint64),
                        (10 ** np.arange(20, dtype=np.uint64)),
                        (10 ** np.arange(1, 20, dtype=np.uint64)) - np.uint64(1)))
    a = _digits(v, width)
    assert a.shape == (len(v), width)
    want = [f"{int(x):020d}"[20 - width:] if width <= 20 else f"{int(x):0{width}d}"
            for x in v.tolist()]
    assert [bytes(r).decode() for r in a] == want
    assert a.flags.writeable
    assert _digits(v[:0], width).shape == (0, width)


def test_chrome_slices_compiled_matches_lines():
    """chrome_slices (the Chrome writer's compiled events) formats as the
    twin's Lines do, negative and large values included."""
    from hwtrace.export.chrome import _PARTS
    core = _textcols_impl.core_for("compiled")
    rng = np.random.default_rng(5)
    n = 2000
    names = [b'"a"', b'"caf\xc3\xa9"', b""]
    flags = [b"", b',"args":{"flags":"x"}']
    name, fl = rng.integers(0, 3, n), rng.integers(0, 2, n)
    ts = rng.integers(-2 ** 62, 2 ** 62, n)
    ts[:20] = [0, 1, -1, 1023, 1024, -1024, 2 ** 63 - 1, -2 ** 63 + 1] + [5] * 12
    dur = rng.integers(0, 2 ** 40, n)
    pid, tid = rng.integers(-2 ** 63, 2 ** 63 - 1, n), rng.integers(-5, 5, n)
    t = Lines(n)
    t.lit(_PARTS[0]).strs(names, name).lit(_PARTS[1]).frac(ts).lit(_PARTS[2]).frac(dur)
    t.lit(_PARTS[3]).int(pid).lit(_PARTS[4]).int(tid).strs(flags, fl).lit(_PARTS[5])
    got = core.chrome_slices(name, ts, dur, pid, tid, fl, names, flags, _PARTS)
    assert got == t.text(impl="python")


def test_chrome_slices_compiled_streams_the_same_text():
    """With ``write``, chrome_slices hands the same text over in chunks of
    about a megabyte (views of its own buffer, released after each
    call), less the last ``drop`` bytes."""
    from hwtrace.export.chrome import _PARTS
    core = _textcols_impl.core_for("compiled")
    rng = np.random.default_rng(6)
    n = 40000
    names = [b'"a"', b'"' + b"x" * 300 + b'"', b'"b"']
    flags = [b"", b',"args":{"flags":"x"}']
    cols = (rng.integers(0, 3, n), rng.integers(0, 2 ** 50, n), rng.integers(0, 2 ** 40, n),
            rng.integers(0, 9, n), rng.integers(0, 9, n), rng.integers(0, 2, n),
            names, flags, _PARTS)
    whole = core.chrome_slices(*cols)
    chunks, views = [], []

    def write(v):
        views.append(v)
        chunks.append(bytes(v))
    assert core.chrome_slices(*cols, write, 2) is None
    assert b"".join(chunks) == whole[:-2] and len(whole) > 4 << 20
    assert len(chunks) >= 4 and all(len(c) >= 1 << 20 for c in chunks[:-1])
    assert all(len(c) < (1 << 20) + 400 for c in chunks)
    with pytest.raises(ValueError):
        views[0].tobytes()                  # released: the buffer was reused
    first = [c[:1] if hasattr(c, "dtype") else c for c in cols]
    one = []
    core.chrome_slices(*first, lambda v: one.append(bytes(v)), 0)
    assert one == [core.chrome_slices(*first)]
    for drop in (len(one[0]) + 1, -1):
        with pytest.raises(ValueError):
            core.chrome_slices(*first, lambda v: None, drop)


def test_slice_packets_stream_splices_specials():
    """With ``write``, slice_packets hands over the packets of its bytes
    mode in chunks of about a megabyte, each special just before the
    plain packet its place names (at n: after the last)."""
    core = _textcols_impl.core_for("compiled")
    rng = np.random.default_rng(8)
    n = 60000
    parts = tuple(bytes([k + 1]) * (k % 3 + 1) for k in range(10))
    cols = (rng.integers(0, 2 ** 40, n).astype(np.uint64),
            rng.integers(0, 2, n).astype(np.uint8), rng.integers(0, 3, n),
            rng.integers(1, 1000, n), rng.integers(0, 2 ** 30, n), rng.integers(0, 2, n),
            [b"\x10\x01", b"\x10\x02", b"\x10" * 40], [b"", b"\x22\x03abc"], parts)
    data, lens = core.slice_packets(*cols)
    offs = np.r_[0, np.cumsum(np.frombuffer(lens, np.int64))]
    at = np.sort(np.r_[0, 0, rng.integers(0, n + 1, 300), n]).astype(np.int64)
    specials = [b"S%d" % j + b"x" * int(rng.integers(0, 3000)) for j in range(len(at))]
    want, done = [], 0
    for a, sb in zip(at.tolist(), specials):
        want += [data[done:offs[a]], sb]
        done = offs[a]
    want.append(data[done:])
    chunks = []
    assert core.slice_packets(*cols, lambda v: chunks.append(bytes(v)), at, specials) is None
    assert b"".join(chunks) == b"".join(want) and len(data) > 2 << 20
    assert len(chunks) >= 2 and all(len(c) >= 1 << 20 for c in chunks[:-1])
    with pytest.raises(ValueError):
        core.slice_packets(*cols, chunks.append, at[::-1].copy(), specials)


def test_slice_packets_stream_skips_rows_of_end_two():
    """Written, a row whose ``end`` is 2 makes no packet (the Perfetto
    writer's rows of its one-by-one packets, which go there): the same
    bytes as the plain rows alone with each special placed by the number
    of plain rows before it; not written, ``end`` 2 is refused."""
    core = _textcols_impl.core_for("compiled")
    rng = np.random.default_rng(9)
    n = 50000
    parts = tuple(bytes([k + 1]) * (k % 3 + 1) for k in range(10))
    end = rng.integers(0, 2, n).astype(np.uint8)
    rows = np.sort(np.r_[0, rng.choice(np.arange(1, n), 400, replace=False), n - 1])
    end[rows] = 2
    cols = [rng.integers(0, 2 ** 40, n).astype(np.uint64), end, rng.integers(0, 3, n),
            rng.integers(1, 1000, n), rng.integers(0, 2 ** 30, n), rng.integers(0, 2, n),
            [b"\x10\x01", b"\x10\x02", b"\x10" * 40], [b"", b"\x22\x03abc"], parts]
    specials = [b"S%d" % j for j in range(len(rows))]
    got = []
    assert core.slice_packets(*cols, lambda v: got.append(bytes(v)), rows.astype(np.int64),
                              specials) is None
    plain = end != 2
    sel = [c[plain] if hasattr(c, "dtype") else c for c in cols]
    at = np.searchsorted(np.flatnonzero(plain), rows).astype(np.int64)
    want = []
    core.slice_packets(*sel, lambda v: want.append(bytes(v)), at, specials)
    assert b"".join(got) == b"".join(want) and len(b"".join(got)) > 1 << 20
    with pytest.raises(ValueError):
        core.slice_packets(*cols)
