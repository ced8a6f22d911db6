"""System calls that come back where they were made, and events that only
tell the time, go on in a run of records (hwtrace.analysis.roundtrips):
the activations, their times and the markers are those the events make
one at a time (``vectorize=False``, the reference), in both cores."""

from __future__ import annotations

import pytest

from hwtrace.analysis import CallStackBuilder, Flag, _runs_impl, roundtrips, runs
from hwtrace.analysis.records import Activation, StreamInfo
from hwtrace.analysis.synth import FlowSynth
from hwtrace.bundle import Switch
from hwtrace.flow.events import Event

NAMES = ["main", "read", "write", "helper", "late2", "late1"]


def _syscall(s: FlowSynth, fn: str, k: int, tsc: int, psb: bool,
             late: bool = False) -> list:
    """main calls ``fn``, which makes a system call (a far call, tracing
    off, on again at its return address) and returns; with ``psb`` a
    PSB+'s status updates (time only) follow the return."""
    s.body(1 + k % 3)
    s.call(fn)
    s.body(2)
    s._insn(2, "far_call")
    resume = s.ip + 2
    items = s.take() + [
        Event("disabled", ip_suppressed=True, has_tsc=True, tsc=tsc),
        Event("enabled", ip=resume, has_tsc=k % 5 != 3, tsc=tsc + 40)]
    # a PSB+ at the system call (the bytes its packets take cross the PSB
    # threshold): after the enable, or (tracing off) before it
    at_trip = psb and k % 3 != 0
    if at_trip and k % 3 == 1:
        items += [Event("enabled", status_update=True, ip=resume, has_tsc=True, tsc=tsc + 45),
                  Event("cbr", status_update=True, ratio=20, has_tsc=True, tsc=tsc + 45)]
    elif at_trip:
        items[-1:-1] = [Event("disabled", status_update=True, ip_suppressed=True,
                              has_tsc=True, tsc=tsc + 20 + 100 * (k % 2)),
                        Event("cbr", status_update=True, ratio=20, has_tsc=True, tsc=tsc + 20)]
    s.ip = resume
    s.body(1 + k % 2)
    if k % 4 == 1:
        s.call("helper")
        s.body(3)
        s.ret()
    if late and k in (17, 18, 40):
        # first met here (named as the runs the events cut meet them)
        s.call("late1" if k < 40 else "late2")
        s.body(2)
        s.ret()
    s.ret()
    s.body(1)
    items += s.take()
    if psb and not at_trip:
        items += [Event("cbr", status_update=True, ratio=20, has_tsc=True,
                        tsc=tsc + 90),
                  Event("enabled", status_update=True, ip=s.ip, has_tsc=True,
                        tsc=tsc + 90)]
    return items


def _parts(n: int, psb: bool, late: bool = False) -> list:
    s = FlowSynth(NAMES)
    s.start("main")
    first = s.take()
    for k in range(2):
        first += _syscall(s, "write" if k % 2 else "read", k, 1000 + 200 * k, psb)
    rest = []
    for k in range(2, n):
        rest += _syscall(s, "write" if k % 2 else "read", k, 1000 + 200 * k, psb,
                         late)
    s.body(2)
    rest += s.take()
    # the first batch names "[syscall]" and every function (and applies
    # the stream's switch); the second goes on through the rest
    return [first, rest], s


def _run(parts, lookup, vectorize, stream=None):
    b = CallStackBuilder(stream, lookup, vectorize=vectorize)
    out = []
    for part in parts:
        for it in part:
            b.feed(it)
        out += b.take()
    b.finish()
    out += b.take()
    return out, b


def _against_one_at_a_time(monkeypatch, parts, lookup, stream):
    """``parts`` through the builder vectorized and one transfer at a
    time (which solves nothing): the same records, calls, markers and
    name ids.  Returns the vectorized (records, builder, solves made)."""
    calls = []
    solve = runs.solve
    monkeypatch.setattr(runs, "solve", lambda *a, **k: calls.append(1) or solve(*a, **k))
    ref, rb = _run(parts, lookup, False, stream)
    assert not calls
    got, gb = _run(parts, lookup, True, stream)
    assert got == ref
    assert gb.calls == rb.calls and gb.markers == rb.markers
    assert gb.names.names == rb.names.names
    return got, gb, len(calls)


def _random_runs(rng, m):
    """A batch's runs at random: their codes, fall-throughs and IPs (most
    runs start where the one before falls through)."""
    import numpy as np
    code = rng.choice([runs.NONE, runs.CALL, runs.FCALL, runs.JUMP],
                      m, p=[.3, .2, .4, .1]).astype(np.int8)
    fall = rng.integers(0x1000, 0x1100, m).astype(np.uint64)
    ip = np.where(rng.random(m) < .8, np.roll(fall, 1), fall + 1).astype(np.uint64)
    return code, fall, ip


@pytest.mark.parametrize("impl", ["python", "compiled"])
@pytest.mark.parametrize("follow", [False, True])
def test_syscalls_and_time_only_events_go_on_in_the_run(impl, follow, monkeypatch):
    if impl == "compiled" and _runs_impl.core_for("compiled") is None:
        pytest.skip("no compiled core")
    monkeypatch.setattr(_runs_impl, "CORE", _runs_impl.core_for(impl))
    parts, s = _parts(60, psb=follow)
    stream = StreamInfo(cpu=0, switches=(Switch(0, 0, -1, -1, 7, 7),)) \
        if follow else None
    got, gb, calls = _against_one_at_a_time(monkeypatch, parts, s.lookup, stream)
    # one [syscall] frame per system call, timed by its events (following
    # the CPU's threads, the first one's enable brings the thread in)
    sys = [a for a in got if type(a) is Activation and a.name == "[syscall]"]
    assert len(sys) == 60 and all(a.flags == Flag.FAR for a in sys[1:])
    assert sys[1].begin == 1200 and sys[1].end == 1240
    # the second batch was solved in a few runs, not one per system call
    assert calls < 10




@pytest.mark.parametrize("impl", ["python", "compiled"])
def test_names_come_in_the_order_the_events_cut_runs_meet_them(impl, monkeypatch):
    """Solves name what they meet in bulk (in address order): where code
    not named before shows up, the runs go as the events cut them, and
    every name gets the same id as without going on through the events."""
    if impl == "compiled" and _runs_impl.core_for("compiled") is None:
        pytest.skip("no compiled core")
    monkeypatch.setattr(_runs_impl, "CORE", _runs_impl.core_for(impl))
    parts, s = _parts(60, psb=False, late=True)
    got, gb = _run(parts, s.lookup, True)
    monkeypatch.setattr(roundtrips, "find", lambda items, *a: (items, None))
    cut, cb = _run(parts, s.lookup, True)
    assert got == cut
    assert gb.names.names == cb.names.names
    assert "late1" in gb.names.names and "late2" in gb.names.names


@pytest.mark.parametrize("impl", ["python", "compiled"])
def test_time_only_events_go_on_while_switches_are_left(impl, monkeypatch):
    """Following a CPU's threads with a switch still to apply (here: long
    after the trace) on a clock counting the traced instructions: a
    PSB+'s status updates, which only tell the time the timeline does not
    hear while tracing is on, go on in the run, and so do the system
    calls' round trips (no enable comes near the switch's time)."""
    if impl == "compiled" and _runs_impl.core_for("compiled") is None:
        pytest.skip("no compiled core")
    monkeypatch.setattr(_runs_impl, "CORE", _runs_impl.core_for(impl))
    parts, s = _parts(60, psb=True)
    stream = StreamInfo(cpu=0, switches=(Switch(0, 0, -1, -1, 7, 7),
                                         Switch(0, 1 << 50, 7, 7, -1, -1)),
                        tsc_per_insn=1.0, clock_counted=True)
    got, gb, calls = _against_one_at_a_time(monkeypatch, parts, s.lookup, stream)
    assert gb._follow.i < len(gb._follow.switches)
    # not a run per system call and one more per PSB+ (120 when they cut)
    assert calls < 10


@pytest.mark.parametrize("impl", ["python", "compiled"])
def test_round_trips_go_on_up_to_the_enable_a_switch_comes_at(impl, monkeypatch):
    """Following a CPU's threads on a clock counting the traced
    instructions, with switches among the system calls (another thread
    in at one enable, the first back at a later one): the round trips
    before each go on in the run -- their enables bring no switch in,
    which the clock says beforehand -- and the one a switch is due at is
    taken one at a time; all as one at a time makes it."""
    if impl == "compiled" and _runs_impl.core_for("compiled") is None:
        pytest.skip("no compiled core")
    monkeypatch.setattr(_runs_impl, "CORE", _runs_impl.core_for(impl))
    parts, s = _parts(60, psb=True)
    # enables at 1040 + 200 k: thread 8 in at the 30th, 7 back at the 45th
    stream = StreamInfo(cpu=0, switches=(Switch(0, 0, -1, -1, 7, 7),
                                         Switch(0, 6950, 7, 7, 8, 8),
                                         Switch(0, 9950, 8, 8, 7, 7)),
                        tsc_per_insn=1.0, clock_counted=True)
    got, gb, calls = _against_one_at_a_time(monkeypatch, parts, s.lookup, stream)
    assert gb._follow.i == 3
    assert {7, 8} <= {a.tid for a in got if type(a) is Activation}
    # a few runs per switch, not one per system call (60)
    assert calls < 20


def test_spread_is_the_twins_take():
    """The compiled core's spread (a batch's columns with room for its
    groups' events) gives the twin's take of each transfer ``cnt`` times,
    for every item size, groups at either end, none, and adjacent ones;
    bad input is refused."""
    np = pytest.importorskip("numpy")
    core = _runs_impl.core_for("compiled") if _runs_impl.STATUS.module is not None \
        else None
    if core is None:
        pytest.skip("no compiled core")
    rng = np.random.default_rng(15)
    for n, tr in [(1, [0]), (5, []), (6, [0, 5]), (9, [2, 3, 4]), (1000, None)]:
        if tr is None:
            tr = np.unique(rng.integers(0, n, 120))
        tr = np.array(tr, np.int64)
        ne = rng.integers(0, 4, len(tr)).astype(np.int64)
        cnt = np.ones(n, np.int64)
        cnt[tr] = ne + 1
        total = int(cnt.sum())
        twin = roundtrips._spreader(tr, ne, cnt, total)
        vmap = np.repeat(np.arange(n, dtype=np.int64), cnt)
        for dt in (np.int8, np.int32, np.uint64, np.int64):
            x = rng.integers(0, 100, n).astype(dt)
            out = np.empty(total, dt)
            core.spread(x, tr, ne, out)
            assert out.tolist() == x.take(vmap).tolist()
            assert twin(x).tolist() == x.take(vmap).tolist()
    x = np.arange(4, dtype=np.uint64)
    for tr, ne, size in [([2, 1], [0, 0], 4), ([4], [1], 6), ([1], [-1], 3),
                         ([1], [1], 6), ([1], [1], 4)]:
        with pytest.raises(ValueError):
            core.spread(x, np.array(tr, np.int64), np.array(ne, np.int64),
                        np.empty(size, np.uint64))
    with pytest.raises(ValueError):
        core.spread(x, np.zeros(0, np.int64), np.zeros(0, np.int64),
                    np.empty(4, np.uint32))


def _psb_trip_shapes(ev, k, ret):
    """System calls with a PSB+ at them (round trips), and look-alikes
    (not): after the enable; before it (tracing off); a status update
    disabling after the enable (not); two enables (not)."""
    return [[ev("disabled", k, ip_suppressed=True), ev("enabled", k + 1, ip=ret),
             ev("enabled", k + 2, ip=ret, status_update=True, follows="tnt8"),
             ev("cbr", k + 2, status_update=True, ratio=20)],
            [ev("disabled", k, ip_suppressed=True),
             ev("disabled", k + 1, ip_suppressed=True, status_update=True),
             ev("cbr", k + 2, status_update=True, ratio=20), ev("enabled", k + 4, ip=ret)],
            [ev("disabled", k, ip_suppressed=True), ev("enabled", k + 1, ip=ret),
             ev("disabled", k + 2, ip_suppressed=True, status_update=True)],
            [ev("disabled", k, ip_suppressed=True), ev("enabled", k + 1, ip=ret),
             ev("enabled", k + 2, ip=ret)]]


def test_find_at_once_is_find_one_group_at_a_time():
    """find picks a batch's round trips out at once; every group, kept
    items and column is what taking the groups one at a time gives --
    round trips whose record, IP or TSC does not fit, status updates,
    time-only events, items that are no Event, indices outside the batch,
    groups of one, two and three."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)

    class Other:
        type = "error"

    def ev(kind, k, **kw):
        return Event(kind, has_tsc=bool(k % 3), tsc=0 if k % 7 == 0 else 100 + k, **kw)

    for seed in range(6):
        m = 300
        code, fall, ip = _random_runs(rng, m)
        items = []
        for j in sorted(rng.choice(np.arange(-1, m + 2), 150, replace=False).tolist()):
            k = int(rng.integers(0, 1000))
            ret = int(fall[j - 1]) if 0 < j <= m else 0
            shape = k % 12
            if shape >= 8:
                group = _psb_trip_shapes(ev, k, ret)[shape - 8]
            elif shape < 4:
                group = [ev("disabled", k, ip_suppressed=True),
                         ev("enabled", k + 1, ip=ret if shape else ret + 1)]
            elif shape == 4:
                group = [ev("enabled", k, ip=ret, status_update=True),
                         ev("cbr", k + 2, status_update=True)]
            elif shape == 5:
                group = [ev("disabled", k, status_update=True)]
            elif shape == 6:
                group = [ev("disabled", k), ev("enabled", k, ip=ret), Other()]
            else:
                group = [Other(), ev("enabled", k, ip=ret)]
            items += [(j, 10 * j + i, e) for i, e in enumerate(group)]
        assert len(items) >= 64
        for anchors, left in ((False, False), (True, False), (True, True)):
            # (left: switches to apply; round trips taken, the clock counting)
            a = roundtrips.find(items, code, fall, ip, m, anchors, left, True)
            b = roundtrips._find_each(items, code, fall, ip, m, anchors, left, True)
            assert a[0] == b[0]
            assert (a[1] is None) == (b[1] is None)
            if a[1] is not None:
                cols = lambda g: (g.tr.tolist(), g._p.tolist(), g._q.tolist(),
                                  g._trip.tolist(), g._on.tolist())
                assert cols(a[1]) == cols(b[1])
                assert a[1]._trip.any() and (~a[1]._trip).any() == anchors


def test_find_rows_is_find_one_group_at_a_time():
    """find_rows: the same groups over a batch whose plain events are
    rows (hwtrace.flow.plain) as _find_each over its items -- round trips
    whose record, IP or TSC does not fit, status updates, time-only
    events, events a row cannot tell (items among rows in a group),
    items that are no Event, indices outside the batch -- with and
    without switches left (``left``): the kept items (rows made Events),
    each group's events, and the transfers with the groups in."""
    np = pytest.importorskip("numpy")
    from types import SimpleNamespace

    from hwtrace.flow import plain
    rng = np.random.default_rng(11)

    class Other:
        type = "error"

    def ev(kind, k, **kw):
        return Event(kind, has_tsc=bool(k % 3), tsc=0 if k % 7 == 0 else 100 + k, **kw)

    def key(item):
        j, off, x = item
        if type(x) is Event:
            return j, off, tuple((a, getattr(x, a)) for a in x.__slots__ if hasattr(x, a))
        return j, off, x

    for seed in range(8):
        m = 300
        code, fall, ip = _random_runs(rng, m)
        items = []
        for j in sorted(rng.choice(np.arange(-1, m + 2), 150, replace=False).tolist()):
            k = int(rng.integers(0, 1000))
            ret = int(fall[j - 1]) if 0 < j <= m else 0
            shape = k % 14
            if shape >= 10:
                group = _psb_trip_shapes(ev, k, ret)[shape - 10]
            elif shape < 4:
                group = [ev("disabled", k, ip_suppressed=True),
                         ev("enabled", k + 1, ip=ret if shape else ret + 1,
                            **({"resumed": False} if shape == 2 else {}))]
            elif shape == 4:
                group = [ev("enabled", k, ip=ret, status_update=True, follows="tnt8"),
                         ev("cbr", k + 2, status_update=True, ratio=20),
                         ev("exec_mode", k + 2, status_update=True, ip=ret, mode="64bit")]
            elif shape == 5:
                group = [ev("disabled", k, status_update=True)]
            elif shape == 6:
                group = [ev("disabled", k), ev("enabled", k, ip=ret), Other()]
            elif shape == 7:
                # an enable no row tells (a lost MTC count): an item
                group = [ev("disabled", k, ip_suppressed=True),
                         ev("enabled", k + 1, ip=ret, lost_mtc=1)]
            elif shape == 8:
                group = [ev("paging", k, status_update=True, cr3=0x1000),
                         ev("cbr", k + 1, status_update=True, ratio=3)]
            else:
                group = [Other(), ev("enabled", k, ip=ret)]
            items += [(j, 10 * j + i, e) for i, e in enumerate(group)]
        kept, rows = plain.split(items)
        assert len(rows) and len(kept) > 20
        at = plain.item_positions(len(kept), rows)
        a = SimpleNamespace(code=code, fall=fall, ip=ip, end=fall - 2,
                            start=np.arange(m + 1, dtype=np.int64) * 3,
                            tsc=rng.integers(0, 3, m).astype(np.uint64) * 1000)
        for anchors in (False, True):
            for left, trips in ((False, None), (True, None), (True, True)):
                x = roundtrips.find_rows(kept, at, rows, code, fall, ip, m, anchors, left,
                                         trips)
                y = roundtrips._find_each(items, code, fall, ip, m, anchors, left, trips)
                assert [key(i) for i in x[0]] == [key(i) for i in y[0]]
                assert (x[1] is None) == (y[1] is None)
                if x[1] is None:
                    continue
                cols = lambda g: (g.tr.tolist(), g._p.tolist(), g._q.tolist(),
                                  g._trip.tolist(), g._on.tolist())
                assert cols(x[1]) == cols(y[1])
                for t in x[1].tr.tolist():
                    assert [key((0,) + e) for e in x[1].events(t)] == \
                        [key((0,) + e) for e in y[1].events(t)]
                vx, vy = x[1].virtual(a), y[1].virtual(a)
                assert all(np.array_equal(p, q) for p, q in zip(vx, vy))
                assert x[1]._trip.any() == (not left or bool(trips))
                if trips:       # the round trips' clock, as the timeline hears it
                    tr, n, d, e = x[1].trip_clock(a, 0, m)
                    assert tr.tolist() == x[1].trips().tolist()
                    assert n.tolist() == (3 * (tr + 1)).tolist()
                    for t, d1, e1 in zip(tr.tolist(), d.tolist(), e.tolist()):
                        evs = [ev for _o, ev in x[1].events(t)]
                        # heard while tracing is off: up to the first enable
                        k = next(i for i, ev in enumerate(evs) if ev.type == "enabled")
                        heard = [ev.tsc for ev in evs[1:k + 1] if ev.has_tsc]
                        assert (d1, e1) == (evs[0].tsc if evs[0].has_tsc else 0,
                                            max(heard, default=0))
