"""Runs of records that go on past transfers changing nothing (``soft``,
hwtrace.analysis.batchfeed): a jump into the middle of a function no frame
below the top is in (mempcpy's into memcpy's body), and a conditional jump
back to the start of the function it is in (a loop whose head is the
entry) -- also on a CPU's stream following its threads while switches are
left to apply, where the clock counts the traced instructions (its times
told while tracing is on change nothing: ``SwitchTimeline.deaf``).  The
activations and names are those one at a time makes (``vectorize=False``,
the reference), in both cores, in a few runs."""

from __future__ import annotations

import pytest

from hwtrace.analysis import CallStackBuilder, _runs_impl, batchfeed, runs
from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.switches import SwitchTimeline
from hwtrace.analysis.synth import FlowSynth
from hwtrace.bundle import Switch

NAMES = ["main", "mempcpy", "memcpy", "scan", "helper"]
UNKNOWN = 0x900000          # no symbol covers it: named when first met


class _Image:
    bias = 0
    label = "prog"

    def __init__(self, s: FlowSynth):
        self._starts = sorted(s.addr.values())
        self._ends = [a + s.FUNC_SIZE for a in self._starts]
        by = {a: n for n, a in s.addr.items()}
        self._names = [by[a] for a in self._starts]
        self.low, self.high = self._starts[0], self._ends[-1]


class _Symbols:
    """A lookup over images: the builder's names take the merged table."""

    def __init__(self, s: FlowSynth):
        self.images = [_Image(s)]
        self._s = s

    def lookup(self, addr):
        return self._s.lookup(addr)


def _flow(n: int):
    s = FlowSynth(NAMES, tsc_per_insn=1)
    s.start("main")
    items = s.take()
    for k in range(n):
        s.body(2)
        s.call("mempcpy")
        s.body(3)
        s._insn(5, "jump")                      # into memcpy's body
        s.ip = s.addr["memcpy"] + 0x48
        s.body(4)
        s.ret()
        s.body(1)
        s.call("scan")
        for _ in range(3 + k % 4):              # the loop's head: the entry
            s.body(3)
            s._insn(2, "cond_jump")
            s.ip = s.addr["scan"]
        s.body(3)
        s._insn(2, "cond_jump")                 # not taken
        s.ip += 2
        if k % 5 == 2:
            s.call("helper")
            s.body(2)
            s.ret()
        s.ret()
        if k == 12 or (k >= 10 and k % 7 == 3):
            # code no symbol names (named when first met), called again
            s._insn(5, "call")
            s.rets.append(s.ip + 5)
            s.ip = UNKNOWN + 0x10 * (3 if k == 12 else 1)
            s.body(2)
            s.ret()
        items += s.take()
    s.body(2)
    return items + s.take(), s


def _run(items, lookup, vectorize, stream):
    b = CallStackBuilder(stream, lookup, vectorize=vectorize)
    for it in items:
        b.feed(it)
    b.finish()
    return b.take(), b


@pytest.mark.parametrize("impl", ["python", "compiled"])
@pytest.mark.parametrize("follow", [False, True])
def test_soft_runs_match_one_at_a_time(impl, follow, monkeypatch):
    if impl == "compiled" and _runs_impl.core_for("compiled") is None:
        pytest.skip("no compiled core")
    monkeypatch.setattr(_runs_impl, "CORE", _runs_impl.core_for(impl))
    items, s = _flow(120)
    lookup = _Symbols(s).lookup
    # following the CPU's threads: the second switch (to idle) comes long
    # after the trace, so one is left to apply all along
    stream = StreamInfo(cpu=0, switches=(Switch(0, 0, -1, -1, 7, 7),
                                         Switch(0, 1 << 50, 7, 7, -1, -1)),
                        tsc_per_insn=1.0, clock_counted=True) if follow else None
    calls = []
    solve = runs.solve
    monkeypatch.setattr(runs, "solve", lambda *a, **k: calls.append(1) or solve(*a, **k))
    ref, rb = _run(items, lookup, False, stream)
    assert not calls
    # the records taken one at a time (each one's transfer settled alone)
    single = []
    at = batchfeed.BatchInput._at_record
    monkeypatch.setattr(batchfeed.BatchInput, "_at_record",
                        lambda self, a, r: single.append(r) or at(self, a, r))
    got, gb = _run(items, lookup, True, stream)
    assert got == ref
    assert gb.calls == rb.calls and gb.markers == rb.markers
    assert gb.names.names == rb.names.names
    assert f"{UNKNOWN + 0x10 * 3:#x}" in gb.names.names
    if follow:
        assert gb._follow.i == 1            # the second switch still left
    # 120 rounds of a jump into memcpy's body and a loop back to scan's
    # entry: a few runs, not one per round (until the two names first met
    # in rounds 10 and 12 are met, they are cut where one at a time would
    # name them; the calls after that cut nothing); ~4,600 instructions,
    # ~1,300 taken one at a time before
    assert len(calls) < 10 and len(single) < 400


def test_deaf_while_a_counted_clock_runs_traced():
    sw = [Switch(0, 100, -1, -1, 1, 1)]
    tl = SwitchTimeline(sw, 0, 1.0, exact=False, counted=True)
    assert not tl.deaf                      # off, no time known
    tl.time(0, 50)
    assert not tl.deaf
    tl.tracing(True)
    assert tl.deaf
    tl.time(10, 500)                        # ignored: the count knows better
    assert tl.estimate(20) == 70
    tl.tracing(False)
    assert not tl.deaf
    for kw in (dict(exact=True, counted=True), dict(exact=False, counted=False)):
        tl = SwitchTimeline(sw, 0, 1.0, **kw)
        tl.time(0, 50)
        tl.tracing(True)
        assert not tl.deaf
