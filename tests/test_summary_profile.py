"""Per-function totals behind ``hwtrace summary`` (and its rendering)."""

from __future__ import annotations

from hwtrace.analysis import Activation, Enter, Flag, Marker, StreamInfo, reconstruct
from hwtrace.analysis.profile import Profile
from hwtrace.analysis.synth import fib_calls, fib_flow
from hwtrace.cli.summary import render


def feed(profile, recs, info=StreamInfo(1, 1), unit="insns"):
    profile.begin_stream(info, unit)
    for r in recs:
        profile.add(r)


def test_recursion_counted_once_inclusive():
    s, items = fib_flow(6)
    items = list(items)
    p = Profile()
    feed(p, reconstruct(items, lookup=s.lookup))
    fib = p.funcs[("fib", s.addr["fib"])]
    assert fib.calls == fib_calls(6)
    top = [a for a in reconstruct(items, lookup=s.lookup)
           if type(a) is Activation and a.name == "fib" and a.depth == 1][0]
    assert fib.incl_insns == top.insns           # not the sum over the recursion
    assert fib.excl_insns == top.insns           # fib only calls fib
    assert p.insns == s.insns


def test_same_name_different_functions_stay_apart():
    recs = [Enter(0x1000, "_start", 0, 0, 0, Flag.BEGIN_UNKNOWN),
            Activation(0x1000, "_start", 0, 0, 5, 0, 5, 0, 0, Flag.BEGIN_UNKNOWN),
            Enter(0x2000, "_start", 0, 5, 5, Flag.TAIL_CALL),
            Activation(0x2000, "_start", 0, 5, 9, 5, 9, 0, 0, Flag.TAIL_CALL),
            Marker("overflow", 9, 9, 0x40, "trace overflow: data lost")]
    p = Profile()
    feed(p, recs)
    assert set(p.funcs) == {("_start", 0x1000), ("_start", 0x2000)}
    assert p.funcs[("_start", 0x1000)].calls == 0     # begun before the trace
    assert p.funcs[("_start", 0x2000)].calls == 1
    text = render(p, {"streams": 1, "insns": 9, "activations": 2}, "t", 5)
    lines = text.splitlines()
    assert lines[2] == "lost data / errors: 1 overflow"
    assert lines[3] == "  at insn 9: offset 0x40: overflow: trace overflow: data lost"
    names = [l.split()[0] for l in lines[6:]]
    assert names == ["_start@0x1000", "_start@0x2000"]
