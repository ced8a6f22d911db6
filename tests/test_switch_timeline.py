"""SwitchTimeline on an instruction-count clock whose times come from MTC
packets: libipt's time trails or leads the instructions (timing packets
read ahead to the next TNT/TIP), so the count places the switches."""

from collections import namedtuple

from hwtrace.analysis.switches import SwitchTimeline
from hwtrace.bundle import insn_clock_counted, insn_clock_exact

Sw = namedtuple("Sw", "cpu time prev_pid prev_tid next_pid next_tid")

# A creates B: both resume at the IP clone returns to, so any fit is 2
SWITCHES = [Sw(0, 100, -1, -1, 1, 1), Sw(0, 200, 1, 1, 1, 2), Sw(0, 240, 1, 2, 1, 1),
            Sw(0, 270, 1, 1, 1, 2), Sw(0, 300, 1, 2, -1, -1), Sw(0, 500, -1, -1, 1, 2)]


def _enable(tl, n, tsc):
    tl.time(n, tsc)
    tl.tracing(True)
    k = tl.choose(n, lambda k: 2)
    tid = tl.switches[k - 1].next_tid if k else None
    tl.advance(k)
    return tid


def test_counted_clock_places_switches_by_the_count():
    tl = SwitchTimeline(SWITCHES, 0, 1.0, exact=False, counted=True)
    assert _enable(tl, 0, 100) == 1
    tl.time(90, 268)            # a record's time read ahead: 78 ticks early
    tl.tracing(False)
    assert _enable(tl, 100, 176) == 2       # an MTC's time, trailing
    tl.time(120, 176)
    tl.tracing(False)
    assert _enable(tl, 140, 264) == 1
    tl.tracing(False)
    assert _enable(tl, 170, 264) == 2
    tl.tracing(False)
    assert _enable(tl, 200, 500) == 2       # after idle: the TSC's jump
    assert tl.i == len(SWITCHES)


def test_read_ahead_times_misplace_switches_without_the_count():
    """What the count fixes: the lead put A's switch back in before B ran."""
    tl = SwitchTimeline(SWITCHES, 0, 1.0, exact=False)
    assert _enable(tl, 0, 100) == 1
    tl.time(90, 268)
    tl.tracing(False)
    assert _enable(tl, 100, 176) != 2


def test_counted_and_exact_clocks():
    m = {"timebase": "instruction count: ..."}
    tsc, mtc, cyc, cr3 = 1 << 10, 1 << 9, 1 << 1, 1 << 7
    for ctl, counted, exact in ((tsc, True, True), (tsc | mtc, True, False),
                                (tsc | cyc, True, False), (mtc, False, False),
                                (tsc | mtc | cr3, False, False)):
        cfg = {"ctl": ctl}
        assert insn_clock_counted(m, cfg) is counted
        assert insn_clock_exact(m, cfg) is exact
    assert not insn_clock_counted({"timebase": "host TSC"}, {"ctl": tsc | mtc})


def test_round_trips_told_in_bulk_are_told_one_at_a_time():
    """What the call-stack builder tells the clock of the system calls it
    takes in a run (a disable, then an enable, each with its time) is
    what telling them one at a time does -- at any rate, times behind the
    count, ahead of it (an idle jump), equal, or none."""
    import random
    rng = random.Random(5)
    # (long runs: told in bulk with numpy; at real time stamps' size too)
    for rate, t0 in ((1.0, 90), (0.75, 90), (3.0, 90), (1.0, 191157569128564),
                     (0.37, 191157569128564)):
        for _ in range(50):
            one = SwitchTimeline(SWITCHES, 0, rate, exact=False, counted=True)
            bulk = SwitchTimeline(SWITCHES, 0, rate, exact=False, counted=True)
            for tl in (one, bulk):
                tl.time(10, t0)         # (a counted clock's stream starts off)
                tl.tracing(True)
            n, ns, tscs = 10, [], []
            for _k in range(rng.choice([rng.randrange(1, 30), rng.randrange(33, 400)])):
                n += rng.randrange(0, 40)
                est = one.estimate(n) if not ns else None
                base = int(est) if est is not None else t0 + n
                tsc = rng.choice([0, base + rng.randrange(-30, 60), t0 + n * 3,
                                  t0 + int(n * rate), base, base + 1])
                ns.append(n)
                tscs.append(tsc)
            for k, t in zip(ns, tscs):
                one.time(k, t - 7 if t else None)
                one.tracing(False)
                one.time(k, t or None)
                one.tracing(True)
            bulk.round_trips(ns, tscs)
            assert one.clock_state() == bulk.clock_state()
    off = SwitchTimeline(SWITCHES, 0, 1.0, exact=False, counted=True)
    off.time(0, 90)
    off.tracing(False)
    import pytest
    with pytest.raises(ValueError):
        off.round_trips([5], [100])
