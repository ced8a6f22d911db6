"""The clock: TSC anchors interpolated by instruction index, bounded."""

from __future__ import annotations

import pytest

from hwtrace.analysis.clock import Clock


def make(**kw):
    out = []
    c = Clock(lambda item, t: out.append((item, t)), **kw)
    return c, out


def test_insns_mode_is_immediate():
    c, out = make(mode="insns")
    c.push("a", 5)
    c.anchor(6, 1000)          # ignored
    assert out == [("a", 5)] and c.unit == "insns"


def test_interpolation_between_anchors():
    c, out = make()
    c.anchor(0, 1000)
    for i in (2, 5, 10):
        c.push(i, i)
    assert out == []                       # waits for the next anchor
    c.anchor(10, 2000)
    assert out == [(2, 1200.0), (5, 1500.0), (10, 2000.0)]
    assert c.unit == "tsc"


def test_frequency_converts_to_ns():
    c, out = make(tsc_hz=2e9)
    c.anchor(0, 2000)
    c.push("x", 4)
    c.anchor(8, 4000)
    assert out == [("x", 1500.0)] and c.unit == "ns"


def test_time_never_runs_backwards():
    c, out = make()
    c.anchor(0, 1000)
    c.push("a", 1)
    c.anchor(2, 900)                        # a bogus earlier TSC
    c.push("b", 3)
    c.anchor(4, 1100)
    assert [t for _, t in out] == [1000.0, 1050.0]


def test_same_index_anchors_items_before_keep_the_earlier_time():
    # tracing disabled at t=1000, enabled again at t=5000 at the same index:
    # what ended at the disable keeps 1000, what begins after gets 5000
    c, out = make()
    c.anchor(0, 500)
    c.anchor(10, 1000)
    c.push("closed", 10)
    c.anchor(10, 5000)
    c.push("opened", 10)
    c.anchor(20, 6000)
    assert out == [("closed", 1000), ("opened", 5000)]


def test_seal_extrapolates_with_the_last_rate():
    c, out = make()
    c.anchor(0, 0)
    c.anchor(10, 100)                       # 10 per instruction
    c.push("g", 15)
    c.seal(15)                              # a gap: no anchor will come
    assert out == [("g", 150.0)]
    c.push("after", 15)
    c.anchor(20, 1000)                      # time went on during the gap
    assert out[-1] == ("after", 150.0)


def test_bounded_queue_in_tsc_mode():
    c, out = make(max_pending=4)
    c.anchor(0, 0)
    c.anchor(1, 10)
    for i in range(2, 12):
        c.push(i, i)
        assert c.pending <= 4
    c.finish()
    assert [t for _, t in out] == [10.0 * i for i in range(2, 12)]


def test_auto_without_timing_becomes_insns():
    c, out = make(max_pending=3)
    for i in range(5):
        c.push(i, i)
    assert c.unit == "insns"
    assert out == [(i, i) for i in range(5)]


def test_auto_finish_without_any_anchor_uses_insns():
    c, out = make()
    c.push("a", 3)
    c.finish()
    assert out == [("a", 3)] and c.unit == "insns"


def test_bad_mode():
    with pytest.raises(ValueError):
        Clock(lambda *a: None, mode="wallclock")


def test_repeated_stale_values_are_not_anchors():
    # events keep reporting the last TSC (1000) until a new packet: the
    # instructions in between are interpolated up to the next new value
    c, out = make()
    c.anchor(0, 1000)
    c.push("a", 5)
    c.anchor(10, 1000)          # stale
    c.push("b", 15)
    c.anchor(20, 3000)
    assert out == [("a", 1500.0), ("b", 2500.0)]


def test_anchors_every_is_anchors_of_every_row():
    """anchors_every (a run's records: only where the TSC changes) leaves
    the anchors, rate and last TSC that anchors of every row leaves --
    repeats, zeros between repeats, a first value repeating the last
    one, runs backwards in time."""
    np = pytest.importorskip("numpy")
    from hwtrace.analysis.clock import TimeBase
    rng = np.random.default_rng(3)
    for seed in range(20):
        a, b = TimeBase(), TimeBase()
        seq0, idx0 = 0, 0
        for _run in range(5):
            k = int(rng.integers(1, 60))
            tsc = np.repeat(rng.choice([0, 500, 700, 900, 1100], k // 3 + 1),
                            3)[:k].astype(np.uint64)
            if seed % 2:
                tsc = np.sort(tsc)
            idx = idx0 + np.cumsum(rng.integers(0, 4, k)).astype(np.int64)
            a.anchors(seq0 + 4 * np.arange(k, dtype=np.int64), idx, tsc)
            b.anchors_every(seq0, 4, idx, tsc)
            seq0 += 4 * k + 4
            idx0 = int(idx[-1])
        for x in ("_a_seq", "_a_idx", "_a_t"):
            assert getattr(a, x).tolist() == getattr(b, x).tolist()
        assert (a._rate, a._last_tsc, a._last_real, a.mode) == \
            (b._rate, b._last_tsc, b._last_real, b.mode)
